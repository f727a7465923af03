// @brief CPU reference of kernels/gelu, fp64 math.
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/dtype.h"

namespace cutrain::ref {

double gelu_erf(double x);    // x * Φ(x)
double gelu_tanh(double x);   // 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))
double gelu_erf_grad(double x);
double gelu_tanh_grad(double x);

struct GeluForward {
  std::vector<float> pre;   // in + bias[col] rounded to the storage type (= in when no bias)
  std::vector<double> out;  // gelu(pre)
};
// bias may be null; tanh selects the approximation; `storage`: the kernel's 16-bit type (BF16 or F16).
GeluForward gelu_forward(const float* in, const float* bias, int rows, int cols, bool tanh,
                         DType storage = DType::BF16);
// dout * gelu'(pre)
std::vector<double> gelu_backward(const float* dout, const float* pre, std::size_t n, bool tanh);

}  // namespace cutrain::ref
