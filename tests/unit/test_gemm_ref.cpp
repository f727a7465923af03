// CPU tests of the gemm references (tests/reference/gemm_ref.h): the backward references are the
// derivatives of the forward ones (checked by finite differences), and gelu' is gelu's derivative.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "tests/reference/gemm_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {
// L = Σ dy ⊙ y for the forward reference, in double.
double loss(const std::vector<double>& y, const std::vector<float>& dy) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
  return s;
}

// Central difference of f at v[i], with the step as actually representable in float.
double central_diff(std::vector<float>& v, std::size_t i, const std::function<double()>& f) {
  const float orig = v[i];
  const float up = orig + 0.25f, down = orig - 0.25f;
  v[i] = up;
  const double lu = f();
  v[i] = down;
  const double ld = f();
  v[i] = orig;
  return (lu - ld) / (double(up) - double(down));
}
}  // namespace

TEST(GemmRef, GeluTanhGradIsTheDerivative) {
  auto rng = test::fresh_rng();
  for (float xf : test::random_uniform(200, rng, -6.f, 6.f)) {
    const double x = xf, h = 1e-5;
    const double fd = (ref::epilogue_gelu_tanh(x + h) - ref::epilogue_gelu_tanh(x - h)) / (2 * h);
    EXPECT_NEAR(ref::epilogue_gelu_tanh_grad(x), fd, 1e-7) << "x=" << x;
  }
  EXPECT_EQ(ref::epilogue_gelu_tanh(0.0), 0.0);
  EXPECT_NEAR(ref::epilogue_gelu_tanh(10.0), 10.0, 1e-9);
  EXPECT_NEAR(ref::epilogue_gelu_tanh(-10.0), 0.0, 1e-9);
  // The tanh form differs from the exact erf GELU by < 1e-3 on [-6, 6]: checks the constants.
  for (double x = -6; x <= 6; x += 0.05) EXPECT_NEAR(ref::epilogue_gelu_tanh(x), 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))), 1e-3);
}

TEST(GemmRef, BackwardIsTheDerivativeOfForward) {
  auto rng = test::fresh_rng();
  const int M = 5, N = 7, K = 3;
  auto x = test::random_normal(M * K, rng), w = test::random_normal(N * K, rng), b = test::random_normal(N, rng);
  auto dy = test::random_normal(M * N, rng);
  auto L = [&] { return loss(ref::gemm_forward(x, w, b.data(), M, N, K), dy); };
  const auto dx = ref::gemm_grad_input(dy, w, M, N, K);
  const auto dw = ref::gemm_grad_weight(dy, x, M, N, K);
  const auto db = ref::bias_grad(dy, M, N);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], central_diff(x, i, L), 1e-6) << "dx " << i;
  for (std::size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(dw[i], central_diff(w, i, L), 1e-6) << "dw " << i;
  for (std::size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(db[i], central_diff(b, i, L), 1e-6) << "db " << i;
}

TEST(GemmRef, DgeluGradInputIsTheDerivativeThroughGelu) {
  // y = gelu(pre)·W2ᵀ: dL/dpre = (dy·W2) ⊙ gelu'(pre).
  auto rng = test::fresh_rng();
  const int M = 4, N = 6, K = 5;
  auto pre = test::random_normal(M * K, rng), w2 = test::random_normal(N * K, rng), dy = test::random_normal(M * N, rng);
  auto L = [&] {
    std::vector<float> h(pre.size());
    double s = 0;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double y = 0;
        for (int k = 0; k < K; ++k) y += ref::epilogue_gelu_tanh(pre[i * K + k]) * w2[j * K + k];
        s += y * dy[i * N + j];
      }
    return s;
  };
  const auto dpre = ref::gemm_grad_input(dy, w2, M, N, K, 0.0, nullptr, &pre);
  for (std::size_t i = 0; i < pre.size(); ++i) {
    const float orig = pre[i];
    const double h = 1e-3;
    pre[i] = float(orig + h);
    const double lu = L();
    pre[i] = float(orig - h);
    const double ld = L();
    pre[i] = orig;
    const double step = double(float(orig + h)) - double(float(orig - h));
    EXPECT_NEAR(dpre[i], (lu - ld) / step, 2e-3 * (1 + std::abs(dpre[i]))) << "dpre " << i;
  }
}

TEST(GemmRef, ForwardEpiloguesAndAccumulation) {
  auto rng = test::fresh_rng();
  const int M = 3, N = 4, K = 2;
  auto x = test::random_normal(M * K, rng), w = test::random_normal(N * K, rng), b = test::random_normal(N, rng);
  std::vector<double> pre;
  const auto plain = ref::gemm_forward(x, w, nullptr, M, N, K);
  const auto act = ref::gemm_forward(x, w, b.data(), M, N, K, true, &pre);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      const double p = double(x[i * K]) * w[j * K] + double(x[i * K + 1]) * w[j * K + 1];
      EXPECT_NEAR(plain[i * N + j], p, 1e-12);
      EXPECT_NEAR(pre[i * N + j], p + b[j], 1e-12);
      EXPECT_NEAR(act[i * N + j], ref::epilogue_gelu_tanh(p + b[j]), 1e-12);
    }
  auto dy = test::random_normal(M * N, rng), init = test::random_normal(M * K, rng);
  const auto dx0 = ref::gemm_grad_input(dy, w, M, N, K);
  const auto dx1 = ref::gemm_grad_input(dy, w, M, N, K, 0.5, &init);
  for (std::size_t i = 0; i < dx0.size(); ++i) EXPECT_NEAR(dx1[i], dx0[i] + 0.5 * init[i], 1e-12);
  EXPECT_THROW(ref::gemm_forward(x, w, nullptr, M, N, K + 1), Error);
}
