// @brief Dropout's generator and its CPU reference: Philox-4x32-10 against Random123's published
// known-answer vectors, the mask's kept fraction within statistical bounds, masks of another
// seed, step or layer independent (overlap of the dropped sets near p^2), the threshold's edges,
// and the fused bias + residual form against plain dropout of the flat tensor.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/common/philox.cuh"
#include "tests/reference/dropout_ref.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

using kernels::DropoutParams;
using kernels::PhiloxWords;

TEST(Philox, Random123KnownAnswers) {
  struct Kat {
    PhiloxWords ctr;
    std::uint32_t k0, k1;
    PhiloxWords want;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) {
    const PhiloxWords got = kernels::philox4x32_10(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.w[i], k.want.w[i]) << "word " << i;
  }
}

std::size_t count_kept(const std::vector<std::uint8_t>& m) {
  std::size_t c = 0;
  for (auto b : m) c += b;
  return c;
}

TEST(DropoutRef, KeptFractionWithinStatisticalBounds) {
  const std::size_t n = 1 << 22;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    DropoutParams d;
    d.key = {0x1234567890abcdefull, 7, 3};
    d.p = p;
    const double kept = double(count_kept(ref::dropout_mask(d, n))) / n;
    const double sigma = std::sqrt(p * (1.0 - p) / n);
    EXPECT_NEAR(kept, 1.0 - p, 6 * sigma) << "p = " << p;
  }
}

TEST(DropoutRef, EveryKeyPartGivesAnIndependentMask) {
  const std::size_t n = 1 << 20;
  DropoutParams a;
  a.key = {42, 10, 2};
  a.p = 0.3f;
  const auto ma = ref::dropout_mask(a, n);
  EXPECT_EQ(ma, ref::dropout_mask(a, n)) << "the same key must give the same mask";
  for (int part = 0; part < 3; ++part) {
    DropoutParams b = a;
    if (part == 0) b.key.seed = 43;
    if (part == 1) b.key.step = 11;
    if (part == 2) b.key.layer = 3;
    const auto mb = ref::dropout_mask(b, n);
    std::size_t both_dropped = 0;
    for (std::size_t i = 0; i < n; ++i) both_dropped += !ma[i] && !mb[i];
    const double q = 0.3 * 0.3, sigma = std::sqrt(q * (1 - q) / n);
    EXPECT_NEAR(double(both_dropped) / n, q, 6 * sigma) << "key part " << part;
  }
}

TEST(DropoutRef, ThresholdEdgesAndScale) {
  EXPECT_EQ(kernels::dropout_threshold(0.f), 0u);
  EXPECT_EQ(kernels::dropout_threshold(0.5f), 0x80000000u);
  EXPECT_EQ(kernels::dropout_scale(0.5f), 2.f);
  EXPECT_THROW(kernels::dropout_threshold(1.f), Error);
  EXPECT_THROW(kernels::dropout_threshold(-0.1f), Error);
  EXPECT_THROW(kernels::dropout_scale(std::nanf("")), Error);
  DropoutParams d;
  d.p = 0.f;
  EXPECT_EQ(count_kept(ref::dropout_mask(d, 1001)), 1001u);  // p = 0 keeps everything
  auto rng = test::fresh_rng();
  const auto x = test::random_normal(1001, rng);
  EXPECT_EQ(ref::dropout(d, x), x);
}

// The fused form's dropped elements are exactly plain dropout's of the flat [rows * cols] tensor
// (so its backward is plain dropout_backward), and its kept ones are residual + (x + b) * scale.
TEST(DropoutRef, BiasResidualFormUsesTheFlatMask) {
  auto rng = test::fresh_rng();
  const std::size_t rows = 7, cols = 13;
  const auto x = test::random_normal(rows * cols, rng), b = test::random_normal(cols, rng),
             r = test::random_normal(rows * cols, rng);
  DropoutParams d;
  d.key = {5, 1, 0};
  d.p = 0.4f;
  const auto out = ref::bias_dropout_residual(d, x, b, r, rows, cols);
  const auto keep = ref::dropout_mask(d, rows * cols);
  for (std::size_t i = 0; i < rows * cols; ++i) {
    EXPECT_NEAR(out[i], keep[i] ? r[i] + (x[i] + b[i % cols]) / 0.6f : r[i], 1e-5f) << i;
  }
}

}  // namespace
}  // namespace cutrain
