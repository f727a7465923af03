// @brief The smallest CPU training backend the checkpoint tests save and load: 32 hidden, 2 layers,
// 2 heads, vocab 64, seq 8, batch 2, AdamW; and the training loop's options of that size.
#pragma once

#include <cstdint>
#include <string>

#include "train/config.h"
#include "train/cpu_backend.h"
#include "train/train_loop.h"

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

// `cutrain train` on the CPU backend at the same model size (baseline config, 6 steps, lr 3e-3,
// every step logged): the training-loop tests' run.
inline train::TrainOptions tiny_train_options(std::uint64_t seed) {
  train::TrainOptions o;
  o.deepspeed_config = "configs/baseline.json";
  o.hidden_dim = 32, o.num_layers = 2, o.num_heads = 2, o.vocab_size = 64;
  o.batch_size = 2, o.seq_length = 8, o.num_steps = 6, o.warmup_steps = 1, o.log_interval = 1;
  o.device = train::TrainDevice::Cpu;
  o.seed = seed;
  o.learning_rate = 3e-3f;
  return o;
}

}  // namespace cutrain::test
