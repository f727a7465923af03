// @brief Internal to the attention family: the sm90 (Hopper: wgmma + TMA) attention pair behind
// kernels::attention_forward / attention_backward, with the forward's tile and the backward's schedules as arguments so
// that the tests and bench_attention_hopper can run every schedule; the production entry point
// passes those of production.h's table (production_forward, production_backward).
// Same layouts, options and scratch as kernels/attention.cuh: E (bf16 or f16) qkv [B, S, 3, H, D],
// out and dout [B, S, H, D], fp32 lse [B, H, S] (natural log of the sum of exp of the scores scaled
// by 1/sqrt(D)), dqkv [B, S, 3, H, D]; head_dim 64 or 128, causal or not; BERT's key mask and
// dropout with the semantics of AttentionOptions.
#pragma once

#include <optional>

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention.cuh"
#include "runtime/dtype.h"

namespace cutrain::kernels::attn {
struct OptionArgs;  // kernels/attention_options.cuh
}

namespace cutrain::kernels::sm90 {

// The forward's query tile (fwd.cu): Rows128, two consumer warpgroups of 64 rows; Rows192, three
// (d64 without dropout only: elsewhere it runs Rows128). Same schedule, same results.
enum class FwdTile { Rows128, Rows192 };

// Runs on a compute capability 9.0 device only (the library's attention code is sm_90a); anything
// else is refused with the capability found. Options (dropout_p in [0, 1)), shape and pointers are
// checked before any device work, in that order. No tile: production_forward's (production.h) for
// the shape and the device's SM count.
template <typename E>
void attention_forward(cudaStream_t s, const E* qkv, E* out, float* lse, const AttentionShape& shape,
                       const AttentionOptions& options = {}, std::optional<FwdTile> tile = std::nullopt);

// The host-side checks attention_forward makes before touching the device (throws cutrain::Error
// naming the field): shape (head_dim 64/128, sizes >= 1, grid limits, TMA limits), non-null
// pointers, qkv 16-byte aligned (TMA), out 16-byte aligned (O's 16-byte row stores), lse 4-byte
// aligned.
void check_forward_args(const void* qkv, const void* out, const float* lse, const AttentionShape& shape);

// The dK/dV pass's schedule (bwd.cu). Lockstep: the two warpgroups load their own tiles and end
// every query tile with a CTA barrier. Producer: a third warpgroup
// issues every load and the two consumer warpgroups only compute (setmaxnreg moves the producer's
// registers to them). ProducerOverlap: Producer, and in the deterministic mode each consumer
// issues tile i+1's S^T / dP^T before it waits for tile i's dV / dK products (the fast mode's
// dQ product waits for its tile, so there it runs Producer's loop). d64 only: at d128 both run
// Lockstep's kernel (registers; see bwd.cu's launcher). Same results.
enum class BackwardSchedule { Lockstep, Producer, ProducerOverlap };

// The deterministic mode's dQ pass's consumer loop (dq.cu): Serial waits for each tile's dQ += dS K
// inside the tile; Overlap issues tile j+1's S and dP before it waits for tile j's dQ product (d64
// without options; d128 and the key mask / dropout instances run Serial: see dq.cu). Same results
// (the same products in the same order: the same bits).
enum class DqSchedule { Serial, Overlap };

// dqkv (every element written) from the forward's out and lse for the same qkv and options.
// scratch: attention_backward_scratch_bytes(shape, deterministic) bytes (16-byte aligned):
// Dvec = rowsum(dO o O) by the library's row_dot, then the wgmma dK/dV pass (bwd.cu).
// Fast mode (deterministic false): the pass also adds dS K into the fp32 dQ accumulator behind
// Dvec (TMA reduce-adds; order-dependent: not bitwise reproducible), then the library's dQ
// convert. dqkv: 16-byte aligned (dQ, dK and dV are stored in 16-byte pieces).
// Deterministic: the pass leaves dQ alone and the wgmma dQ pass (dq_pass, dq.cu: one CTA per
// 128 queries, no atomics) computes it with dq_schedule's loop: the same bits every run. Compute
// capability 9.0 only; arguments checked first.
template <typename E>
void attention_backward(cudaStream_t s, const E* qkv, const E* out, const E* dout, const float* lse, E* dqkv,
                        void* scratch, const AttentionShape& shape,
                        BackwardSchedule schedule = BackwardSchedule::Lockstep,
                        const AttentionOptions& options = {}, bool deterministic = false,
                        DqSchedule dq_schedule = DqSchedule::Serial);

// The deterministic mode's dQ pass (dq.cu), run by attention_backward after the dK/dV pass:
// dqkv's q slot = dS K / sqrt(D) with dS = P o (dP - Dvec) (DROP: P o (dP o Z/(1-p) - Dvec)),
// P recomputed from lse; dvec: rowsum(dO o O), fp32 [B, H, S]; `opt`: the forward's key mask and
// dropout. No checks of its own (attention_backward's come first); dq_smem_bytes(head_dim): its
// dynamic shared memory, for check_device.
template <typename E>
void dq_pass(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
             const AttentionShape& shape, const attn::OptionArgs& opt, DqSchedule schedule);
std::uint32_t dq_smem_bytes(int head_dim);

// The host-side checks attention_backward makes first (throws cutrain::Error naming the field):
// the forward's shape checks, non-null pointers, qkv and dout 16-byte aligned (TMA), scratch
// 16-byte aligned, out, dqkv and lse 4-byte aligned.
void check_backward_args(const void* qkv, const void* out, const void* dout, const float* lse, const void* dqkv,
                         const void* scratch, const AttentionShape& shape);

// The 5-D view of qkv [B, S, 3, H, D] each TMA box is cut from, innermost first:
// (d, head, q/k/v slot, token, batch), strides in bytes of dimensions 1..4, and the box: 64
// columns (128 bytes: one 128-byte swizzle span) of `box_rows` tokens of one (slot, head, batch).
// Tokens past S are outside the tensor, so the TMA fills them with zeros per batch.
struct QkvTmaGeometry {
  std::uint64_t dims[5];
  std::uint64_t strides[4];
  std::uint32_t box[5];
};
QkvTmaGeometry qkv_tma_geometry(const AttentionShape& shape, int box_rows);
// The same view of a tensor of `slots` [B, S, H, D] rows per token: 3 is qkv's, 1 is dO's
// ([B, S, H, D]; the slot coordinate is then always 0).
QkvTmaGeometry rows_tma_geometry(const AttentionShape& shape, int slots, int box_rows);

}  // namespace cutrain::kernels::sm90
