// @brief The small transformer the GPU model/engine tests train: hidden 128 with 2 heads
// (head_dim 64, what the attention kernel supports), 2 layers, vocab 1000, batch 2 x 64.
#pragma once

#include <cstdint>

#include "model/cpu_backend.h"

namespace cutrain::test {

inline model::BackendOptions small_model(std::uint64_t seed, int hidden = 128, int heads = 2) {
  model::BackendOptions o;
  o.dims = model::ModelDims{hidden, 2, heads, 1000, 64};
  o.batch = 2;
  o.seq = 64;
  o.seed = seed;
  o.cuda_graph = true;
  return o;
}

}  // namespace cutrain::test
