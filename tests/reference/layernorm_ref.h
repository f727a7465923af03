// @brief CPU reference of kernels/layernorm (fused residual add), fp64 math.
#pragma once

#include <vector>

#include "runtime/dtype.h"

namespace cutrain::ref {

struct LayerNormForward {
  std::vector<float> sum;    // x + residual rounded to `storage` (fp32 add, as the kernel and PyTorch do)
  std::vector<double> y;     // (sum - mean) * rstd * gamma + beta
  std::vector<double> mean;  // per row
  std::vector<double> rstd;  // per row, 1 / sqrt(var + eps), biased variance
};

// residual may be null (sum = x). All inputs are the 16-bit values as floats; `storage`: the
// kernel's 16-bit type (BF16 or F16), which the sum is rounded to.
LayerNormForward layernorm_forward(const float* x, const float* residual, const float* gamma, const float* beta,
                                   int rows, int cols, double eps = 1e-5, DType storage = DType::BF16);

struct LayerNormBackward {
  std::vector<double> d_sum;   // LN input gradient (+ d_extra)
  std::vector<double> dgamma;  // Σ_rows dy * xhat  (+ the previous value when accumulating)
  std::vector<double> dbeta;   // Σ_rows dy
};

// mean/rstd are recomputed in fp64 from `sum`. d_extra may be null. dgamma0/dbeta0 (may be null)
// are the values accumulated onto.
LayerNormBackward layernorm_backward(const float* dy, const float* sum, const float* gamma, const float* d_extra,
                                     const float* dgamma0, const float* dbeta0, int rows, int cols,
                                     double eps = 1e-5);

// The same backward from the LayerNorm output (kernels' layernorm_backward_from_output): x_hat is
// recovered as (y - beta) / gamma in fp64 from the given y (bf16 values as floats) and the per-row
// rstd the forward wrote; mean is not needed. gamma must be non-zero.
LayerNormBackward layernorm_backward_from_output(const float* dy, const float* y, const float* rstd,
                                                 const float* gamma, const float* beta, const float* d_extra,
                                                 const float* dgamma0, const float* dbeta0, int rows, int cols);

}  // namespace cutrain::ref
