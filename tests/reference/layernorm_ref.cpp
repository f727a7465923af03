#include "tests/reference/layernorm_ref.h"

#include <cmath>
#include <cstddef>

#include "runtime/dtype.h"

namespace cutrain::ref {
namespace {
void row_stats(const float* v, int cols, double eps, double& mean, double& rstd) {
  double s = 0;
  for (int c = 0; c < cols; ++c) s += v[c];
  mean = s / cols;
  double q = 0;
  for (int c = 0; c < cols; ++c) q += (v[c] - mean) * (v[c] - mean);
  rstd = 1.0 / std::sqrt(q / cols + eps);
}

// The backward given the row's x_hat (however obtained): b.d_sum of the row at `base`, and the
// row's terms added to b.dgamma / b.dbeta.
void backward_row(const float* dy, const double* xh, double rstd, const float* gamma, const float* d_extra,
                  std::size_t base, int cols, LayerNormBackward& b) {
  double s1 = 0, s2 = 0;
  for (int c = 0; c < cols; ++c) {
    const double dxh = double(dy[base + c]) * gamma[c];
    s1 += dxh;
    s2 += dxh * xh[c];
    b.dgamma[c] += double(dy[base + c]) * xh[c];
    b.dbeta[c] += dy[base + c];
  }
  s1 /= cols;
  s2 /= cols;
  for (int c = 0; c < cols; ++c) {
    double d = rstd * (double(dy[base + c]) * gamma[c] - s1 - xh[c] * s2);
    if (d_extra) d += d_extra[base + c];
    b.d_sum[base + c] = d;
  }
}

LayerNormBackward start_backward(const float* dgamma0, const float* dbeta0, int rows, int cols) {
  LayerNormBackward b;
  b.d_sum.resize(static_cast<std::size_t>(rows) * cols);
  b.dgamma.assign(cols, 0.0);
  b.dbeta.assign(cols, 0.0);
  for (int c = 0; c < cols; ++c) {
    if (dgamma0) b.dgamma[c] = dgamma0[c];
    if (dbeta0) b.dbeta[c] = dbeta0[c];
  }
  return b;
}
}  // namespace

LayerNormForward layernorm_forward(const float* x, const float* residual, const float* gamma, const float* beta,
                                   int rows, int cols, double eps, DType storage) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  LayerNormForward f;
  f.sum.resize(n);
  f.y.resize(n);
  f.mean.resize(rows);
  f.rstd.resize(rows);
  for (std::size_t i = 0; i < n; ++i) {
    const float sum = x[i] + (residual ? residual[i] : 0.f);
    f.sum[i] = !residual ? x[i] : storage == DType::F16 ? round_f16(sum) : round_bf16(sum);
  }
  for (int r = 0; r < rows; ++r) {
    const float* v = f.sum.data() + static_cast<std::size_t>(r) * cols;
    row_stats(v, cols, eps, f.mean[r], f.rstd[r]);
    for (int c = 0; c < cols; ++c)
      f.y[static_cast<std::size_t>(r) * cols + c] = (v[c] - f.mean[r]) * f.rstd[r] * gamma[c] + beta[c];
  }
  return f;
}

LayerNormBackward layernorm_backward(const float* dy, const float* sum, const float* gamma, const float* d_extra,
                                     const float* dgamma0, const float* dbeta0, int rows, int cols, double eps) {
  LayerNormBackward b = start_backward(dgamma0, dbeta0, rows, cols);
  std::vector<double> xh(cols);
  for (int r = 0; r < rows; ++r) {
    const std::size_t base = static_cast<std::size_t>(r) * cols;
    double mean, rstd;
    row_stats(sum + base, cols, eps, mean, rstd);
    for (int c = 0; c < cols; ++c) xh[c] = (sum[base + c] - mean) * rstd;
    backward_row(dy, xh.data(), rstd, gamma, d_extra, base, cols, b);
  }
  return b;
}

LayerNormBackward layernorm_backward_from_output(const float* dy, const float* y, const float* rstd,
                                                 const float* gamma, const float* beta, const float* d_extra,
                                                 const float* dgamma0, const float* dbeta0, int rows, int cols) {
  LayerNormBackward b = start_backward(dgamma0, dbeta0, rows, cols);
  std::vector<double> xh(cols);
  for (int r = 0; r < rows; ++r) {
    const std::size_t base = static_cast<std::size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) xh[c] = (double(y[base + c]) - beta[c]) / gamma[c];
    backward_row(dy, xh.data(), rstd[r], gamma, d_extra, base, cols, b);
  }
  return b;
}

}  // namespace cutrain::ref
