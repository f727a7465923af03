// kernels/common/fast_math.cuh on the GPU against fp64's exp2: fast_ex2 (the MUFU) and poly_ex2
// (the FMA-pipe polynomial that the d64 attention forward uses for a quarter of its softmax) over
// the softmax's argument range (x <= 0): every value, the extremes and -inf.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/gpu/fast_math_kernels.h"
#include "tests/support/test_support.h"

namespace cutrain::test {
namespace {

struct Ex2Results {
  std::vector<float> fast, poly;
};
Ex2Results run(const std::vector<float>& x) {
  DeviceArray<float> dx(x), dy(x.size()), dz(x.size());
  run_ex2(dx.get(), dy.get(), dz.get(), x.size());
  return {dy.download(), dz.download()};
}

TEST(FastMathGpu, Ex2OverTheSoftmaxRange) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = fresh_rng();
  // Random arguments in [-124, 0] (where 2^x is a normal float), a dense sweep of [-2, 0] (the
  // polynomial's rounding boundaries at half-integers) and the exact integers.
  std::vector<float> x = random_uniform(1 << 20, rng, -124.f, 0.f);
  for (int i = 0; i <= 1 << 16; ++i) x.push_back(-2.f * static_cast<float>(i) / (1 << 16));
  for (int j = 0; j <= 124; ++j) x.push_back(-static_cast<float>(j));
  const Ex2Results r = run(x);
  double worst_fast = 0, worst_poly = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp2(static_cast<double>(x[i]));
    worst_fast = std::max(worst_fast, std::fabs(r.fast[i] / want - 1));
    const double e = std::fabs(r.poly[i] / want - 1);
    if (!(e <= worst_poly)) worst_poly = e, at = i;  // a NaN lands here too
  }
  EXPECT_LE(worst_fast, 1e-6);
  // The polynomial's fitted bound is 7.5e-5 (fp32 evaluation included); bf16's step is 3.9e-3.
  EXPECT_LE(worst_poly, 8e-5) << "at x = " << x[at] << ": " << r.poly[at];
}

TEST(FastMathGpu, Ex2BelowTheNormalRange) {
  CUTRAIN_REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {-125.f, -126.f, -127.5f, -150.f, -1e30f, -inf};
  const Ex2Results r = run(x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] >= -126.f) EXPECT_EQ(r.fast[i], std::exp2(x[i])) << "fast_ex2(" << x[i] << ")";
    else EXPECT_EQ(r.fast[i], 0.f) << "fast_ex2(" << x[i] << ")";  // subnormal results flush (ftz)
    // poly_ex2 clamps at -125: finite, non-negative, below 2.5e-38 (a row sum of >= 1 cannot see it).
    EXPECT_TRUE(std::isfinite(r.poly[i]) && r.poly[i] >= 0.f && r.poly[i] < 2.5e-38f)
        << "poly_ex2(" << x[i] << ") = " << r.poly[i];
  }
}

}  // namespace
}  // namespace cutrain::test
