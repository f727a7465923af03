// @brief Checkpoints of a training run: one step folder per save under a root DIR (the folder
// protocol in train/checkpoint_store.h, the manifest in train/checkpoint_manifest.h). A step
// folder holds model.safetensors (PyTorch state_dict names, params in their real dtype),
// optimizer.safetensors ("<name>.master" / ".exp_avg" / ".exp_avg_sq", and ".compensation" for a
// compensated bf16 master, in their real dtypes: fp32 master, fp32 moments or bf16 ones with
// bf16_optimizer_states, bf16 compensation), trainer_state.json (step, data RNG, fp16's loss
// scaler), config.json (the
// model's shape, layout and optimizer) and manifest.json, written last. Resuming verifies the manifest first and
// replays the same losses bit for bit. The safetensors payloads go through the aio handle or plain
// buffered I/O (train/checkpoint_io.h: `io`, default Auto: CUTRAIN_CHECKPOINT_IO, else aio when a
// kernel async backend runs); the files are byte-identical either way.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "runtime/aio/aio_handle.h"
#include "runtime/error.h"
#include "train/checkpoint_io.h"
#include "train/checkpoint_manifest.h"
#include "train/choices.h"
#include "train/loss_scaler.h"
#include "train/state_snapshot.h"
#include "train/train_backend.h"

namespace cutrain::train {

struct CheckpointMeta {
  int step = 0;          // steps done = the next step to run (0-based)
  std::string data_rng;  // the data generator's state (std::mt19937_64 text form)
  // For config.json: the precision layout's name (empty: not recorded, not checked on resume) and
  // whether attention is causal.
  std::string layout;
  bool causal = false;
  std::vector<std::string> notes = {};  // load: warnings to print (a compensation started at zero or dropped)
  // For config.json: the optimizer.type whose state optimizer.safetensors holds (empty: not recorded).
  std::string optimizer = {};
  // fp16's dynamic loss scaler (trainer_state.json's "loss_scaler", DeepSpeed's names: cur_scale,
  // cur_iter, last_overflow_iter, cur_hysteresis); absent for a run without fp16.
  std::optional<LossScalerState> loss_scaler = {};
};

// The two safetensors files of a state as a checkpoint holds them: entries viewing `state`'s
// storage, each tensor in its own dtype. Keep the snapshot alive while the entries are used.
struct CheckpointTensors {
  std::vector<SafetensorsEntry> model, optim;
  std::deque<std::string> names;  // the optimizer tensor names (stable addresses)
};
void checkpoint_tensors(const model::TransformerParams& table, const StateSnapshot& state, CheckpointTensors& out);
inline const char* kCheckpointModelFile = "model.safetensors";
inline const char* kCheckpointOptimFile = "optimizer.safetensors";

inline const char* kCheckpointStateFile = "trainer_state.json";
inline const char* kCheckpointConfigFile = "config.json";

// config.json: the model's dimensions and layout, for --resume and for rebuilding the model in
// PyTorch (keys in docs/training.md).
// `moment_dtype`: the dtype of exp_avg / exp_avg_sq in optimizer.safetensors (the master is F32).
nlohmann::json checkpoint_model_config(const model::ModelDims& dims, DType param_dtype, DType moment_dtype,
                                       std::size_t num_params, const std::string& layout, bool causal);
// Refuses (OptimizerMismatchError, naming the file and both types) a resume whose optimizer.type is
// not the one config.json records: the same exp_avg / exp_avg_sq tensors are Adam's moments or
// LAMB's, and continuing one with the other is not the run that was saved. A config.json without
// the key predates Lamb: it was written by Adam or AdamW, and only Lamb is refused.
class OptimizerMismatchError : public Error {
 public:
  using Error::Error;
};
void check_checkpoint_optimizer(const nlohmann::json& config, OptimizerType type, const std::string& where);

// The dimensions a config.json gives (`where` names the file in errors).
model::ModelDims checkpoint_model_dims(const nlohmann::json& config, const std::string& where);

struct CheckpointSaveOptions {
  CheckpointIo io = CheckpointIo::Auto;
  bool write_files = true;  // false: take part in the state's gather only (ZeRO ranks > 0)
  int keep_last = 0;        // > 0: keep the K highest step folders (and the one `latest` names)
  aio::HandleOptions handle = {};  // the aio engine's settings (the config's aio block)
};
struct CheckpointSaveReport {
  std::filesystem::path folder;    // ROOT/global_step<N>; empty where nothing was written
  std::uint64_t bytes = 0;         // every file of the step folder
  std::vector<std::string> notes;  // stale temporaries removed, folders pruned: one line each
};

// Saves a step folder ROOT/global_step<meta.step> and points ROOT/latest at it (atomic as a
// folder: docs/training.md). Under ZeRO (stages 1-3 with a communicator) the backend's
// snapshot_state() is a collective: every rank calls save_checkpoint, and only the one with
// `write_files` (rank 0) writes; the others take part in the gather and return.
CheckpointSaveReport save_checkpoint(const std::filesystem::path& root, const TrainBackend& backend,
                                     const CheckpointMeta& meta, const CheckpointSaveOptions& options = {});
// The writing half of save_checkpoint: a snapshot already taken (of a model with `table`) into
// ROOT/global_step<meta.step>. Touches no device and no backend, so it can run on another thread
// while training goes on (train/checkpoint_writer.h).
CheckpointSaveReport write_checkpoint(const std::filesystem::path& root, const model::TransformerParams& table,
                                      const StateSnapshot& state, const CheckpointMeta& meta,
                                      const CheckpointSaveOptions& options = {});

// A checkpoint found and verified: `path` is a root (its `latest` is followed) or a step folder.
struct OpenedCheckpoint {
  std::filesystem::path folder;
  bool legacy = false;  // the layout before manifests, read only with accept_legacy
  Manifest manifest;    // not for legacy
  std::vector<std::string> notes;  // unlisted files, the legacy warning
  // Files whose checksum load_checkpoint checks as it reads them (open_checkpoint's
  // checksum_on_load: their sizes are checked at open).
  std::vector<std::string> checksum_on_load;
};
// Refuses (cutrain::Error naming the folder, the file, expected and found) a missing folder, a
// `latest` naming a missing folder, a folder without manifest.json, and any file missing, of
// another size or checksum, or of another step. The pre-manifest layout (the three files directly
// in the folder) is refused unless `accept_legacy`, with a message saying how to convert it.
// `checksum_on_load`: the two safetensors files' checksums are left to load_checkpoint, which
// computes them in the same pass as it reads them (a resume reads each file once); a mismatch is
// then refused there, with the same message, before the backend's state changes.
OpenedCheckpoint open_checkpoint(const std::filesystem::path& path, bool accept_legacy = false,
                                 bool checksum_on_load = false);

// Loads a verified checkpoint into `backend` (its shape checked against config.json, names and
// shapes against the parameter table). A backend with a compensated bf16 master loading a
// checkpoint without ".compensation" tensors starts the compensation at zero (the weights are the
// checkpoint's bf16 master exactly), and a checkpoint's compensation is dropped by a backend
// without one: both with a note in the returned meta.
CheckpointMeta load_checkpoint(const OpenedCheckpoint& checkpoint, TrainBackend& backend,
                               CheckpointIo io = CheckpointIo::Auto);
// open_checkpoint(path) + load.
CheckpointMeta load_checkpoint(const std::filesystem::path& path, TrainBackend& backend,
                               CheckpointIo io = CheckpointIo::Auto);

}  // namespace cutrain::train
