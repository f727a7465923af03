// @brief The smallest CPU training backend the checkpoint tests save and load: 32 hidden, 2 layers,
// 2 heads, vocab 64, seq 8, batch 2, AdamW.
#pragma once

#include <cstdint>
#include <string>

#include "train/config.h"
#include "train/cpu_backend.h"

namespace cutrain::test {

inline train::BackendOptions tiny_backend(std::uint64_t seed) {
  train::BackendOptions o;
  o.dims = model::ModelDims{32, 2, 2, 64, 8};
  o.batch = 2;
  o.seq = 8;
  o.seed = seed;
  return o;
}

// AdamW at lr 1e-2, weight decay 0.01, micro-batch 2, no accumulation; `origin` names the config
// in its errors.
inline train::TrainConfig tiny_adamw_config(const std::string& origin) {
  train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}})", origin);
  c.resolve_batch(1);
  return c;
}

}  // namespace cutrain::test
