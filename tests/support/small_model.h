// @brief The small transformer the GPU model and engine tests train: hidden 128 with 2 heads
// (head_dim 64, what the attention kernel supports), 2 layers, vocab 1000, batch 2 x 64.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tests/support/test_support.h"
#include "train/cpu_backend.h"

namespace cutrain::test {

inline train::BackendOptions small_model(std::uint64_t seed, int hidden = 128, int heads = 2) {
  train::BackendOptions o;
  o.dims = model::ModelDims{hidden, 2, heads, 1000, 64};
  o.batch = 2;
  o.seq = 64;
  o.seed = seed;
  o.cuda_graph = true;
  return o;
}

// `count` steps of random tokens and labels in [0, vocab), B*S each: tokens[i], labels[i].
struct StepBatches {
  std::vector<std::vector<std::int32_t>> tokens, labels;
};
inline StepBatches random_step_batches(std::mt19937_64& rng, int count, const train::BackendOptions& o) {
  StepBatches b;
  const std::size_t n = std::size_t(o.batch) * o.seq;
  for (int i = 0; i < count; ++i) {
    b.tokens.push_back(random_ints(n, rng, 0, o.dims.vocab - 1));
    b.labels.push_back(random_ints(n, rng, 0, o.dims.vocab - 1));
  }
  return b;
}

}  // namespace cutrain::test
