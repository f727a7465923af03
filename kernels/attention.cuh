// @brief Flash-style multi-head attention on tensor cores, forward and backward.
// No seq×seq buffer ever reaches global memory; forward keeps only the fp32 log-sum-exp per row.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/philox.cuh"
#include "runtime/dtype.h"

namespace cutrain::kernels {

struct AttentionShape {
  int batch = 1, seq = 1, heads = 1, head_dim = 64;  // head_dim 64 or 128 (others: a clear error)
  bool causal = false;
};

// BERT's attention: a key (padding) mask and dropout on the softmax probabilities. The default
// (no mask, p = 0) is plain attention.
struct AttentionOptions {
  // Device bytes [B, S]: key j of sequence b may be attended where key_mask[b*S + j] != 0; null:
  // every key. A query row none of whose keys may be attended gets out 0, lse -inf, gradient 0.
  const std::uint8_t* key_mask = nullptr;
  // Dropout on the probabilities P (p in [0, 1)): P[b,h,i,j] is kept, scaled by 1/(1-p), where
  // dropout_bits(dropout, e / 4).w[e % 4] >= dropout_threshold(p) (kernels/dropout.cuh), with
  // e = ((b*H + h)*S + i)*S + j; the backward regenerates the same mask. lse stays that of the
  // undropped softmax.
  DropoutKey dropout{};
  float dropout_p = 0.f;
};

// key_mask[i] = tokens[i] != pad_id over [n] tokens (the mask BERT's padded batches attend with).
void attention_key_mask_from_tokens(cudaStream_t s, const std::int32_t* tokens, std::int32_t pad_id,
                                    std::uint8_t* key_mask, std::size_t n);

// E, the element type of qkv, out, dout and dqkv: bf16 or fp16 (instances of both; fp32 softmax and
// accumulation, wgmma with E inputs). The kernels are Hopper's (sm_90a: wgmma, TMA;
// kernels/attention_sm90/): any device but compute capability 9.0 (H100, H200) is refused with the
// capability found, after the argument checks and before any device work.
// qkv: E [B, S, 3, H, D] (the fused in-projection's output as is: q, k, v for each token);
// out: E [B, S, H, D]; lse: fp32 [B, H, S] (log-sum-exp of the scaled scores, natural log).
// Softmax scale 1/sqrt(D).
template <typename E>
void attention_forward(cudaStream_t s, const E* qkv, E* out, float* lse, const AttentionShape& shape,
                       const AttentionOptions& options = {});

// dqkv: E [B, S, 3, H, D] (every element written). `deterministic`: no order-dependent reduce-adds
// (same bits every run); without it, the shapes where the deterministic algorithm is the faster
// still run it (d128 below S 1024: attention_backward_adds_dq, kernels/attention_sm90/production.h).
// scratch: attention_backward_scratch_bytes(shape, deterministic) bytes, 16-byte aligned: fp32
// rowsum(dO o O) (4·B·H·S, rounded to 256) and, deterministic false, room for an fp32 dQ
// accumulator (4·B·S·H·D) that the one-pass algorithm adds into by TMA reduce-adds. Nothing S x S ever.
// `out` and `lse` must be this forward's outputs for the same qkv and options.
std::size_t attention_backward_scratch_bytes(const AttentionShape& shape, bool deterministic);
template <typename E>
void attention_backward(cudaStream_t s, const E* qkv, const E* out, const E* dout, const float* lse,
                        E* dqkv, void* scratch, const AttentionShape& shape, bool deterministic,
                        const AttentionOptions& options = {});

// Whether attention_backward at this shape with `deterministic` false adds dQ by order-dependent
// fp32 reduce-adds (not bit-reproducible run to run); false where it runs the deterministic
// algorithm anyway.
bool attention_backward_adds_dq(const AttentionShape& shape);

// Training FLOPs as the benchmarks count them: 4·B·H·S²·D forward, 2.5× that backward, halved causal.
double attention_forward_flops(const AttentionShape& shape);
double attention_backward_flops(const AttentionShape& shape);

}  // namespace cutrain::kernels
