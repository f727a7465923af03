// @brief PR-MoE's residual mix (DeepSpeed's MoE(use_residual=True)): the MoE output and a dense MLP's
// output beside it, mixed per token by a learned 2-way softmax, c = softmax(x·Wcᵀ + bc):
//   y = c0 · y_moe + c1 · y_mlp
// and its backward. The coefficient logits come from a GEMM (fp32, without the bias: it is added
// here). One block per token; bf16 activations, fp32 math.
#pragma once

#include <cuda_runtime.h>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// y[T,H]; coef[T,2] (fp32) receives c for the backward. logits [T,2] fp32, bias [2] bf16.
void moe_residual_mix_forward(cudaStream_t s, const bf16* y_moe, const bf16* y_mlp, const float* logits,
                              const bf16* bias, bf16* y, float* coef, int tokens, int hidden);

// dy_moe = c0·dy, dy_mlp = c1·dy (bf16 [T,H]); dlogits [T,2] (bf16, the coefficient GEMM's input
// gradient, also its bias gradient summed over tokens) through the softmax of dc_j = <dy, y_j>.
void moe_residual_mix_backward(cudaStream_t s, const bf16* dy, const bf16* y_moe, const bf16* y_mlp,
                               const float* coef, bf16* dy_moe, bf16* dy_mlp, bf16* dlogits, int tokens, int hidden);

}  // namespace cutrain::kernels
