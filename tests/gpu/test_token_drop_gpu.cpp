// @brief GPU tests of kernels/token_drop (random-LTD's gather, scatter and merge) against
// tests/reference/token_drop_ref.h on odd shapes, the vector and the scalar paths (hidden % 8,
// misaligned bases), the scatter and the merge with and without their second operand. Fresh
// random inputs and indices (model/token_drop_plan.h's draw), outputs poisoned with NaN first: a
// gathered or merged row never written stays NaN, and the scatter must leave every dropped row's
// poison in place.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/token_drop.cuh"
#include "model/token_drop_plan.h"
#include "tests/reference/token_drop_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using test::DeviceArray;

namespace {

struct Shape {
  int B, S, K, h;
  int offset;  // elements added to every base pointer (1: the scalar path on any hidden)
};

std::string name(const Shape& s) {
  return "B" + std::to_string(s.B) + "_S" + std::to_string(s.S) + "_K" + std::to_string(s.K) + "_h" +
         std::to_string(s.h) + (s.offset ? "_misaligned" : "");
}

class TokenDropGpu : public ::testing::TestWithParam<Shape> {};

}  // namespace

namespace {
// One case in E (bf16 or fp16); `add_tol`: the scatter's sum is one rounding to E of the fp32 sum.
template <typename E>
void check_case(const Shape& sh, double add_tol) {
  auto rng = test::fresh_rng();
  const std::size_t full = std::size_t(sh.B) * sh.S * sh.h, kept_n = std::size_t(sh.B) * sh.K * sh.h;
  const std::vector<float> x = test::round_to<E>(test::random_normal(full, rng));
  const std::vector<float> y = test::round_to<E>(test::random_normal(kept_n, rng));
  const std::vector<float> z = test::round_to<E>(test::random_normal(kept_n, rng));
  model::TokenDropPlan plan;
  model::draw_token_drop(plan, rng(), 0, 0, 0, sh.B, sh.S, sh.K, {0});
  if (!plan.active()) plan.indices = [&] {  // K == S: every position, in order
    std::vector<std::int32_t> all;
    for (int b = 0; b < sh.B; ++b)
      for (int s = 0; s < sh.S; ++s) all.push_back(s);
    return all;
  }();
  const std::vector<std::int32_t>& idx = plan.indices;
  const int o = sh.offset;
  auto upload = [&](const std::vector<float>& v) {
    DeviceArray<E> d(v.size() + o);
    std::vector<E> h = test::to_storage<E>(v);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(d.get() + o, h.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice));
    return d;
  };
  auto download = [&](const DeviceArray<E>& d) {
    std::vector<float> all = test::download_float(d);
    return std::vector<float>(all.begin() + o, all.end());
  };
  DeviceArray<E> dx = upload(x), dy = upload(y), dz = upload(z), dkept(kept_n + o), dout(full + o);
  DeviceArray<std::int32_t> didx(idx);
  cudaStream_t s = nullptr;

  kernels::token_gather(s, dx.get() + o, didx.get(), dkept.get() + o, sh.B, sh.S, sh.K, sh.h);
  const std::vector<double> want_g = ref::token_gather({x.begin(), x.end()}, idx, sh.B, sh.S, sh.K, sh.h);
  const std::vector<float> got_g = download(dkept);
  EXPECT_EQ(test::count_nan(got_g), 0u) << "a kept row left unwritten";
  EXPECT_EQ(test::rel_error(got_g, want_g), 0.0) << "the gather is a copy";

  for (bool add : {false, true}) {
    dout.poison();
    kernels::token_scatter(s, dy.get() + o, add ? dz.get() + o : nullptr, didx.get(), dout.get() + o, sh.B, sh.S,
                           sh.K, sh.h);
    const std::vector<float> got = download(dout);
    std::vector<double> want(full, std::nan(""));
    const std::vector<double> zd(z.begin(), z.end());
    ref::token_scatter({y.begin(), y.end()}, add ? &zd : nullptr, idx, want, sh.B, sh.S, sh.K, sh.h);
    std::vector<float> got_kept;
    std::vector<double> want_kept;
    std::size_t untouched = 0, dropped = 0;
    for (std::size_t i = 0; i < full; ++i) {
      if (std::isnan(want[i])) {
        ++dropped;
        untouched += std::isnan(got[i]);
      } else {
        got_kept.push_back(got[i]);
        want_kept.push_back(want[i]);
      }
    }
    EXPECT_EQ(untouched, dropped) << "the scatter wrote a dropped row (add " << add << ")";
    EXPECT_EQ(got_kept.size(), kept_n);
    // Without `add` a copy; with it one bf16 rounding of the fp32 sum.
    EXPECT_LE(test::rel_error(got_kept, want_kept), add ? add_tol : 0.0) << "add " << add;

    // The merge: every row written, the dropped ones a copy of x's, the kept ones the scatter's.
    dout.poison();
    kernels::token_merge(s, dx.get() + o, dy.get() + o, add ? dz.get() + o : nullptr, didx.get(), dout.get() + o,
                         sh.B, sh.S, sh.K, sh.h);
    const std::vector<float> merged = download(dout);
    EXPECT_EQ(test::count_nan(merged), 0u) << "a merged row left unwritten (add " << add << ")";
    const std::vector<double> want_m =
        ref::token_merge({x.begin(), x.end()}, {y.begin(), y.end()}, add ? &zd : nullptr, idx, sh.B, sh.S, sh.K, sh.h);
    std::vector<float> got_pass, got_mk;
    std::vector<double> want_pass, want_mk;
    for (std::size_t i = 0; i < full; ++i) {
      (std::isnan(want[i]) ? got_pass : got_mk).push_back(merged[i]);
      (std::isnan(want[i]) ? want_pass : want_mk).push_back(want_m[i]);
    }
    EXPECT_EQ(got_pass.size(), dropped);
    if (!got_pass.empty()) {
      EXPECT_EQ(test::rel_error(got_pass, want_pass), 0.0) << "the bypass is a copy";
    }
    EXPECT_LE(test::rel_error(got_mk, want_mk), add ? add_tol : 0.0) << "merge, add " << add;
  }
  // The merge refuses to write over its input.
  EXPECT_THROW(kernels::token_merge(s, dx.get() + o, dy.get() + o, nullptr, didx.get(), dx.get() + o, sh.B, sh.S, sh.K,
                                    sh.h),
               Error);
}

}  // namespace

TEST_P(TokenDropGpu, GatherAndScatterMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  check_case<bf16>(GetParam(), 4e-3);
}

// The fp16 instances (fp16 training): copies bit-exact, the sum within 5e-4 (one fp16 rounding,
// 11 significant bits, against bf16's 4e-3 for 8).
TEST_P(TokenDropGpu, Fp16GatherAndScatterMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  check_case<f16>(GetParam(), 5e-4);
}

INSTANTIATE_TEST_SUITE_P(OddShapes, TokenDropGpu,
                         ::testing::Values(Shape{1, 1, 1, 1, 0}, Shape{3, 17, 5, 7, 0}, Shape{2, 33, 32, 64, 0},
                                           Shape{2, 33, 32, 64, 1}, Shape{5, 129, 77, 200, 0},
                                           Shape{4, 512, 256, 1024, 0}, Shape{2, 9, 9, 24, 0},
                                           Shape{1, 1000, 3, 1032, 1}),
                         [](const auto& i) { return name(i.param); });
