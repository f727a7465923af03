// The K/V ring of the kernels whose CTA owns a query tile and streams K/V tiles (the forward and
// the dQ pass): the mbarriers after the tiles, q_full (the query-side tiles: Q, and dO in the dQ
// pass), k_full[kStages], v_full[kStages], kv_empty[kStages], and their initialization.
#pragma once

#include <cstdint>

#include "kernels/attention_sm90/wgmma_tma.cuh"

namespace cutrain::kernels::sm90 {

template <class Cfg>
struct QueryTileBarriers {
  std::uint32_t base;
  __device__ __forceinline__ std::uint32_t q_full() const { return base; }
  __device__ __forceinline__ std::uint32_t k_full(int s) const { return base + 8 * (1 + s); }
  __device__ __forceinline__ std::uint32_t v_full(int s) const { return base + 8 * (1 + Cfg::kStages + s); }
  __device__ __forceinline__ std::uint32_t kv_empty(int s) const { return base + 8 * (1 + 2 * Cfg::kStages + s); }

  // By one thread, before the CTA's barrier: one producer arrival fills a stage (its expected bytes
  // carry the TMA's), every consumer warp releases it.
  __device__ __forceinline__ void init() const {
    mbar_init(q_full(), 1);
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
  // Causal: the tiles [from, to) wholly after a warpgroup's rows hold nothing for it; it still
  // waits for each and releases it, so the ring's phases stay in step.
  __device__ __forceinline__ void skip_tiles(int from, int to) const {
    for (int j = from; j < to; ++j) {
      const int s = j % Cfg::kStages;
      const std::uint32_t phase = (j / Cfg::kStages) & 1;
      mbar_wait(k_full(s), phase);
      mbar_wait(v_full(s), phase);
      release(s);
    }
  }
};

}  // namespace cutrain::kernels::sm90
