// The compensated bf16 master (Kahan summation) in the CPU reference of adam_step: after 1000
// random updates it stays within one bf16 ulp of an fp32-master run on the same gradients, while
// the plain bf16 master does not; and the residual it keeps is what the rounding dropped.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/reference/adamw_ref.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

using kernels::AdamParams;
using kernels::OptimizerLayout;

double bf16_ulp(float w) { return w == 0.f ? 0.0 : std::ldexp(1.0, std::ilogb(w) - 7); }

struct OptState {
  std::vector<float> params, master, m, v, comp;
};

// Weights of magnitude in [0.5, 2) (a bf16 ulp of 2^-8 .. 2^-7), per-element drifting gradients
// (a fixed mean plus fresh noise each step): Adam's steps of at most lr = 3e-4 stay below half an
// ulp, so a plain bf16 master loses them, while the fp32 master drifts by tens of ulps. The drift
// (at most 0.3) keeps every weight away from zero: the compensation's error is about 2^-10 of an
// ulp of the weight's past magnitude, so a weight that shrinks by orders of magnitude keeps the
// absolute error of its larger past (fp32 keeps 2^-24 of it).
struct Drift {
  std::size_t n;
  std::vector<float> w0, mean;
  explicit Drift(std::size_t n_, std::mt19937_64& rng) : n(n_) {
    w0 = test::random_uniform(n, rng, 0.5f, 2.f);
    const auto sign = test::random_uniform(n, rng, -1.f, 1.f);
    for (std::size_t i = 0; i < n; ++i) w0[i] = round_bf16(sign[i] < 0 ? -w0[i] : w0[i]);
    mean = test::random_normal(n, rng, 0.f, 1e-2f);
  }
  OptState start() const { return {w0, w0, std::vector<float>(n, 0.f), std::vector<float>(n, 0.f), std::vector<float>(n, 0.f)}; }
};

TEST(CompensationRef, WithinOneUlpOfAnFp32MasterAfter1000UpdatesWhilePlainBf16IsNot) {
  auto rng = test::fresh_rng();
  const std::size_t n = 4099;
  const int steps = 1000;
  const Drift d(n, rng);
  for (OptimizerLayout layout : {OptimizerLayout::Bf16MasterWG, OptimizerLayout::Bf16Full}) {
    SCOPED_TRACE(layout == OptimizerLayout::Bf16Full ? "Bf16Full" : "Bf16MasterWG");
    auto grng = rng;  // the same gradients for the three runs of this layout
    OptState fp32 = d.start(), comp = d.start(), plain = d.start();
    AdamParams p;
    p.lr = 3e-4f;
    p.weight_decay = 0.01f;
    p.beta2 = 0.99f;
    for (int step = 1; step <= steps; ++step) {
      auto g = test::random_normal(n, grng, 0.f, 1e-2f);
      for (std::size_t i = 0; i < n; ++i) g[i] += d.mean[i];
      p.step = step;
      // The reference: an fp32 master with the layout's moments (bf16 for Bf16Full, through the
      // same rounding), so only the master's precision differs.
      ref::adam_step(OptimizerLayout::Baseline, p, 1.0, fp32.params, g, fp32.master, fp32.m, fp32.v);
      if (layout == OptimizerLayout::Bf16Full) {
        fp32.m = test::round_bf16(fp32.m);
        fp32.v = test::round_bf16(fp32.v);
      }
      ref::adam_step(layout, p, 1.0, comp.params, g, comp.master, comp.m, comp.v, &comp.comp);
      ref::adam_step(layout, p, 1.0, plain.params, g, plain.master, plain.m, plain.v);
    }
    std::size_t comp_off = 0, plain_off = 0;
    double comp_worst = 0, plain_moved = 0, fp32_moved = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double ulp = bf16_ulp(fp32.master[i]);
      const double dc = std::abs(double(comp.params[i]) - fp32.master[i]) / ulp;
      const double dp = std::abs(double(plain.params[i]) - fp32.master[i]) / ulp;
      comp_worst = std::max(comp_worst, dc);
      comp_off += dc > 1.0;
      plain_off += dp > 1.0;
      plain_moved += std::abs(double(plain.params[i]) - d.w0[i]) / n;
      fp32_moved += std::abs(double(fp32.master[i]) - d.w0[i]) / n;
      // The residual: below an ulp of the weight, and the pair w + c tracks the fp32 master far
      // closer than an ulp.
      ASSERT_LE(std::abs(double(comp.comp[i])), bf16_ulp(comp.params[i]) / 2) << i;
      ASSERT_LE(std::abs(double(comp.params[i]) + comp.comp[i] - fp32.master[i]), ulp / 8) << i;
    }
    EXPECT_EQ(comp_off, 0u) << "worst " << comp_worst << " ulps";
    EXPECT_GT(plain_off, n / 2) << "the plain bf16 master must miss (else this test cannot fail)";
    EXPECT_GT(fp32_moved, 10 * bf16_ulp(1.f)) << "the fp32 master should drift by many ulps";
    EXPECT_LT(plain_moved, fp32_moved / 4) << "round-to-nearest should stall most of the plain master's drift";
  }
}

TEST(CompensationRef, OneStepKeepsWhatTheRoundingDropped) {
  // w = 1, steps of -2^-10 (below half the ulp 2^-8 under 1): the first leaves w at 1 and keeps
  // -2^-10 in c; w + c is exact after every step, and w moves once the residual reaches it.
  AdamParams p;
  p.lr = std::ldexp(1.f, -10);
  p.beta1 = 0.f;
  p.beta2 = 0.f;
  p.eps = 0.f;
  std::vector<float> w = {1.f}, c = {0.f}, master = {0.f}, m = {0.f}, v = {0.f}, g = {1.f};
  for (int s = 1; s <= 8; ++s) {
    p.step = s;
    ref::adam_step(OptimizerLayout::Bf16MasterWG, p, 1.0, w, g, master, m, v, &c);  // m_hat / sqrt(v_hat) = 1
    EXPECT_DOUBLE_EQ(double(w[0]) + c[0], 1.0 - s * std::ldexp(1.0, -10)) << "step " << s;
    if (s == 1) {
      EXPECT_EQ(w[0], 1.f);
      EXPECT_EQ(c[0], -std::ldexp(1.f, -10));
    }
  }
  EXPECT_LT(w[0], 1.f);
}

TEST(CompensationRef, BaselineHasNoCompensation) {
  AdamParams p;
  std::vector<float> w = {1.f}, c = {0.f}, master = {1.f}, m = {0.f}, v = {0.f}, g = {1.f};
  EXPECT_THROW(ref::adam_step(OptimizerLayout::Baseline, p, 1.0, w, g, master, m, v, &c), Error);
}

}  // namespace
}  // namespace cutrain
