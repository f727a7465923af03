// @brief The MoE gate after its logits GEMM: softmax, top-1 / top-2 routing, capacity positions by
// cumulative sum in token order, token dropping, the load-balancing loss and the combine weights
// (DeepSpeed's top1gating / top2gating without noise and without random token selection); and its
// backward into the logits.
//
// Semantics (T tokens, E experts, k routes per token, p = softmax(logits) in fp32):
//  - route 0 of token s is argmax_e p[s,e]; route 1 (k = 2) is argmax of the logits with route 0's
//    expert excluded. Ties go to the lowest expert index. With noise (MoeGateNoise) the arg-maxes
//    read logits + Gumbel(seed, s·E + e) instead (DeepSpeed's RSample for top-1's route 0 and
//    top2_2nd_expert_sampling for top-2's route 1); p stays the clean softmax.
//  - positions: route 0's tokens of expert e are numbered 0, 1, ... in token order; route 1's follow
//    after all of e's route-0 tokens, again in token order. A route is kept when its position is
//    below the capacity, otherwise dropped (position -1, weight 0). kept[e] = min(count[e], capacity).
//  - capacity: with drop_tokens, the caller's (moe_capacity below: DeepSpeed's fp32 product); without,
//    the largest count[e].
//  - l_aux = E · Σ_e me[e]·ce[e], me = mean over tokens of p, ce = fraction of tokens whose route 0
//    is e (before dropping).
//  - weights: k = 1: p[s, e0] when kept; k = 2: the kept routes' p normalized by their sum (clamped
//    below at FLT_EPSILON), so a token with one kept route gets weight 1 there.
// Deterministic: every sum runs in a fixed order, no float atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/counter_uniform.cuh"
#include "runtime/dtype.h"

namespace cutrain::kernels {

constexpr int kMoeMaxExperts = 1024;  // one expert per thread of the gate's scan block

// ceil(k · tokens / experts · capacity_factor), at least min_capacity, in DeepSpeed's arithmetic:
// tokens / experts, k · capacity_factor and their product each rounded to fp32. Errors name bad
// arguments.
int moe_capacity(int tokens, int experts, int k, double capacity_factor, int min_capacity);

// Gumbel noise on the routing decisions (kernels/common/counter_uniform.cuh draws).
struct MoeGateNoise {
  bool rsample = false;          // route 0 of top-1 by argmax(logits + Gumbel)
  bool second_sampling = false;  // route 1 of top-2 by argmax(logits + Gumbel) without route 0's expert
  bool rts = false;              // top-1 with drop_tokens: random token selection over capacity
  std::uint64_t seed = 0;
  // Non-null: the draws use *seed_word ^ seed, read on the device when the kernels run, so a
  // captured CUDA graph draws the noise of the word's value at each replay.
  const std::uint64_t* seed_word = nullptr;
};

__host__ __device__ inline std::uint64_t moe_noise_seed(std::uint64_t seed, const std::uint64_t* seed_word) {
  return seed_word ? *seed_word ^ seed : seed;
}

// The selection key of token s routed to expert e under rts: 24 random bits above the complement
// of the token index (larger keys are kept; equal draws keep the lower token).
__host__ __device__ inline std::uint64_t moe_rts_key(std::uint64_t seed, int s, int e, int experts) {
  const std::uint64_t draw = counter_bits24(seed ^ 0xbb67ae8584caa73bULL, std::uint64_t(s) * experts + e);
  return (draw << 32) | (0xffffffffULL - static_cast<std::uint32_t>(s));
}

struct MoeGateShape {
  int tokens = 0, experts = 0, k = 1;
  bool drop_tokens = true;
  int capacity = 0;  // used with drop_tokens (> 0)
  MoeGateNoise noise{};
};

// Device outputs of the forward. [T,k] arrays are row-major (token s, route r at s·k + r).
struct MoeGateOutputs {
  float* probs = nullptr;               // [T,E] softmax, kept for the backward
  std::int32_t* expert = nullptr;       // [T,k] chosen expert of every route (dropped or not)
  std::int32_t* position = nullptr;     // [T,k] slot within its expert, -1 when dropped
  float* weight = nullptr;              // [T,k] combine weight (0 when dropped)
  std::int32_t* expert_counts = nullptr;  // [E] routes that chose e (before dropping)
  std::int32_t* kept_counts = nullptr;    // [E] routes kept (rows of e in the permuted buffer)
  std::int32_t* offsets = nullptr;        // [E+1] exclusive scan of kept_counts
  float* ce = nullptr;                  // [E] fraction of tokens whose route 0 is e (backward input)
  float* l_aux = nullptr;               // [1]
  std::int32_t* stats = nullptr;        // [2] the capacity used, routes dropped
};

std::size_t moe_gate_workspace_bytes(int tokens, int experts, int k);

// logits [T,E] fp32. `workspace` of moe_gate_workspace_bytes bytes (16-byte aligned).
void moe_gate_forward(cudaStream_t s, const float* logits, const MoeGateShape& shape, const MoeGateOutputs& out,
                      void* workspace);

// dlogits[T,E] (bf16, the input of the gate GEMM's backward) from dweight[T,k] (the loss gradient of
// the combine weights) and aux_grad (of l_aux), through the normalization and the softmax. The
// routing itself (argmax, capacity) has no gradient; ce is a constant of the loss, as in DeepSpeed.
void moe_gate_backward(cudaStream_t s, const float* probs, const std::int32_t* expert, const std::int32_t* position,
                       const float* dweight, const float* ce, float aux_grad, int tokens, int experts, int k,
                       bf16* dlogits);

// A step's routing figures, merged on the device over its forwards so a captured step reads none
// of them on the host (the engine reads them after the step): the sum of l_aux, the forwards
// merged, the last capacity, the routes dropped, the fewest and most rows an expert computed.
struct MoeStepFigures {
  float l_aux_sum = 0;
  std::int32_t forwards = 0, capacity = 0, dropped = 0, min_load = 0, max_load = 0;
};

// Merges one forward's outputs (kept_counts [E], stats [2], l_aux [1], as moe_gate_forward wrote
// them) into *acc; `first`: *acc starts from this forward. One warp, integer min / max: exact.
void moe_step_figures_merge(cudaStream_t s, const std::int32_t* kept_counts, const std::int32_t* stats,
                            const float* l_aux, int experts, MoeStepFigures* acc, bool first);

}  // namespace cutrain::kernels
