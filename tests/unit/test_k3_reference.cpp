// CPU checks of the k3 references (cross-entropy, Adam/AdamW, grad norm) against hand-computed
// values, and of the stochastic-rounding helper's statistics and reproducibility.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/common/stochastic_round.cuh"
#include "tests/reference/adamw_ref.h"
#include "tests/reference/cross_entropy_ref.h"
#include "tests/reference/reduce_ref.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

using kernels::AdamParams;
using kernels::OptimizerLayout;

TEST(CrossEntropyRef, HandComputedRow) {
  // Row 0: logits (0, ln 2, ln 3) -> softmax (1/6, 2/6, 3/6), label 2: loss = ln 6 - ln 3 = ln 2.
  // Row 1 ignored, row 2 has a bad label; ld = 4 (one padding column).
  const float l2 = std::log(2.f), l3 = std::log(3.f);
  std::vector<float> x = {0, l2, l3, 99, 1, 2, 3, 99, 5, 6, 7, 99};
  auto r = ref::cross_entropy(x, {2, -100, 3}, 3, 3, 4, -100, 1.0);
  EXPECT_EQ(r.n_valid, 1);
  EXPECT_EQ(r.status, 3);
  EXPECT_NEAR(r.loss_mean, std::log(2.0), 1e-6);
  EXPECT_NEAR(r.dlogits[0], 1.0 / 6, 1e-6);
  EXPECT_NEAR(r.dlogits[1], 2.0 / 6, 1e-6);
  EXPECT_NEAR(r.dlogits[2], 3.0 / 6 - 1, 1e-6);
  for (int j = 3; j < 12; ++j) EXPECT_EQ(r.dlogits[j], 0.f) << j;
  EXPECT_EQ(r.row_loss[1], 0.0);
  EXPECT_EQ(r.row_loss[2], 0.0);
}

TEST(CrossEntropyRef, UniformLogitsGiveLogVocabAndZeroSumGradient) {
  auto rng = test::fresh_rng();
  const int rows = 5, vocab = 37;
  std::vector<float> x(rows * vocab, 0.25f);
  auto labels = test::random_ints(rows, rng, 0, vocab - 1);
  auto r = ref::cross_entropy(x, labels, rows, vocab, vocab, -100, 2.0);
  EXPECT_NEAR(r.loss_mean, std::log(37.0), 1e-9);
  for (int i = 0; i < rows; ++i) {
    double s = 0;
    for (int j = 0; j < vocab; ++j) s += r.dlogits[i * vocab + j];
    EXPECT_NEAR(s, 0.0, 1e-6);
    EXPECT_NEAR(r.dlogits[i * vocab + labels[i]], (1.0 / 37 - 1) * 2.0 / rows, 1e-6);
  }
}

TEST(AdamRef, FirstStepHandComputed) {
  // Step 1: m_hat = g, v_hat = g^2, so the Adam direction is g / (|g| + eps).
  AdamParams p;
  p.lr = 1e-2f;
  p.eps = 1e-8f;
  p.weight_decay = 0.1f;
  p.step = 1;
  for (bool decoupled : {true, false}) {
    p.decoupled = decoupled;
    std::vector<float> params = {0.5f, -1.f}, master = {0.5f, -1.f}, m = {0, 0}, v = {0, 0};
    std::vector<float> g = {0.25f, -2.f};
    ref::adam_step(OptimizerLayout::Baseline, p, 1.0, params, g, master, m, v);
    for (int i = 0; i < 2; ++i) {
      const double w0 = i == 0 ? 0.5 : -1.0;
      double gi = g[i];
      if (!decoupled) gi += 0.1 * w0;
      double upd = gi / (std::fabs(gi) + 1e-8);
      if (decoupled) upd += 0.1 * w0;
      EXPECT_NEAR(master[i], w0 - 1e-2 * upd, 1e-7) << "decoupled=" << decoupled << " i=" << i;
      EXPECT_NEAR(m[i], (1 - static_cast<double>(p.beta1)) * gi, 1e-8);
      EXPECT_NEAR(v[i], (1 - static_cast<double>(p.beta2)) * gi * gi, 1e-10);
      EXPECT_EQ(params[i], round_bf16(master[i]));
    }
  }
}

TEST(AdamRef, SecondStepHandComputed) {
  AdamParams p;
  p.lr = 1e-3f;
  p.beta1 = 0.9f;
  p.beta2 = 0.99f;
  p.step = 2;
  p.weight_decay = 0.f;
  std::vector<float> params = {1.f}, master = {1.f}, m = {0.1f}, v = {0.01f}, g = {2.f};
  ref::adam_step(OptimizerLayout::Bf16MasterWG, p, 0.5, params, g, master, m, v);  // g * 0.5 = 1
  const double b1 = 0.9f, b2 = 0.99f;
  const double mm = b1 * 0.1f + (1 - b1) * 1.0, vv = b2 * 0.01f + (1 - b2) * 1.0;
  const double w = 1.0 - 1e-3f * (mm / (1 - b1 * b1)) / (std::sqrt(vv / (1 - b2 * b2)) + 1e-8f);
  EXPECT_NEAR(m[0], mm, 1e-7);
  EXPECT_NEAR(v[0], vv, 1e-7);
  EXPECT_EQ(params[0], round_bf16(static_cast<float>(w)));
}

TEST(GradNormRef, PythagoreanAndClip) {
  EXPECT_DOUBLE_EQ(ref::grad_norm({3.f, 4.f, 12.f}), 13.0);
  EXPECT_NEAR(ref::clip_scale(13.0, 6.5), 6.5 / (13.0 + 1e-6), 1e-15);
  EXPECT_EQ(ref::clip_scale(13.0, 100.0), 1.0);
  EXPECT_EQ(ref::clip_scale(13.0, 0.0), 1.0);
  EXPECT_EQ(ref::clip_scale(NAN, 1.0), 1.0);
}

TEST(StochasticRound, MeanMatchesValueAndBitsAreReproducible) {
  auto rng = test::fresh_rng();
  auto vals = test::random_normal(16, rng, 0.f, 3.f);
  const int draws = 200000;
  for (float f : vals) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    const float lo = bf16_bits_to_f32(static_cast<std::uint16_t>(u >> 16));
    const float hi = bf16_bits_to_f32(static_cast<std::uint16_t>((u >> 16) + 1));
    const double q = (std::fabs(f) - std::fabs(lo)) / (std::fabs(hi) - std::fabs(lo));
    for (int half : {0, 16}) {  // both 16-bit halves of a hash are used (parameter and moment)
      double sum = 0;
      for (int i = 0; i < draws; ++i) {
        const std::uint32_t r16 = (kernels::sr_random(7, 3, 0, i) >> half) & 0xffffu;
        const float r = bf16_bits_to_f32(kernels::sr_round_bits(u, r16));
        ASSERT_TRUE(r == lo || r == hi) << f;
        sum += r;
      }
      // The mean of the draws is the fp32 value within 5 standard deviations of the sample mean.
      const double sd = std::fabs(hi - lo) * std::sqrt(q * (1 - q) / draws);
      EXPECT_NEAR(sum / draws, f, 5 * sd + 1e-12 * std::fabs(f)) << "value " << f << " half " << half;
    }
  }
  int same = 0, diff_seed = 0, diff_step = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    same += kernels::sr_random(11, 5, 1, i) == kernels::sr_random(11, 5, 1, i);
    diff_seed += kernels::sr_random(11, 5, 1, i) != kernels::sr_random(12, 5, 1, i);
    diff_step += kernels::sr_random(11, 5, 1, i) != kernels::sr_random(11, 6, 1, i);
  }
  EXPECT_EQ(same, 1000);
  EXPECT_GT(diff_seed, 990);
  EXPECT_GT(diff_step, 990);
  // Index bits above 2^32 matter.
  EXPECT_NE(kernels::sr_random(1, 1, 0, 5), kernels::sr_random(1, 1, 0, (std::uint64_t(1) << 32) + 5));
}

// The optimizer's assignment (sr_draws): every one of its three 16-bit draws (parameter from the
// two halves of a pair hash, m and v from the halves of a per-element hash) rounds without bias,
// the draws are reproducible, change with seed and step, and tell the 2^32 windows apart.
TEST(StochasticRound, OptimizerDrawsUnbiasedAndReproducible) {
  auto rng = test::fresh_rng();
  auto vals = test::random_normal(8, rng, 0.f, 3.f);
  const int draws = 200000;
  const std::uint64_t base = rng() & 0xffffffffull;  // a random offset, also across a window edge
  for (float f : vals) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    const float lo = bf16_bits_to_f32(static_cast<std::uint16_t>(u >> 16));
    const float hi = bf16_bits_to_f32(static_cast<std::uint16_t>((u >> 16) + 1));
    const double q = (std::fabs(f) - std::fabs(lo)) / (std::fabs(hi) - std::fabs(lo));
    for (int which = 0; which < 4; ++which) {  // param at even / odd index, m, v
      double sum = 0;
      int count = 0;
      for (int i = 0; i < 2 * draws; ++i) {
        const std::uint64_t idx = base + static_cast<std::uint64_t>(i);
        if (which < 2 && static_cast<int>(idx & 1) != which) continue;
        if (which >= 2 && (i & 1)) continue;
        const kernels::SrDraws d = kernels::sr_draws(9, 4, idx);
        const std::uint32_t r16 = which < 2 ? d.param : which == 2 ? d.m : d.v;
        ASSERT_LE(r16, 0xffffu);
        const float r = bf16_bits_to_f32(kernels::sr_round_bits(u, r16));
        ASSERT_TRUE(r == lo || r == hi) << f;
        sum += r;
        ++count;
      }
      const double sd = std::fabs(hi - lo) * std::sqrt(q * (1 - q) / count);
      EXPECT_NEAR(sum / count, f, 5 * sd + 1e-12 * std::fabs(f)) << "value " << f << " draw " << which;
    }
  }
  int diff_seed = 0, diff_step = 0, diff_mv = 0, diff_pair = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    const auto a = kernels::sr_draws(11, 5, i), b = kernels::sr_draws(11, 5, i);
    EXPECT_TRUE(a.param == b.param && a.m == b.m && a.v == b.v);
    diff_seed += a.m != kernels::sr_draws(12, 5, i).m;
    diff_step += a.param != kernels::sr_draws(11, 6, i).param;
    diff_mv += a.m != a.v;
    diff_pair += kernels::sr_draws(11, 5, 2 * i).param != kernels::sr_draws(11, 5, 2 * i + 1).param;
  }
  EXPECT_GT(diff_seed, 990);
  EXPECT_GT(diff_step, 990);
  EXPECT_GT(diff_mv, 990);
  EXPECT_GT(diff_pair, 990);
  EXPECT_NE(kernels::sr_draws(1, 1, 5).m, kernels::sr_draws(1, 1, (std::uint64_t(1) << 32) + 5).m);
  // The reference's step uses exactly these draws: a parameter rounding with q = 1/2 of an ulp.
  const std::uint64_t i = 12345;
  const float w = 1.f + 0.5f * std::ldexp(1.f, -7);  // halfway between bf16 neighbours 1 and 1 + 2^-7
  const kernels::SrDraws d = kernels::sr_draws(3, 1, i);
  std::uint32_t wu;
  std::memcpy(&wu, &w, 4);
  EXPECT_EQ(ref::bf16_store(w, true, d.param), bf16_bits_to_f32(kernels::sr_round_bits(wu, d.param)));
}

TEST(StochasticRound, ExactValuesAndSpecialsPassThrough) {
  for (float f : {1.f, -2.5f, 0.f, INFINITY, -INFINITY}) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    for (unsigned r : {0u, 1u, 0x8000u, 0xffffu}) EXPECT_EQ(bf16_bits_to_f32(kernels::sr_round_bits(u, r)), f);
  }
  std::uint32_t nan_bits = 0x7fc00001u;
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(kernels::sr_round_bits(nan_bits, 0xffffu))));
}

}  // namespace
}  // namespace cutrain
