#include "tests/reference/gelu_ref.h"

#include <cmath>
#include <cstddef>

#include "runtime/dtype.h"

namespace cutrain::ref {
namespace {
constexpr double kPi = 3.14159265358979323846;
constexpr double kCoef = 0.044715;

// Φ(x) as 0.5·erfc(-x/√2) and 0.5·(1 + tanh u) as 1/(1 + e^(-2u)): even in fp64, 1 + erf and
// 1 + tanh cancel in the negative tail (at x = -7.75, 1 + erf lost 2.4% of its value, which the H200
// run flagged as a kernel error).
double phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double tanh_half(double x) {  // 0.5·(1 + tanh(√(2/π)·(x + 0.044715 x³)))
  return 1.0 / (1.0 + std::exp(-2.0 * std::sqrt(2.0 / kPi) * (x + kCoef * x * x * x)));
}
}  // namespace

double gelu_erf(double x) { return x * phi(x); }
double gelu_tanh(double x) { return x * tanh_half(x); }
double gelu_erf_grad(double x) { return phi(x) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * kPi); }
double gelu_tanh_grad(double x) {
  const double k = std::sqrt(2.0 / kPi);
  const double s = tanh_half(x);  // 0.5·(1 - tanh²) = 2·s·(1 - s)
  return s + 2.0 * x * s * (1.0 - s) * k * (1.0 + 3.0 * kCoef * x * x);
}

GeluForward gelu_forward(const float* in, const float* bias, int rows, int cols, bool tanh, DType storage) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  GeluForward f;
  f.pre.resize(n);
  f.out.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    f.pre[i] = bias ? (storage == DType::F16 ? round_f16(in[i] + bias[i % cols]) : round_bf16(in[i] + bias[i % cols]))
                    : in[i];
    f.out[i] = tanh ? gelu_tanh(f.pre[i]) : gelu_erf(f.pre[i]);
  }
  return f;
}

std::vector<double> gelu_backward(const float* dout, const float* pre, std::size_t n, bool tanh) {
  std::vector<double> d(n);
  for (std::size_t i = 0; i < n; ++i) d[i] = double(dout[i]) * (tanh ? gelu_tanh_grad(pre[i]) : gelu_erf_grad(pre[i]));
  return d;
}

}  // namespace cutrain::ref
