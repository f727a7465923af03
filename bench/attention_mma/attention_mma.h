// @brief The mma.sync attention pair (FlashAttention-2's schedule on mma.sync.m16n8k16) that was the
// production kernel before the sm90 pair (kernels/attention_sm90/) replaced it: kept here only as
// bench_attention_hopper's baseline, so the sm90 pair's speedup stays measurable. Same API,
// layouts, options and scratch as kernels::attention_forward / attention_backward; compiled for the
// build's architectures (no sm_90a code). row_dot and the dQ convert are the library's
// (kernels/attention_tiles.cuh); the forward, the dK/dV pass and the deterministic mode's dQ pass
// live here.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention.cuh"
#include "runtime/dtype.h"

namespace cutrain::kernels::attn {
struct OptionArgs;
}

namespace cutrain::bench::mma_attention {

template <typename E>
void attention_forward(cudaStream_t s, const E* qkv, E* out, float* lse, const kernels::AttentionShape& shape,
                       const kernels::AttentionOptions& options = {});

// scratch: kernels::attention_backward_scratch_bytes(shape, deterministic) bytes, the production layout.
template <typename E>
void attention_backward(cudaStream_t s, const E* qkv, const E* out, const E* dout, const float* lse, E* dqkv,
                        void* scratch, const kernels::AttentionShape& shape, bool deterministic,
                        const kernels::AttentionOptions& options = {});

// The dK/dV pass (attention_mma_dkdv.cu): dqkv's k and v slots; with a non-null dq_acc (the fast
// mode) it also adds dS K, unscaled, into that fp32 [B, S, H, D] accumulator with atomics.
template <typename E>
void dkdv(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv, float* dq_acc,
          const kernels::AttentionShape& shape, const kernels::attn::OptionArgs& opt);

// The deterministic mode's dQ pass (attention_mma_dq.cu): dqkv's q slot = dS K / sqrt(D), no atomics.
template <typename E>
void dq(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
        const kernels::AttentionShape& shape, const kernels::attn::OptionArgs& opt);

}  // namespace cutrain::bench::mma_attention
