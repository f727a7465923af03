// The K/V ring of the kernels whose CTA owns a query tile and streams K/V tiles (the forward and
// the dQ pass): the mbarriers after the tiles, q_full[kQBuffers] (the query-side tiles: Q, and dO
// in the dQ pass), q_empty[kQBuffers] (the forward's persistent CTAs hand a Q buffer back),
// k_full[kStages], v_full[kStages], kv_empty[kStages], and their initialization. The ring runs on
// across a persistent CTA's work tiles: its g-th K/V tile goes to stage g % kStages, in phase
// (g / kStages) & 1.
#pragma once

#include <cstdint>

#include "kernels/attention_sm90/wgmma_tma.cuh"

namespace cutrain::kernels::sm90 {

template <class Cfg>
struct QueryTileBarriers {
  static constexpr int kQB = Cfg::kQBuffers;
  std::uint32_t base;
  __device__ __forceinline__ std::uint32_t q_full(int i = 0) const { return base + 8 * i; }
  __device__ __forceinline__ std::uint32_t q_empty(int i) const { return base + 8 * (kQB + i); }
  __device__ __forceinline__ std::uint32_t k_full(int s) const { return base + 8 * (2 * kQB + s); }
  __device__ __forceinline__ std::uint32_t v_full(int s) const { return base + 8 * (2 * kQB + Cfg::kStages + s); }
  __device__ __forceinline__ std::uint32_t kv_empty(int s) const { return base + 8 * (2 * kQB + 2 * Cfg::kStages + s); }
  static __device__ __forceinline__ int stage(int g) { return g % Cfg::kStages; }
  static __device__ __forceinline__ std::uint32_t phase(int g) { return (g / Cfg::kStages) & 1; }

  // By one thread, before the CTA's barrier: one producer arrival fills a stage or a Q buffer (its
  // expected bytes carry the TMA's), every consumer warp releases it.
  __device__ __forceinline__ void init() const {
#pragma unroll
    for (int i = 0; i < kQB; ++i) {
      mbar_init(q_full(i), 1);
      mbar_init(q_empty(i), 4 * Cfg::kConsumers);
    }
#pragma unroll
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(kv_empty(s), 4 * Cfg::kConsumers);
    }
    mbar_init_fence();
  }

  // A consumer warp's release of stage s once its reads (and wgmma) of it are complete: one
  // arrival per warp, after the warp's lanes have met.
  __device__ __forceinline__ void release(int s) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(kv_empty(s));
  }
  // The same for Q buffer i, once the warp's last wgmma reading it is complete.
  __device__ __forceinline__ void release_q(int i) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(q_empty(i));
  }
  // Causal: the tiles [from, to) of a work tile whose first K/V tile was the ring's g0-th, wholly
  // after a warpgroup's rows, hold nothing for it; it still waits for each and releases it, so the
  // ring's phases stay in step.
  __device__ __forceinline__ void skip_tiles(int from, int to, int g0 = 0) const {
    for (int j = from; j < to; ++j) {
      const int s = stage(g0 + j);
      const std::uint32_t ph = phase(g0 + j);
      mbar_wait(k_full(s), ph);
      mbar_wait(v_full(s), ph);
      release(s);
    }
  }
};

}  // namespace cutrain::kernels::sm90
