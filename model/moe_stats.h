// @brief What the MoE layers of a model routed in one step (the metrics' per-layer figures), the
// same for the CPU reference model and the GPU model, and the seed of a forward's gate noise.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace cutrain::model {

struct MoeBlockStats {
  int layer = 0;       // the block
  double l_aux = 0;    // the load-balancing loss (mean over the step's micro-batches)
  int capacity = 0;    // per expert, of the last micro-batch
  long dropped = 0;    // routes over capacity, summed over the micro-batches
  int min_load = 0, max_load = 0;  // rows an expert computed: min / max over experts and micro-batches
};

// One micro-batch's figures into a step's (`n`: micro-batches merged so far, 0 for the first).
inline void merge_moe_stats(MoeBlockStats& acc, const MoeBlockStats& m, int n) {
  if (n == 0) {
    acc = m;
    return;
  }
  acc.l_aux = (acc.l_aux * n + m.l_aux) / (n + 1);
  acc.capacity = m.capacity;
  acc.dropped += m.dropped;
  acc.min_load = std::min(acc.min_load, m.min_load);
  acc.max_load = std::max(acc.max_load, m.max_load);
}

// The gate noise's seed of one micro-batch's forward: a function of the run's seed, the step and
// the micro-batch, so a resumed run routes as the uninterrupted one.
inline std::uint64_t moe_forward_seed(std::uint64_t seed, int step, int micro) {
  return (seed + 0x9E3779B97F4A7C15ull * std::uint64_t(step)) ^ (0xBF58476D1CE4E5B9ull * std::uint64_t(micro + 1));
}

}  // namespace cutrain::model
