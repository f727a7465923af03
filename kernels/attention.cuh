// @brief Flash-style multi-head attention on tensor cores, forward and backward.
// No seq×seq buffer ever reaches global memory; forward keeps only the fp32 log-sum-exp per row.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace cutrain::kernels {

struct AttentionShape {
  int batch = 1, seq = 1, heads = 1, head_dim = 64;  // head_dim 64 or 128 (others: a clear error)
  bool causal = false;
};

// qkv: bf16 [B, S, 3, H, D] (the fused in-projection's output as is: q, k, v for each token);
// out: bf16 [B, S, H, D]; lse: fp32 [B, H, S] (log-sum-exp of the scaled scores, natural log).
// Softmax scale 1/sqrt(D).
void attention_forward(cudaStream_t s, const bf16* qkv, bf16* out, float* lse, const AttentionShape& shape);

// dqkv: bf16 [B, S, 3, H, D] (every element written). `deterministic`: no order-dependent atomics
// (same bits every run). scratch: attention_backward_scratch_bytes(shape, deterministic) bytes,
// 16-byte aligned: fp32 rowsum(dO o O) (4·B·H·S, rounded to 256) and, in the fast mode only, an fp32
// dQ accumulator (4·B·S·H·D) that dQ reaches through atomics. Nothing S x S ever.
// `out` and `lse` must be this forward's outputs for the same qkv.
std::size_t attention_backward_scratch_bytes(const AttentionShape& shape, bool deterministic);
void attention_backward(cudaStream_t s, const bf16* qkv, const bf16* out, const bf16* dout, const float* lse,
                        bf16* dqkv, void* scratch, const AttentionShape& shape, bool deterministic);

// Kernel variants (tile shapes), selectable at run time so one benchmark run can compare them.
// attention_variant_names()[0] is the default. The choice is process-wide and applies to the next
// launch; if attention_set_variant was never called, the environment variable CUTRAIN_ATTN_VARIANT
// (read once, at the first attention call) picks it. Unknown names throw, naming the known ones.
//   v1          fwd: CTA 64 queries, 4 warps x 16 rows, 64-key tiles.   bwd: dK/dV CTA 64 keys (4 warps).
//   v2_m128     fwd: CTA 128 queries, 4 warps x 32 rows, 64-key tiles (D128: 32), Q re-read from shared
//               memory.  bwd: dK/dV CTA 128 keys (8 warps); deterministic dQ CTA 128 queries, 4 x 32 rows.
//   v2_m128n32  fwd: CTA 128 queries, 4 warps x 32 rows, 32-key tiles, Q in registers (D64).  bwd: as v1.
//   v2_m128w8   fwd: CTA 128 queries, 8 warps x 16 rows, 64-key tiles.  bwd: as v2_m128.
//   v2_m128k32  fwd: as v2_m128.  bwd: as v2_m128 but the fast mode's D64 dK/dV: 4 warps x 32 keys.
// (The default is one constant, kDefault in kernels/attention_variant.cu.)
std::vector<std::string> attention_variant_names();
void attention_set_variant(const std::string& name);  // "" = the default
std::string attention_variant();

// Training FLOPs as the benchmarks count them: 4·B·H·S²·D forward, 2.5× that backward, halved causal.
double attention_forward_flops(const AttentionShape& shape);
double attention_backward_flops(const AttentionShape& shape);

}  // namespace cutrain::kernels
