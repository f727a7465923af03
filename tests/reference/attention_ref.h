// @brief CPU reference of multi-head attention (fp64 throughout), forward and backward, in the
// layouts of kernels/attention.cuh: qkv [B, S, 3, H, D], out/dout [B, S, H, D], lse [B, H, S].
// Any head_dim works here (the kernels take 64 and 128); softmax scale 1/sqrt(head_dim).
// BERT's options as kernels::AttentionOptions defines them, with the mask in host memory: masked
// keys get P = 0 (a row with no key left: out 0, lse -inf, gradient 0), dropout keeps P[b,h,i,j]
// by the same Philox bits and threshold as the kernels and scales kept ones by 1/(1-p); lse is
// that of the undropped softmax.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention.cuh"

namespace cutrain::ref {

struct AttentionRefOptions {
  std::vector<std::uint8_t> key_mask;  // [B, S], nonzero: the key may be attended; empty: every key
  kernels::DropoutKey dropout{};       // step_ptr must stay null (host)
  float dropout_p = 0.f;
};

// Whether P[b, h, i, j] survives dropout (always, for p = 0): word e % 4 of
// kernels::dropout_bits(dropout, e / 4) >= kernels::dropout_threshold(p), e = ((b*H + h)*S + i)*S + j.
bool attention_dropout_keep(const AttentionRefOptions& options, const kernels::AttentionShape& shape, int b, int h,
                            int i, int j);

// out: [B, S, H, D]; lse: [B, H, S] (natural log of the sum of exp of the scaled scores).
void attention_forward(const std::vector<float>& qkv, const kernels::AttentionShape& shape, std::vector<double>& out,
                       std::vector<double>& lse, const AttentionRefOptions& options = {});

// dqkv: [B, S, 3, H, D]. P is recomputed exactly; Dvec = rowsum(dout o out) uses the `out` given
// (the kernel's own bf16 output, as attention_backward does), so both see the same definition.
void attention_backward(const std::vector<float>& qkv, const std::vector<float>& out, const std::vector<float>& dout,
                        const kernels::AttentionShape& shape, std::vector<double>& dqkv,
                        const AttentionRefOptions& options = {});

}  // namespace cutrain::ref
