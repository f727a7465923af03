// @brief LayerNorm backward, version 2 (internal to the layernorm family; see layernorm.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "runtime/dtype.h"

namespace cutrain::kernels::detail {

// True when v2 handles this shape: the vector path (caller checks alignment and cols % 8) with
// cols <= 8192 (wider rows need more registers than a 512-thread team has; they run v1).
bool ln_bwd_v2_supported(int cols);
// Bytes of scratch v2 and v3 use for (rows, cols) (fp32 dgamma/dbeta partials).
std::size_t ln_bwd_v2_scratch_bytes(int rows, int cols);
// Runs v2 (main kernel + deterministic finalize), or with `v3` its variant with one vector per
// thread, twice the warps and two rows prefetched (cols <= 4096; wider rows run v2). Arguments
// as layernorm_backward, checked there.
void ln_bwd_v2(cudaStream_t s, const bf16* dy, const bf16* sum, const float* mean, const float* rstd,
               const bf16* gamma, const bf16* d_extra, bf16* d_sum, void* dgamma, void* dbeta, DType param_grad_type,
               bool accumulate, float* partial, int rows, int cols, bool v3);

}  // namespace cutrain::kernels::detail
