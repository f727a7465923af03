// @brief Checkpoints of a training run: DIR/model.safetensors (PyTorch state_dict names, params
// in their real dtype), DIR/optimizer.safetensors ("<name>.master" / ".exp_avg" / ".exp_avg_sq",
// fp32: the bf16 moments of bf16_full are exact in fp32) and DIR/trainer_state.json (step, data
// RNG), each written atomically, the JSON last. Resuming replays the same losses bit for bit.
#pragma once

#include <filesystem>
#include <string>

#include "model/train_backend.h"

namespace cutrain::model {

struct CheckpointMeta {
  int step = 0;          // the next step to run (0-based)
  std::string data_rng;  // the data generator's state (std::mt19937_64 text form)
};

void save_checkpoint(const std::filesystem::path& dir, const TrainBackend& backend, const CheckpointMeta& meta);
// Loads DIR into `backend` (names and shapes checked against its parameter table).
CheckpointMeta load_checkpoint(const std::filesystem::path& dir, TrainBackend& backend);

}  // namespace cutrain::model
