#include "tests/reference/gemm_ref.h"

#include <cmath>
#include <cstddef>

#include "runtime/error.h"

namespace cutrain::ref {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;

void check_size(const char* fn, const char* name, std::size_t got, std::size_t want) {
  CUTRAIN_CHECK(got == want, fn, ": `", name, "` has ", got, " elements, expected ", want);
}
}  // namespace

double epilogue_gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x))); }

double epilogue_gelu_tanh_grad(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kCubic * x * x);
}

std::vector<double> gemm_forward(const std::vector<float>& x, const std::vector<float>& w, const float* bias, int M,
                                 int N, int K, bool gelu, std::vector<double>* pre_out) {
  check_size("ref::gemm_forward", "x", x.size(), std::size_t(M) * K);
  check_size("ref::gemm_forward", "w", w.size(), std::size_t(N) * K);
  std::vector<double> y(std::size_t(M) * N);
  if (pre_out) pre_out->assign(y.size(), 0.0);
  for (int i = 0; i < M; ++i) {
    const float* xr = &x[std::size_t(i) * K];
    for (int j = 0; j < N; ++j) {
      const float* wr = &w[std::size_t(j) * K];
      double s = bias ? double(bias[j]) : 0.0;
      for (int k = 0; k < K; ++k) s += double(xr[k]) * double(wr[k]);
      const std::size_t o = std::size_t(i) * N + j;
      if (pre_out) (*pre_out)[o] = s;
      y[o] = gelu ? epilogue_gelu_tanh(s) : s;
    }
  }
  return y;
}

std::vector<double> gemm_grad_input(const std::vector<float>& dy, const std::vector<float>& w, int M, int N, int K,
                                    double beta, const std::vector<float>* dx_init,
                                    const std::vector<float>* dgelu_aux) {
  const char* fn = "ref::gemm_grad_input";
  check_size(fn, "dy", dy.size(), std::size_t(M) * N);
  check_size(fn, "w", w.size(), std::size_t(N) * K);
  if (dx_init) check_size(fn, "dx_init", dx_init->size(), std::size_t(M) * K);
  if (dgelu_aux) check_size(fn, "dgelu_aux", dgelu_aux->size(), std::size_t(M) * K);
  std::vector<double> dx(std::size_t(M) * K, 0.0);
  for (int i = 0; i < M; ++i) {
    double* out = &dx[std::size_t(i) * K];
    for (int j = 0; j < N; ++j) {
      const double g = dy[std::size_t(i) * N + j];
      const float* wr = &w[std::size_t(j) * K];
      for (int k = 0; k < K; ++k) out[k] += g * double(wr[k]);
    }
    for (int k = 0; k < K; ++k) {
      const std::size_t o = std::size_t(i) * K + k;
      if (dgelu_aux) out[k] *= epilogue_gelu_tanh_grad((*dgelu_aux)[o]);
      if (dx_init) out[k] += beta * double((*dx_init)[o]);
    }
  }
  return dx;
}

std::vector<double> gemm_grad_weight(const std::vector<float>& dy, const std::vector<float>& x, int M, int N, int K,
                                     const std::vector<float>* dw_init) {
  const char* fn = "ref::gemm_grad_weight";
  check_size(fn, "dy", dy.size(), std::size_t(M) * N);
  check_size(fn, "x", x.size(), std::size_t(M) * K);
  std::vector<double> dw(std::size_t(N) * K, 0.0);
  if (dw_init) {
    check_size(fn, "dw_init", dw_init->size(), dw.size());
    for (std::size_t i = 0; i < dw.size(); ++i) dw[i] = (*dw_init)[i];
  }
  // Accumulate the product separately so the fp64 sum is not disturbed by the initial value's size.
  std::vector<double> prod(dw.size(), 0.0);
  for (int i = 0; i < M; ++i) {
    const float* xr = &x[std::size_t(i) * K];
    for (int j = 0; j < N; ++j) {
      const double g = dy[std::size_t(i) * N + j];
      double* out = &prod[std::size_t(j) * K];
      for (int k = 0; k < K; ++k) out[k] += g * double(xr[k]);
    }
  }
  for (std::size_t i = 0; i < dw.size(); ++i) dw[i] += prod[i];
  return dw;
}

std::vector<double> bias_grad(const std::vector<float>& dy, int M, int N, const std::vector<float>* db_init) {
  check_size("ref::bias_grad", "dy", dy.size(), std::size_t(M) * N);
  std::vector<double> db(N, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) db[j] += dy[std::size_t(i) * N + j];
  if (db_init) {
    check_size("ref::bias_grad", "db_init", db_init->size(), std::size_t(N));
    for (int j = 0; j < N; ++j) db[j] += (*db_init)[j];
  }
  return db;
}

}  // namespace cutrain::ref
