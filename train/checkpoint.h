// @brief Checkpoints of a training run: DIR/model.safetensors (PyTorch state_dict names, params
// in their real dtype), DIR/optimizer.safetensors ("<name>.master" / ".exp_avg" / ".exp_avg_sq",
// fp32: the bf16 moments of bf16_full are exact in fp32) and DIR/trainer_state.json (step, data
// RNG), each written atomically, the JSON last. Resuming replays the same losses bit for bit.
// The safetensors payloads go through the aio handle or plain buffered I/O (train/checkpoint_io.h:
// `io`, default Auto: CUTRAIN_CHECKPOINT_IO, else aio when a kernel async backend runs); the
// files are byte-identical either way.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <vector>
#include <string>

#include "train/checkpoint_io.h"
#include "train/train_backend.h"

namespace cutrain::train {

struct CheckpointMeta {
  int step = 0;          // the next step to run (0-based)
  std::string data_rng;  // the data generator's state (std::mt19937_64 text form)
};

// The two safetensors files of a state as save_checkpoint writes them: entries viewing `state`
// (and `pbits`, the bf16 params). Keep the state alive while the entries are used.
struct CheckpointTensors {
  std::vector<SafetensorsEntry> model, optim;
  std::vector<std::uint16_t> pbits;
  std::deque<std::string> names;  // the optimizer tensor names (stable addresses)
};
void checkpoint_tensors(const model::TransformerParams& table, const HostState& state, CheckpointTensors& out);
inline const char* kCheckpointModelFile = "model.safetensors";
inline const char* kCheckpointOptimFile = "optimizer.safetensors";

// Under ZeRO (stages 1-3 with a communicator) the backend's save_state() is a collective: every
// rank calls save_checkpoint, and only the one with `write_files` (rank 0) writes DIR; the others
// take part in the gather and return.
void save_checkpoint(const std::filesystem::path& dir, const TrainBackend& backend, const CheckpointMeta& meta,
                     CheckpointIo io = CheckpointIo::Auto, bool write_files = true);
// Loads DIR into `backend` (names and shapes checked against its parameter table).
CheckpointMeta load_checkpoint(const std::filesystem::path& dir, TrainBackend& backend, CheckpointIo io = CheckpointIo::Auto);

}  // namespace cutrain::train
