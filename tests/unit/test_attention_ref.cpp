// CPU tests of the attention reference itself: the forward against a direct softmax written out
// for one row, the backward against central finite differences of L = sum(dout o out); with BERT's
// options: p = 0 and an all-ones mask change nothing, masked keys carry no weight, dropout keeps
// about 1 - p of the probabilities, and the masked + dropout backward against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tests/reference/attention_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using kernels::AttentionShape;

namespace {

double loss(const std::vector<float>& qkv, const std::vector<float>& dout, const AttentionShape& sh,
            const ref::AttentionRefOptions& opts = {}) {
  std::vector<double> out, lse;
  ref::attention_forward(qkv, sh, out, lse, opts);
  double l = 0;
  for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * dout[i];
  return l;
}

// The reference backward against central differences of loss() (fp64 sums of float inputs, step
// 1e-2), with `opts`; the gradient must not be trivially zero.
void expect_backward_matches_finite_differences(std::vector<float> qkv, const std::vector<float>& dout,
                                                const AttentionShape& sh, const ref::AttentionRefOptions& opts) {
  std::vector<double> out, lse, dqkv;
  ref::attention_forward(qkv, sh, out, lse, opts);
  // The backward takes `out` as floats; with the exact forward output D = rowsum(dout o out) is exact
  // up to float rounding of out, far below the finite-difference tolerance.
  std::vector<float> outf(out.begin(), out.end());
  ref::attention_backward(qkv, outf, dout, sh, dqkv, opts);
  std::vector<double> fd(qkv.size());
  for (std::size_t i = 0; i < qkv.size(); ++i) {
    const float x = qkv[i], h = 1e-2f;
    qkv[i] = x + h;
    const double lp = loss(qkv, dout, sh, opts);
    qkv[i] = x - h;
    const double lm = loss(qkv, dout, sh, opts);
    qkv[i] = x;
    fd[i] = (lp - lm) / (2.0 * h);
  }
  std::vector<float> analytic(dqkv.begin(), dqkv.end());
  EXPECT_LT(test::rel_error(analytic, fd), 1e-3);
  double norm = 0;
  for (double v : fd) norm += v * v;
  EXPECT_GT(norm, 1e-6) << "gradient is trivially zero";
}

class AttentionRef : public ::testing::TestWithParam<bool> {};

TEST_P(AttentionRef, ForwardMatchesDirectSoftmax) {
  auto rng = test::fresh_rng();
  AttentionShape sh{2, 5, 3, 8, GetParam()};
  const auto qkv = test::random_normal(static_cast<std::size_t>(sh.batch) * sh.seq * 3 * sh.heads * sh.head_dim, rng);
  std::vector<double> out, lse;
  ref::attention_forward(qkv, sh, out, lse);
  auto at = [&](int b, int t, int w, int h, int d) { return qkv[(((b * sh.seq + t) * 3 + w) * sh.heads + h) * 8 + d]; };
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < sh.heads; ++h)
      for (int i = 0; i < sh.seq; ++i) {
        std::vector<double> e(sh.seq, 0.0);
        double z = 0;
        for (int j = 0; j < sh.seq; ++j) {
          if (sh.causal && j > i) continue;
          double s = 0;
          for (int d = 0; d < 8; ++d) s += double(at(b, i, 0, h, d)) * at(b, j, 1, h, d);
          e[j] = std::exp(s / std::sqrt(8.0));
          z += e[j];
        }
        EXPECT_NEAR(lse[(b * sh.heads + h) * sh.seq + i], std::log(z), 1e-12);
        for (int d = 0; d < 8; ++d) {
          double o = 0;
          for (int j = 0; j < sh.seq; ++j) o += e[j] / z * at(b, j, 2, h, d);
          EXPECT_NEAR(out[((b * sh.seq + i) * sh.heads + h) * 8 + d], o, 1e-12);
        }
      }
}

TEST_P(AttentionRef, BackwardMatchesFiniteDifferences) {
  auto rng = test::fresh_rng();
  AttentionShape sh{1, 6, 2, 8, GetParam()};
  const std::size_t n = static_cast<std::size_t>(sh.seq) * 3 * sh.heads * sh.head_dim;
  const auto qkv = test::random_normal(n, rng);
  expect_backward_matches_finite_differences(qkv, test::random_normal(n / 3, rng), sh, {});
}

std::size_t qkv_size(const AttentionShape& sh) {
  return static_cast<std::size_t>(sh.batch) * sh.seq * 3 * sh.heads * sh.head_dim;
}

TEST_P(AttentionRef, DefaultOptionsAreIdentity) {
  auto rng = test::fresh_rng();
  AttentionShape sh{2, 7, 2, 8, GetParam()};
  const auto qkv = test::random_normal(qkv_size(sh), rng);
  const auto dout = test::random_normal(qkv_size(sh) / 3, rng);
  std::vector<double> out0, lse0, out1, lse1, d0, d1;
  ref::attention_forward(qkv, sh, out0, lse0);
  ref::AttentionRefOptions o;
  o.key_mask.assign(static_cast<std::size_t>(sh.batch) * sh.seq, 1);
  o.dropout = {1234, 5, 6, nullptr};  // p = 0: the key draws nothing
  ref::attention_forward(qkv, sh, out1, lse1, o);
  EXPECT_EQ(out0, out1);
  EXPECT_EQ(lse0, lse1);
  const std::vector<float> outf(out0.begin(), out0.end());
  ref::attention_backward(qkv, outf, dout, sh, d0);
  ref::attention_backward(qkv, outf, dout, sh, d1, o);
  EXPECT_EQ(d0, d1);
}

TEST_P(AttentionRef, MaskedKeysCarryNoWeight) {
  auto rng = test::fresh_rng();
  AttentionShape sh{3, 9, 2, 8, GetParam()};
  const std::size_t row = static_cast<std::size_t>(sh.heads) * sh.head_dim;
  ref::AttentionRefOptions o;
  // Sequence 0: a non-prefix mask; 1: no key at all; 2: a padded prefix of 5.
  const std::uint8_t m0[9] = {1, 0, 1, 1, 0, 0, 1, 0, 1};
  for (int b = 0; b < sh.batch; ++b)
    for (int j = 0; j < sh.seq; ++j) o.key_mask.push_back(b == 0 ? m0[j] : b == 1 ? 0 : j < 5);
  o.dropout = {99, 3, 1, nullptr};
  o.dropout_p = 0.3f;
  auto qkv = test::random_normal(qkv_size(sh), rng);
  const auto dout = test::random_normal(qkv_size(sh) / 3, rng);
  std::vector<double> out, lse, out2, lse2, dqkv;
  ref::attention_forward(qkv, sh, out, lse, o);
  const std::vector<float> outf(out.begin(), out.end());
  ref::attention_backward(qkv, outf, dout, sh, dqkv, o);
  // New k and v for every masked key: nothing moves.
  auto qkv2 = qkv;
  for (int b = 0; b < sh.batch; ++b)
    for (int j = 0; j < sh.seq; ++j)
      if (!o.key_mask[static_cast<std::size_t>(b) * sh.seq + j])
        for (std::size_t e = row; e < 3 * row; ++e) qkv2[(static_cast<std::size_t>(b) * sh.seq + j) * 3 * row + e] += 5.f;
  ref::attention_forward(qkv2, sh, out2, lse2, o);
  EXPECT_EQ(out, out2);
  EXPECT_EQ(lse, lse2);
  for (int b = 0; b < sh.batch; ++b)
    for (int j = 0; j < sh.seq; ++j) {
      const std::size_t tok = static_cast<std::size_t>(b) * sh.seq + j;
      const bool masked = !o.key_mask[tok];
      const bool empty_row = b == 1;  // sequence 1: no query has a key
      for (std::size_t e = 0; e < 3 * row; ++e) {
        const double g = dqkv[tok * 3 * row + e];
        if (masked && e >= row) {
          EXPECT_EQ(g, 0.0) << "dK/dV of masked key " << j << " of sequence " << b;
        }
        if (empty_row && e < row) {
          EXPECT_EQ(g, 0.0) << "dQ of a query with no key";
        }
      }
    }
  // Sequence 1 has no key: out 0 and lse -inf on every row and head.
  for (int h = 0; h < sh.heads; ++h)
    for (int i = 0; i < sh.seq; ++i) {
      EXPECT_EQ(lse[(1 * sh.heads + h) * sh.seq + i], -std::numeric_limits<double>::infinity());
      for (int d = 0; d < sh.head_dim; ++d) EXPECT_EQ(out[((1 * sh.seq + i) * sh.heads + h) * sh.head_dim + d], 0.0);
    }
  // Causal, sequence 2, row 0 attends key 0 alone: lse is its one score.
  EXPECT_TRUE(std::isfinite(lse[(2 * sh.heads) * sh.seq]));
}

TEST(AttentionRefDropout, KeepsAboutOneMinusP) {
  for (int seq : {8, 37}) {
    const AttentionShape sh{2, seq, 3, 8, false};
    for (float p : {0.1f, 0.5f}) {
      ref::AttentionRefOptions o, o2;
      o.dropout = {777, 11, 2, nullptr};
      o.dropout_p = p;
      o2 = o;
      o2.dropout.step = 12;
      std::size_t kept = 0, differ = 0, n = 0;
      for (int b = 0; b < sh.batch; ++b)
        for (int h = 0; h < sh.heads; ++h)
          for (int i = 0; i < seq; ++i)
            for (int j = 0; j < seq; ++j, ++n) {
              const bool k = ref::attention_dropout_keep(o, sh, b, h, i, j);
              kept += k;
              differ += k != ref::attention_dropout_keep(o2, sh, b, h, i, j);
            }
      const double frac = static_cast<double>(kept) / n, sd = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(frac, 1.0 - p, 5 * sd) << "S=" << seq << " p=" << p;
      EXPECT_GT(differ, n / 20) << "another step must draw another mask";
    }
  }
  // The spec's element index: P[b,h,i,j] is element ((b*H + h)*S + i)*S + j of the Philox stream.
  const AttentionShape sh{2, 5, 3, 8, false};
  ref::AttentionRefOptions o;
  o.dropout = {5, 6, 7, nullptr};
  o.dropout_p = 0.5f;
  const std::uint64_t e = ((1ull * 3 + 2) * 5 + 3) * 5 + 4;
  EXPECT_EQ(ref::attention_dropout_keep(o, sh, 1, 2, 3, 4),
            kernels::dropout_keep(kernels::dropout_bits(o.dropout, e / 4).w[e % 4], 0x80000000u));
}

TEST_P(AttentionRef, MaskedDropoutBackwardMatchesFiniteDifferences) {
  auto rng = test::fresh_rng();
  AttentionShape sh{2, 6, 2, 8, GetParam()};
  ref::AttentionRefOptions o;
  const std::uint8_t mask[12] = {1, 1, 0, 1, 0, 1, 0, 1, 1, 1, 1, 0};  // causal: row 0 of sequence 1 has no key
  o.key_mask.assign(mask, mask + 12);
  o.dropout = {31337, 4, 0, nullptr};
  o.dropout_p = 0.3f;
  const std::size_t n = qkv_size(sh);
  const auto qkv = test::random_normal(n, rng);
  expect_backward_matches_finite_differences(qkv, test::random_normal(n / 3, rng), sh, o);
  std::size_t dropped = 0;
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < sh.heads; ++h)
      for (int i = 0; i < sh.seq; ++i)
        for (int j = 0; j < sh.seq; ++j) dropped += !ref::attention_dropout_keep(o, sh, b, h, i, j);
  EXPECT_GT(dropped, 0u) << "the check must see dropped probabilities";
}

INSTANTIATE_TEST_SUITE_P(Masks, AttentionRef, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "causal" : "full"; });

}  // namespace
