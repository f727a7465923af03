// @brief The small transformer the GPU model and engine tests train: hidden 128 with 2 heads
// (head_dim 64, what the attention kernel supports), 2 layers, vocab 1000, batch 2 x 64.
#pragma once

#include <cstdint>
#include <random>
#include <string>
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

// The config's bf16 section (inside the braces) for a layout's test name: baseline,
// bf16_master_wg, bf16_full, and the compensated bf16_master_wg_comp, bf16_full_comp.
inline std::string bf16_section(const std::string& layout) {
  std::string s = R"("enabled": true)";
  if (layout != "baseline") s += R"(, "bf16_master_weights_and_grads": true)";
  if (layout.rfind("bf16_full", 0) == 0) s += R"(, "bf16_optimizer_states": true)";
  if (layout.size() > 5 && layout.compare(layout.size() - 5, 5, "_comp") == 0) s += R"(, "bf16_master_compensation": true)";
  return s;
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
