// @brief GPU tests of the dropout kernels against the CPU reference (tests/reference/dropout_ref.h):
// outputs (poisoned first) equal to the reference over odd sizes, every dtype (bf16, fp16, fp32), several p, the
// vector and the scalar (misaligned) path, in place; the mask backward regenerates equals the
// forward's and the reference's bit for bit; the kept fraction within statistical bounds; the
// fused bias + residual form, odd and vector-friendly widths, and its mask = plain dropout's.
#include <gtest/gtest.h>

#include <cmath>
#include <type_traits>

#include "kernels/dropout.cuh"
#include "tests/reference/dropout_ref.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

using kernels::DropoutParams;
using test::DeviceArray;

// Host floats <-> device arrays of T, `off` elements into the array (off > 0: misaligned views).
template <typename T>
struct Dev {
  DeviceArray<T> a;
  std::size_t off;
  Dev(std::size_t n, std::size_t off_) : a(n + off_), off(off_) {}
  T* p() const { return a.get() + off; }
  void put(const std::vector<float>& h) {
    std::vector<T> t(a.size());
    const std::vector<T> cur = a.download();
    for (std::size_t i = 0; i < a.size(); ++i) t[i] = cur[i];
    for (std::size_t i = 0; i < h.size(); ++i) {
      if constexpr (std::is_same_v<T, float>) t[off + i] = h[i];
      else t[off + i] = cutrain::from_float<T>(h[i]);
    }
    a.upload(t);
  }
  std::vector<float> get(std::size_t n) const {
    const std::vector<T> t = a.download();
    std::vector<float> h(n);
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, float>) h[i] = t[off + i];
      else h[i] = cutrain::to_float(t[off + i]);
    }
    return h;
  }
};

// Inputs never exactly 0 (after rounding to T), so a 0 output means dropped; bf16 / fp16 inputs are
// values of their type.
template <typename T>
std::vector<float> inputs(std::size_t n, std::mt19937_64& rng) {
  auto x = test::random_normal(n, rng);
  if constexpr (!std::is_same_v<T, float>) x = test::round_to<T>(x);
  for (float& v : x)
    if (v == 0.f) v = 1.f;
  return x;
}

// The kernel's output in T against the reference's fp32 result rounded to T: equal elements
// (the same fp32 operations; the relative error is checked too, over all of them).
template <typename T>
void expect_equal_outputs(const std::vector<float>& got, std::vector<float> want, const char* what) {
  if constexpr (!std::is_same_v<T, float>) want = test::round_to<T>(want);
  ASSERT_EQ(test::count_nan(got), 0u) << what << ": elements not written";
  EXPECT_LE(test::rel_error(got, want), 1e-7) << what;
  std::size_t diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
  EXPECT_EQ(diff, 0u) << what << ": elements differ from the reference";
}

template <typename T>
void check_forward_backward(std::size_t n, float p, std::size_t off) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<T>()) << " n=" << n << " p=" << p << " off=" << off);
  auto rng = test::fresh_rng();
  DropoutParams d;
  d.key = {rng(), static_cast<std::uint32_t>(rng()), static_cast<std::uint32_t>(rng() % 48)};
  d.p = p;
  const auto x = inputs<T>(n, rng);
  Dev<T> dx(n, off), dout(n, off), dgrad(n, off);  // poisoned (NaN) by DeviceArray
  dx.put(x);
  kernels::dropout_forward(nullptr, d, dx.p(), dout.p(), n, dtype_of<T>());
  const auto out = dout.get(n);
  expect_equal_outputs<T>(out, ref::dropout(d, x), "forward");
  // Backward with dy = x: the same values (the same mask, regenerated).
  kernels::dropout_backward(nullptr, d, dx.p(), dgrad.p(), n, dtype_of<T>());
  const auto grad = dgrad.get(n);
  const auto keep = ref::dropout_mask(d, n);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i] != 0.f, keep[i] != 0) << "forward's mask at " << i;
    ASSERT_EQ(grad[i] != 0.f, keep[i] != 0) << "backward's mask at " << i;
    ASSERT_EQ(grad[i], out[i]) << "backward at " << i;
  }
  // In place.
  kernels::dropout_forward(nullptr, d, dx.p(), dx.p(), n, dtype_of<T>());
  EXPECT_EQ(dx.get(n), out) << "in place";
}

TEST(DropoutGpu, MatchesReferenceOverOddSizes) {
  CUTRAIN_REQUIRE_GPU();
  for (std::size_t n : {1, 3, 4, 5, 255, 4099, 1000003})
    for (float p : {0.f, 0.1f, 0.5f}) {
      check_forward_backward<bf16>(n, p, 0);
      check_forward_backward<f16>(n, p, 0);
      check_forward_backward<float>(n, p, 0);
      if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(DropoutGpu, MisalignedViewsTakeTheScalarPath) {
  CUTRAIN_REQUIRE_GPU();
  for (std::size_t n : {7, 100003}) {
    check_forward_backward<bf16>(n, 0.2f, 1);
    check_forward_backward<f16>(n, 0.2f, 1);
    check_forward_backward<float>(n, 0.2f, 3);
  }
}

TEST(DropoutGpu, KeptFractionWithinStatisticalBounds) {
  CUTRAIN_REQUIRE_GPU();
  const std::size_t n = std::size_t(1) << 24;
  DeviceArray<float> ones(std::vector<float>(n, 1.f)), out(n);
  for (float p : {0.1f, 0.5f}) {
    DropoutParams d;
    d.key = {99, 4, 1};
    d.p = p;
    kernels::dropout_forward(nullptr, d, ones.get(), out.get(), n, DType::F32);
    const std::vector<float> h = out.download();
    std::size_t kept = 0;
    for (float v : h) kept += v != 0.f;
    const double sigma = std::sqrt(p * (1.0 - p) / n);
    EXPECT_NEAR(double(kept) / n, 1.0 - p, 6 * sigma) << "p = " << p;
  }
}

template <typename T>
void check_bias_residual(std::size_t rows, std::size_t cols, float p) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<T>()) << " " << rows << "x" << cols << " p=" << p);
  auto rng = test::fresh_rng();
  const std::size_t n = rows * cols;
  DropoutParams d;
  d.key = {rng(), 3, 17};
  d.p = p;
  const auto x = inputs<T>(n, rng), b = inputs<T>(cols, rng), r = inputs<T>(n, rng);
  Dev<T> dx(n, 0), db(cols, 0), dr(n, 0), dout(n, 0), dplain(n, 0);
  dx.put(x), db.put(b), dr.put(r);
  kernels::bias_dropout_residual_forward(nullptr, d, dx.p(), db.p(), dr.p(), dout.p(), rows, cols, dtype_of<T>());
  const auto out = dout.get(n);
  expect_equal_outputs<T>(out, ref::bias_dropout_residual(d, x, b, r, rows, cols), "bias_dropout_residual");
  // Its mask is plain dropout's of the flat tensor: where that drops, out is the residual.
  if (p == 0.f) return;  // nothing dropped (plain dropout is then a copy)
  kernels::dropout_forward(nullptr, d, dx.p(), dplain.p(), n, dtype_of<T>());
  const auto plain = dplain.get(n);
  for (std::size_t i = 0; i < n; ++i)
    if (plain[i] == 0.f) ASSERT_EQ(out[i], r[i]) << "dropped element " << i << " is not the residual";
}

TEST(DropoutGpu, BiasDropoutResidualMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  for (auto [rows, cols] : {std::pair<std::size_t, std::size_t>{37, 1024}, {37, 1027}, {1, 3}, {512, 768}}) {
    // p = 0 takes the instance that draws no Philox bits: the plain bias + residual add.
    for (float p : {0.f, 0.1f}) {
      check_bias_residual<bf16>(rows, cols, p);
      check_bias_residual<f16>(rows, cols, p);
      check_bias_residual<float>(rows, cols, p);
    }
  }
}

TEST(DropoutGpu, RefusesBadInput) {
  CUTRAIN_REQUIRE_GPU();
  DeviceArray<float> a(16);
  DropoutParams d;
  d.p = 1.f;
  EXPECT_THROW(kernels::dropout_forward(nullptr, d, a.get(), a.get(), 16, DType::F32), Error);
  d.p = 0.1f;
  EXPECT_THROW(kernels::dropout_forward(nullptr, d, a.get(), a.get(), 16, DType::I32), Error);
  EXPECT_THROW(kernels::bias_dropout_residual_forward(nullptr, d, a.get(), nullptr, a.get(), a.get(), 4, 4, DType::F32),
               Error);
}

}  // namespace
}  // namespace cutrain
