// @brief Issue #24's experiment: a Hopper (sm_90a) attention forward and backward on wgmma + TMA,
// standalone beside the production kernels (kernels/attention.cuh) until they win on the device.
// Same layouts and log-sum-exp convention as kernels::attention_forward / attention_backward:
// qkv bf16 [B, S, 3, H, D], out and dout bf16 [B, S, H, D], lse fp32 [B, H, S] (natural log of the
// sum of exp of the scores scaled by 1/sqrt(D)), dqkv bf16 [B, S, 3, H, D]. head_dim 64 or 128,
// causal or not. BERT's options are kernels::AttentionOptions with the production semantics (key
// mask: a row with no key gets O = 0, lse = -inf, gradient 0; dropout on P from the same Philox
// words for the same (seed, step, layer, element)), so the production forward and this backward,
// or this forward and the production backward, make a consistent pair.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention.cuh"
#include "runtime/dtype.h"

namespace cutrain::bench::hopper {

// The consumer warpgroups' loop (bench/attention_hopper/attention_hopper_fwd.cu): Serial waits for
// each tile's P V before the next tile's S; Overlap issues tile j+1's S behind tile j's P V. Same
// results; the benchmark measures both.
enum class Schedule { Serial, Overlap };

// Runs on a compute capability 9.0 device only (the sm_90a code); anything else is refused with
// the capability found. Shapes, pointers and options (dropout_p in [0, 1)) are checked before any
// device work.
void attention_forward(cudaStream_t s, const bf16* qkv, bf16* out, float* lse, const kernels::AttentionShape& shape,
                       Schedule schedule = Schedule::Serial, const kernels::AttentionOptions& options = {});

// The host-side checks attention_forward makes before touching the device (throws cutrain::Error
// naming the field): shape (head_dim 64/128, sizes >= 1, grid limits, TMA limits), non-null
// pointers, qkv 16-byte aligned (TMA), out and lse 4-byte aligned.
void check_forward_args(const bf16* qkv, const bf16* out, const float* lse, const kernels::AttentionShape& shape);

// dqkv (every element written) from the forward's out and lse for the same qkv and options (either
// forward's: the production one's or this one's), as the production backward's fast mode computes
// it: Dvec = rowsum(dO o O) and dQ through an fp32 accumulator, both
// in `scratch` (kernels::attention_backward_scratch_bytes(shape, false) bytes, the production
// layout; 16-byte aligned), by the production row_dot and dQ-convert passes; dK, dV and the dQ
// accumulation by the wgmma kernel (attention_hopper_bwd.cu). Order-dependent atomics: not
// bitwise reproducible. Compute capability 9.0 only; arguments checked before any device work.
// How the backward's two warpgroups hand a Q / dO ring stage back (attention_hopper_bwd.cu):
// Lockstep ends every query tile with a CTA barrier; Decoupled releases stages through mbarriers,
// so one warpgroup's softmax can overlap the other's wgmma. Same results; the benchmark measures both.
enum class BackwardSchedule { Lockstep, Decoupled };

void attention_backward(cudaStream_t s, const bf16* qkv, const bf16* out, const bf16* dout, const float* lse,
                        bf16* dqkv, void* scratch, const kernels::AttentionShape& shape,
                        BackwardSchedule schedule = BackwardSchedule::Lockstep,
                        const kernels::AttentionOptions& options = {});

// The host-side checks attention_backward makes first (throws cutrain::Error naming the field):
// the forward's shape checks, non-null pointers, qkv and dout 16-byte aligned (TMA), scratch
// 16-byte aligned, out, dqkv and lse 4-byte aligned.
void check_backward_args(const bf16* qkv, const bf16* out, const bf16* dout, const float* lse, const bf16* dqkv,
                         const void* scratch, const kernels::AttentionShape& shape);

// The 5-D view of qkv [B, S, 3, H, D] each TMA box is cut from, innermost first:
// (d, head, q/k/v slot, token, batch), strides in bytes of dimensions 1..4, and the box: 64
// columns (128 bytes: one 128-byte swizzle span) of `box_rows` tokens of one (slot, head, batch).
// Tokens past S are outside the tensor, so the TMA fills them with zeros per batch.
struct QkvTmaGeometry {
  std::uint64_t dims[5];
  std::uint64_t strides[4];
  std::uint32_t box[5];
};
QkvTmaGeometry qkv_tma_geometry(const kernels::AttentionShape& shape, int box_rows);
// The same view of a tensor of `slots` [B, S, H, D] rows per token: 3 is qkv's, 1 is dO's
// ([B, S, H, D]; the slot coordinate is then always 0).
QkvTmaGeometry rows_tma_geometry(const kernels::AttentionShape& shape, int slots, int box_rows);

}  // namespace cutrain::bench::hopper
