// @brief CPU reference of multi-head attention (fp64 throughout), forward and backward, in the
// layouts of kernels/attention.cuh: qkv [B, S, 3, H, D], out/dout [B, S, H, D], lse [B, H, S].
// Any head_dim works here (the kernels take 64 and 128); softmax scale 1/sqrt(head_dim).
#pragma once

#include <vector>

#include "kernels/attention.cuh"

namespace cutrain::ref {

// out: [B, S, H, D]; lse: [B, H, S] (natural log of the sum of exp of the scaled scores).
void attention_forward(const std::vector<float>& qkv, const kernels::AttentionShape& shape, std::vector<double>& out,
                       std::vector<double>& lse);

// dqkv: [B, S, 3, H, D]. P is recomputed exactly; Dvec = rowsum(dout o out) uses the `out` given
// (the kernel's own bf16 output, as attention_backward does), so both see the same definition.
void attention_backward(const std::vector<float>& qkv, const std::vector<float>& out, const std::vector<float>& dout,
                        const kernels::AttentionShape& shape, std::vector<double>& dqkv);

}  // namespace cutrain::ref
