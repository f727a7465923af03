// @brief CPU reference of dropout (kernels/dropout.cuh): the same Philox bits
// (kernels/common/philox.cuh), the same fp32 operations, so masks are bit-identical to the GPU's.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/dropout.cuh"

namespace cutrain::ref {

// 1 where element e of [0, n) is kept.
std::vector<std::uint8_t> dropout_mask(const kernels::DropoutParams& p, std::size_t n);
// x * keep / (1 - p), in fp32.
std::vector<float> dropout(const kernels::DropoutParams& p, const std::vector<float>& x);
// residual + dropout(x + bias[c]) over row-major [rows, cols], in fp32 as the kernel rounds.
std::vector<float> bias_dropout_residual(const kernels::DropoutParams& p, const std::vector<float>& x,
                                         const std::vector<float>& bias, const std::vector<float>& residual,
                                         std::size_t rows, std::size_t cols);

}  // namespace cutrain::ref
