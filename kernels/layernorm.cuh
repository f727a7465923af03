// @brief LayerNorm fused with the residual add (post-LN blocks), forward and backward.
// bf16 or fp16 storage (T; instances of both), fp32 math; hidden size `cols` in [64, 16384] (others: a clear error).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// sum = x + residual (residual may be null: sum = x, and `sum_out` may then be null too; when
// given it receives x); `sum_out` must not alias x.
// y = (sum - mean) * rstd * gamma + beta; mean, rstd fp32 per row (PyTorch's eps default 1e-5).
template <typename T>
void layernorm_residual_forward(cudaStream_t s, const T* x, const nondeduced_t<T>* residual,
                                nondeduced_t<T>* sum_out, T* y, float* mean, float* rstd,
                                const nondeduced_t<T>* gamma, const nondeduced_t<T>* beta, int rows, int cols,
                                float eps = 1e-5f);

// Given dy and the LN input `sum` with its mean/rstd: d_sum (the gradient of both x and the
// residual) = LN backward, plus `d_extra` when non-null (another gradient of the same tensor).
// d_sum may alias dy. dgamma/dbeta (type `param_grad_type`, bf16, fp16 or fp32) are written, or
// accumulated when `accumulate`, through a deterministic two-stage reduction (same bits every
// run) using `scratch` of layernorm_backward_scratch_bytes(rows, cols) bytes. Kernels by shape
// (kernels/layernorm_tiles.cuh): a warp team per row with the next row prefetched up to 8192
// columns, a block per row beyond; a scalar path when cols % 8 != 0 or a pointer is misaligned.
std::size_t layernorm_backward_scratch_bytes(int rows, int cols);
template <typename T>
void layernorm_backward(cudaStream_t s, const T* dy, const nondeduced_t<T>* sum, const float* mean,
                        const float* rstd, const nondeduced_t<T>* gamma, const nondeduced_t<T>* d_extra, T* d_sum,
                        void* dgamma, void* dbeta, DType param_grad_type, bool accumulate, void* scratch, int rows,
                        int cols);

// DeepSpeed's normalize_invertible: the same backward without the LN input. The normalized input
// is recovered from the output, x_hat = (y - beta) / gamma, so `y` (kept anyway as the next
// layer's input) replaces `sum` and mean is not needed. gamma entries must be non-zero (a zero
// makes x_hat of that column undefined; DeepSpeed's kernel has the same condition). Same outputs,
// aliasing, reduction and scratch (layernorm_backward_scratch_bytes) as layernorm_backward.
template <typename T>
void layernorm_backward_from_output(cudaStream_t s, const T* dy, const nondeduced_t<T>* y, const float* rstd,
                                    const nondeduced_t<T>* gamma, const nondeduced_t<T>* beta,
                                    const nondeduced_t<T>* d_extra, T* d_sum, void* dgamma, void* dbeta,
                                    DType param_grad_type, bool accumulate, void* scratch, int rows, int cols);

}  // namespace cutrain::kernels
