// @brief Dropout from the counter-based Philox generator (kernels/common/philox.cuh): the mask of
// element e is a function of (seed, step, layer, e), so backward regenerates it instead of storing
// it, and a run, a resume and the CPU reference draw the same one. Plain dropout and BERT's hidden
// dropout fused with its bias and residual add.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/philox.cuh"
#include "runtime/dtype.h"

namespace cutrain::kernels {

struct DropoutParams {
  DropoutKey key;
  float p = 0.f;  // the probability of dropping, in [0, 1)
};

// Host: the keep threshold round(p * 2^32) (elements with bits >= it are kept) and the scale of the
// kept ones, 1 / (1 - p) in fp32. Both throw cutrain::Error for p outside [0, 1).
std::uint32_t dropout_threshold(float p);
float dropout_scale(float p);

// out = x * keep / (1 - p) over [n] elements of `dtype` (bf16, fp16 or fp32; math in fp32, one rounding).
// In place (out == x) is fine. The mask of element e uses the bits of element e of the flat index.
void dropout_forward(cudaStream_t s, const DropoutParams& p, const void* x, void* out, std::size_t n, DType dtype);
// dx = dy * keep / (1 - p) with the forward's mask, regenerated from the same params.
void dropout_backward(cudaStream_t s, const DropoutParams& p, const void* dy, void* dx, std::size_t n, DType dtype);

// BERT's hidden dropout: out[r, c] = residual[r, c] + dropout(x[r, c] + bias[c]) over row-major
// [rows, cols] (bias [cols]; all of `dtype`; fp32 math: t = x + b, t * scale or 0, + residual, each
// rounded in fp32, then one rounding to dtype). The mask is dropout_forward's of the flat
// [rows * cols] tensor, so the backward is d_residual = dy, dx = dropout_backward(dy), and the
// bias gradient the column sums of dx (kernels::bias_grad). With p = 0 (evaluation, or a ratio of 0)
// no bits are drawn: the plain bias + residual add, the same bits as keeping every element.
void bias_dropout_residual_forward(cudaStream_t s, const DropoutParams& p, const void* x, const void* bias,
                                   const void* residual, void* out, std::size_t rows, std::size_t cols, DType dtype);

}  // namespace cutrain::kernels
