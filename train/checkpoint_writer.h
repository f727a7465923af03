// @brief Checkpoint saves that do not stop training for the write. save() takes the state's
// snapshot at the step boundary (device to pinned host memory; a collective under ZeRO) and, in
// async mode, hands it to a background thread that writes the step folder (write_checkpoint:
// through the aio engine, atomic as a folder) while the next steps run. One save is in flight at
// a time: a save while the previous one still writes waits for it first (the wait is reported).
// A failed background write leaves no new step folder (its temp folder is removed, `latest` keeps
// naming the previous complete save) and comes back from take_finished() at the next step. In
// sync mode save() writes before it returns and throws on a failure.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/aio/aio_handle.h"
#include "train/checkpoint.h"

namespace cutrain::train {

struct CheckpointWriterOptions {
  std::filesystem::path root;  // the checkpoint root (--save)
  CheckpointIo io = CheckpointIo::Auto;
  int keep_last = 0;
  bool async = true;
  bool write_files = true;  // false: take part in the snapshot's gather only (ZeRO ranks > 0)
  aio::HandleOptions handle = {};  // the aio engine's settings for the files (the config's aio block)
};

// What one save did.
struct SaveOutcome {
  int step = 0;
  bool background = false;  // written by the background thread
  bool ok = false;
  std::string error;  // when !ok: what failed
  CheckpointSaveReport report;
  double wait_s = 0;        // waiting for the previous save's write before this snapshot
  double snapshot_s = 0;    // the snapshot (training stopped for it)
  double write_s = 0;       // the files, the manifest, the renames
};

class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointWriterOptions options);
  ~CheckpointWriter();  // waits for the write in flight: it ends as a complete save or none
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  const CheckpointWriterOptions& options() const { return opt_; }
  // Snapshots `backend` (every rank calls it under ZeRO) and writes the step folder of `meta`:
  // in the background (async) or now. Sync: a write failure throws cutrain::Error.
  void save(const TrainBackend& backend, const CheckpointMeta& meta);
  bool in_flight() const;  // a background write is running
  void wait();             // until no write is in flight
  // The saves finished since the last call, oldest first (non-blocking).
  std::vector<SaveOutcome> take_finished();
  // Takes a snapshot now, only to allocate its storage (a collective under ZeRO, as save()).
  void prepare(const TrainBackend& backend);
  // The snapshot's host bytes (0 before the first save or prepare) and whether they are pinned.
  std::size_t snapshot_bytes() const { return snap_.bytes(); }
  bool snapshot_pinned() const { return snap_.pinned; }

 private:
  void collect();  // joins a finished worker, its outcome to finished_

  CheckpointWriterOptions opt_;
  StateSnapshot snap_;
  std::optional<model::TransformerParams> table_;  // the model's (from the first save)
  std::thread worker_;
  std::atomic<bool> done_{false};
  SaveOutcome running_;  // the worker's; read after join
  std::vector<SaveOutcome> finished_;
  int device_ = -1;  // the CUDA device the worker uses (the caller's), -1 without a GPU
};

}  // namespace cutrain::train
