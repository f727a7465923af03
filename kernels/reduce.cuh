// @brief Global gradient norm (deterministic two-pass) and the clipping coefficient.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// Over grads[n] (bf16, fp16 or fp32): *norm = ||g||₂ (fp32; accumulated in fp32 per block, then the
// block partials summed in a fixed order: same bits every run). If max_norm > 0:
// *clip_scale = min(1, max_norm / (norm + 1e-6)) (DeepSpeed/PyTorch's clip_grad_norm_ formula),
// else 1. *nonfinite = 1 when the norm is NaN/Inf (the step must be skipped), else 0.
// When the norm is not finite, *clip_scale = 1 (the step is to be skipped anyway).
// Any of clip_scale / nonfinite may be null. `scratch`: grad_norm_scratch_bytes(n) bytes.
// `loss_scale` (device fp32, may be null = 1): the gradients are loss_scale times the true ones (fp16
// loss scaling); *norm is then the norm of the true gradients, the clip formula uses it, and
// *clip_scale carries 1 / loss_scale too: the one factor the optimizer multiplies the stored
// gradients by (its device_scale). A device word, so a captured CUDA graph reads each step's scale.
std::size_t grad_norm_scratch_bytes(std::size_t n);
void grad_norm_clip(cudaStream_t s, const void* grads, DType grad_type, std::size_t n, float max_norm, float* norm,
                    float* clip_scale, int* nonfinite, void* scratch, const float* loss_scale = nullptr);

// The same norm in two halves, for data parallelism (ZeRO stages 1-2, each rank holding one
// partition of the reduced gradient): grad_sumsq writes the sum of squares of grads[n] as one
// device double (the same deterministic passes as grad_norm_clip); after the ranks' sums are
// all-reduced, grad_norm_from_sumsq derives norm / clip_scale / nonfinite with grad_norm_clip's
// formula. On one rank the two together give exactly grad_norm_clip's bits.
void grad_sumsq(cudaStream_t s, const void* grads, DType grad_type, std::size_t n, double* sumsq, void* scratch);
void grad_norm_from_sumsq(cudaStream_t s, const double* sumsq, float max_norm, float* norm, float* clip_scale,
                          int* nonfinite, const float* loss_scale = nullptr);

}  // namespace cutrain::kernels
