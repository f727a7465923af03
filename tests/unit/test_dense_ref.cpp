// CPU tests of the dense-kernel references themselves (GELU, LayerNorm, embedding): known values,
// finite differences and invariants, so the GPU tests compare against something trustworthy.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/reference/embedding_ref.h"
#include "tests/reference/gelu_ref.h"
#include "tests/reference/layernorm_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;

TEST(GeluRef, KnownValues) {
  // Φ(1) = 0.8413447460685429..., so gelu(1) = Φ(1), gelu(-1) = -(1 - Φ(1)).
  EXPECT_NEAR(ref::gelu_erf(1.0), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(ref::gelu_erf(-1.0), -0.15865525393145707, 1e-15);
  EXPECT_NEAR(ref::gelu_erf(2.0), 1.9544997361036416, 1e-14);
  EXPECT_EQ(ref::gelu_erf(0.0), 0.0);
  EXPECT_NEAR(ref::gelu_tanh(1.0), 0.8411919906082768, 1e-14);
  EXPECT_NEAR(ref::gelu_erf_grad(0.0), 0.5, 1e-15);
  EXPECT_NEAR(ref::gelu_tanh_grad(0.0), 0.5, 1e-15);
  // Far tails: identity on the right, zero on the left.
  EXPECT_NEAR(ref::gelu_erf(10.0), 10.0, 1e-12);
  EXPECT_NEAR(ref::gelu_erf(-10.0), 0.0, 1e-12);
  // The negative tail keeps its relative precision (1 + erf / 1 + tanh would cancel; values from
  // mpmath at 40 digits).
  EXPECT_NEAR(ref::gelu_erf(-8.0) / -4.97676845941742729881279613807e-15, 1.0, 1e-12);
  EXPECT_NEAR(ref::gelu_tanh(-8.0) / -3.107782937501111218031581e-21, 1.0, 1e-12);
}

TEST(GeluRef, GradMatchesFiniteDifference) {
  auto rng = test::fresh_rng();
  auto xs = test::random_uniform(200, rng, -6.f, 6.f);
  const double h = 1e-6;
  for (float x : xs) {
    EXPECT_NEAR(ref::gelu_erf_grad(x), (ref::gelu_erf(x + h) - ref::gelu_erf(x - h)) / (2 * h), 1e-7) << x;
    EXPECT_NEAR(ref::gelu_tanh_grad(x), (ref::gelu_tanh(x + h) - ref::gelu_tanh(x - h)) / (2 * h), 1e-7) << x;
  }
}

TEST(GeluRef, ForwardAddsBiasAndRoundsPre) {
  const float in[6] = {0.5f, -1.f, 2.f, 0.25f, 0.125f, -3.f};
  const float bias[3] = {1.f, 0.5f, -2.f};
  auto f = ref::gelu_forward(in, bias, 2, 3, false);
  const float want_pre[6] = {1.5f, -0.5f, 0.f, 1.25f, 0.625f, -5.f};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(f.pre[i], want_pre[i]);
    EXPECT_NEAR(f.out[i], ref::gelu_erf(want_pre[i]), 1e-15);
  }
}

TEST(LayerNormRef, NormalizesRows) {
  auto rng = test::fresh_rng();
  const int rows = 5, cols = 300;
  auto x = test::round_bf16(test::random_normal(rows * cols, rng, 3.f, 2.f));
  std::vector<float> g(cols, 1.f), b(cols, 0.f);
  auto f = ref::layernorm_forward(x.data(), nullptr, g.data(), b.data(), rows, cols);
  for (int r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < cols; ++c) m += f.y[r * cols + c];
    m /= cols;
    for (int c = 0; c < cols; ++c) v += (f.y[r * cols + c] - m) * (f.y[r * cols + c] - m);
    v /= cols;
    EXPECT_NEAR(m, 0.0, 1e-12);
    // var(y) = var / (var + eps)
    const double var = 1.0 / (f.rstd[r] * f.rstd[r]) - 1e-5;
    EXPECT_NEAR(v, var / (var + 1e-5), 1e-12);
    EXPECT_EQ(f.sum[r * cols], x[r * cols]);
  }
}

TEST(LayerNormRef, ResidualSumIsRoundedToBf16) {
  // bf16 keeps 8 significant bits: ulp(1) = 2^-7, ties go to even.
  const float x[64] = {1.f, 1.f / 128, 1.f, 1.f}, res[64] = {1.f / 512, 1.f, 1.f / 256, 3.f / 256};
  std::vector<float> g(64, 1.f), b(64, 0.f);
  auto f = ref::layernorm_forward(x, res, g.data(), b.data(), 1, 64);
  EXPECT_EQ(f.sum[0], 1.f);               // 1 + 2^-9: below half an ulp
  EXPECT_EQ(f.sum[1], 1.f + 1.f / 128);   // representable
  EXPECT_EQ(f.sum[2], 1.f);               // 1 + 2^-8: a tie, to even
  EXPECT_EQ(f.sum[3], 1.f + 1.f / 64);    // 1 + 3 * 2^-8: a tie, to even (up)
}

// Loss L = Σ w ⊙ y; the backward's d_sum, dgamma, dbeta must match central differences.
TEST(LayerNormRef, BackwardMatchesFiniteDifference) {
  auto rng = test::fresh_rng();
  const int rows = 3, cols = 67;
  auto x = test::random_normal(rows * cols, rng, 0.5f, 1.5f);
  auto g = test::random_normal(cols, rng, 1.f, 0.3f);
  auto b = test::random_normal(cols, rng, 0.f, 0.3f);
  auto w = test::random_normal(rows * cols, rng);
  auto loss = [&](const std::vector<float>& xx, const std::vector<float>& gg, const std::vector<float>& bb) {
    auto f = ref::layernorm_forward(xx.data(), nullptr, gg.data(), bb.data(), rows, cols);
    double L = 0;
    for (int i = 0; i < rows * cols; ++i) L += w[i] * f.y[i];
    return L;
  };
  auto bw = ref::layernorm_backward(w.data(), x.data(), g.data(), nullptr, nullptr, nullptr, rows, cols);
  const float h = 1e-2f;  // float inputs: a large step, the loss is smooth
  for (int i : {0, 5, 66, 100, 200}) {
    auto xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const double fd = (loss(xp, g, b) - loss(xm, g, b)) / (double(xp[i]) - xm[i]);
    EXPECT_NEAR(bw.d_sum[i], fd, 2e-3 * (1 + std::abs(fd))) << i;
  }
  for (int c : {0, 33, 66}) {
    auto gp = g, gm = g, bp = b, bm = b;
    gp[c] += h;
    gm[c] -= h;
    bp[c] += h;
    bm[c] -= h;
    EXPECT_NEAR(bw.dgamma[c], (loss(x, gp, b) - loss(x, gm, b)) / (double(gp[c]) - gm[c]), 1e-3) << c;
    EXPECT_NEAR(bw.dbeta[c], (loss(x, g, bp) - loss(x, g, bm)) / (double(bp[c]) - bm[c]), 1e-3) << c;
  }
  // d_extra and accumulation add on.
  std::vector<float> extra(rows * cols, 0.25f), g0(cols, 2.f), b0(cols, -1.f);
  auto bw2 = ref::layernorm_backward(w.data(), x.data(), g.data(), extra.data(), g0.data(), b0.data(), rows, cols);
  EXPECT_NEAR(bw2.d_sum[7], bw.d_sum[7] + 0.25, 1e-12);
  EXPECT_NEAR(bw2.dgamma[3], bw.dgamma[3] + 2.0, 1e-12);
  EXPECT_NEAR(bw2.dbeta[3], bw.dbeta[3] - 1.0, 1e-12);
}

// normalize_invertible: with x_hat recovered from the fp64 forward's output (rounded only to
// float), the backward from the output gives the ordinary backward's gradients up to that rounding;
// from a bf16-rounded output, within the bf16 tolerance the GPU test uses against layernorm_backward.
TEST(LayerNormRef, BackwardFromOutputMatchesBackwardFromInput) {
  auto rng = test::fresh_rng();
  for (auto [rows, cols] : {std::pair{3, 67}, std::pair{17, 1030}, std::pair{1, 64}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const std::size_t n = static_cast<std::size_t>(rows) * cols;
    auto x = test::random_normal(n, rng, 0.5f, 1.5f);
    // gamma away from 0 (|gamma| in [0.5, 1.5], either sign): x_hat = (y - beta) / gamma.
    auto g = test::random_uniform(cols, rng, 0.5f, 1.5f);
    auto sign = test::random_uniform(cols, rng, -1.f, 1.f);
    for (int c = 0; c < cols; ++c) g[c] = sign[c] < 0 ? -g[c] : g[c];
    auto b = test::random_normal(cols, rng, 0.f, 0.3f);
    auto dy = test::random_normal(n, rng);
    auto extra = test::random_normal(n, rng, 0.f, 0.5f);
    auto g0 = test::random_normal(cols, rng), b0 = test::random_normal(cols, rng);
    auto f = ref::layernorm_forward(x.data(), nullptr, g.data(), b.data(), rows, cols);
    std::vector<float> y(f.y.begin(), f.y.end()), rstd(f.rstd.begin(), f.rstd.end());
    for (bool with_extra : {false, true}) {
      const float* e = with_extra ? extra.data() : nullptr;
      const float* dg0 = with_extra ? g0.data() : nullptr;  // accumulate onto g0/b0 alongside d_extra
      const float* db0 = with_extra ? b0.data() : nullptr;
      auto want = ref::layernorm_backward(dy.data(), x.data(), g.data(), e, dg0, db0, rows, cols);
      auto got = ref::layernorm_backward_from_output(dy.data(), y.data(), rstd.data(), g.data(), b.data(), e, dg0,
                                                     db0, rows, cols);
      std::vector<float> ds(got.d_sum.begin(), got.d_sum.end()), dg(got.dgamma.begin(), got.dgamma.end()),
          db(got.dbeta.begin(), got.dbeta.end());
      EXPECT_LE(test::rel_error(ds, want.d_sum), 1e-5);
      EXPECT_LE(test::rel_error(dg, want.dgamma), 1e-5);
      EXPECT_LE(test::rel_error(db, want.dbeta), 1e-6);  // dbeta does not involve x_hat

      // From the bf16-rounded output (what the GPU keeps).
      auto y16 = test::round_bf16(y);
      auto got16 = ref::layernorm_backward_from_output(dy.data(), y16.data(), rstd.data(), g.data(), b.data(), e,
                                                       dg0, db0, rows, cols);
      std::vector<float> ds16(got16.d_sum.begin(), got16.d_sum.end()),
          dg16(got16.dgamma.begin(), got16.dgamma.end());
      EXPECT_LE(test::rel_error(ds16, want.d_sum), 1e-2);
      EXPECT_LE(test::rel_error(dg16, want.dgamma), 1e-2);
    }
  }
}

TEST(EmbeddingRef, ForwardBackwardByHand) {
  const int B = 2, T = 2, C = 2, vocab = 3;
  const int32_t tok[4] = {2, 0, 2, 7};  // repeated 2, one out of range at flat index 3
  const float wte[6] = {1, 2, 3, 4, 5, 6}, wpe[4] = {10, 20, 30, 40};
  int bad = -1;
  auto out = ref::embedding_forward(tok, wte, wpe, B, T, C, vocab, &bad);
  EXPECT_EQ(bad, 4);
  const double want[8] = {15, 26, 31, 42, 15, 26, 0, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], want[i]) << i;
  const float dout[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  auto g = ref::embedding_backward(dout, tok, nullptr, nullptr, B, T, C, vocab);
  const double want_wte[6] = {3, 4, 0, 0, 6, 8}, want_wpe[4] = {6, 8, 10, 12};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(g.dwte[i], want_wte[i]) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g.dwpe[i], want_wpe[i]) << i;
}
