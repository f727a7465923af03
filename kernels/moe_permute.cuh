// @brief MoE token permutation: tokens into the expert-contiguous buffer (by expert, then position),
// and back with the combine weights; both with their backward.
//
// The routing comes from kernels/moe_gate: expert[T,k], position[T,k] (-1: dropped) and
// offsets[E+1]. Route (s, r) that is kept owns row offsets[expert] + position of the permuted
// buffer, which has offsets[E] rows, every one owned by exactly one route. Or, with `slots` > 0
// (the capacity C under token dropping), the slot layout [E, C]: route (s, r) owns row
// expert · C + position, whatever the counts, so every shape is fixed on the host and the
// expert GEMMs run as one strided batch over [E, C] rows; the rows no route owns (an expert's
// slots from kept[e] to C) are zeroed by moe_zero_empty_slots. Activations bf16 [.,H], fp32
// accumulation. Each token gathers or scatters only its own rows: no atomics, deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/dtype.h"

namespace cutrain::kernels {

struct MoeRouting {
  const std::int32_t* expert = nullptr;    // [T,k]
  const std::int32_t* position = nullptr;  // [T,k]
  const std::int32_t* offsets = nullptr;   // [E+1] (not read with slots)
  int tokens = 0, k = 1;
  int slots = 0;  // > 0: the slot layout, row = expert · slots + position
};

// xp[row(s,r)] = x[s] for every kept route.
void moe_permute(cudaStream_t s, const bf16* x, const MoeRouting& rt, bf16* xp, int hidden);

// dx[s] = Σ_kept r dxp[row(s,r)] (+ dx when accumulate); a token with no kept route gets 0 (+ dx).
void moe_permute_backward(cudaStream_t s, const bf16* dxp, const MoeRouting& rt, bf16* dx, int hidden,
                          bool accumulate);

// y[s] = Σ_kept r weight[s,r] · yp[row(s,r)] (0 for a token with no kept route).
void moe_unpermute(cudaStream_t s, const bf16* yp, const float* weight, const MoeRouting& rt, bf16* y, int hidden);

// dyp[row(s,r)] = weight[s,r] · dy[s]; dweight[s,r] = <dy[s], yp[row(s,r)]> (0 when dropped).
void moe_unpermute_backward(cudaStream_t s, const bf16* dy, const bf16* yp, const float* weight,
                            const MoeRouting& rt, bf16* dyp, float* dweight, int hidden);

// The slot layout's empty rows: buf[e·C + j, 0:width] = 0 for kept[e] <= j < C (kept: the
// gate's device counts [E], each at most C). A row the routing owns is not touched.
void moe_zero_empty_slots(cudaStream_t s, bf16* buf, const std::int32_t* kept, int experts, int capacity, int width);

}  // namespace cutrain::kernels
