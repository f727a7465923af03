// CPU tests of the attention reference itself: the forward against a direct softmax written out
// for one row, the backward against central finite differences of L = sum(dout o out).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/reference/attention_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using kernels::AttentionShape;

namespace {

double loss(const std::vector<float>& qkv, const std::vector<float>& dout, const AttentionShape& sh) {
  std::vector<double> out, lse;
  ref::attention_forward(qkv, sh, out, lse);
  double l = 0;
  for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * dout[i];
  return l;
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
  auto qkv = test::random_normal(n, rng);
  const auto dout = test::random_normal(n / 3, rng);
  std::vector<double> out, lse, dqkv;
  ref::attention_forward(qkv, sh, out, lse);
  // The backward takes `out` as floats; with the exact forward output D = rowsum(dout o out) is exact
  // up to float rounding of out, far below the finite-difference tolerance.
  std::vector<float> outf(out.begin(), out.end());
  ref::attention_backward(qkv, outf, dout, sh, dqkv);
  std::vector<double> fd(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float x = qkv[i], h = 1e-2f;
    qkv[i] = x + h;
    const double lp = loss(qkv, dout, sh);
    qkv[i] = x - h;
    const double lm = loss(qkv, dout, sh);
    qkv[i] = x;
    fd[i] = (lp - lm) / (2.0 * h);
  }
  std::vector<float> analytic(dqkv.begin(), dqkv.end());
  EXPECT_LT(test::rel_error(analytic, fd), 1e-3);
  double norm = 0;
  for (double v : fd) norm += v * v;
  EXPECT_GT(norm, 1e-6) << "gradient is trivially zero";
}

INSTANTIATE_TEST_SUITE_P(Masks, AttentionRef, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "causal" : "full"; });

}  // namespace
