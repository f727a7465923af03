// @brief The training data loader: a BatchSampler run on a background thread into two host
// buffers the caller owns (pinned memory from the training binary, plain vectors in tests), so
// batch s+1 is being read while batch s is used.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

#include "data/batch_sampler.h"

namespace cutrain::data {

// Two slots, each with inputs and targets of B*T int32. Owned by the caller; must outlive the loader.
struct HostBatchBuffers {
  int32_t* inputs[2] = {nullptr, nullptr};
  int32_t* targets[2] = {nullptr, nullptr};
};

struct Batch {
  const int32_t* inputs;   // [B, T]
  const int32_t* targets;  // [B, T]
  int64_t step;            // first_step, first_step + 1, ... since construction or reset()
  int64_t epoch;           // step / batches_per_epoch
};

class DataLoader {
 public:
  // `first_step`: the first batch handed out (a resumed run continues the same stream).
  DataLoader(SamplerOptions options, HostBatchBuffers buffers, int64_t first_step = 0);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch. Its buffers stay valid and untouched until the next call to next() or reset():
  // a caller copying them to the device asynchronously must wait for that copy before calling
  // next() again. Errors of the background thread are rethrown here.
  Batch next();
  // Back to step `first_step` (same order: eval loops call this before each evaluation).
  void reset(int64_t first_step = 0);

  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  int64_t num_tokens() const { return sampler_.num_tokens(); }
  const SamplerOptions& options() const { return sampler_.options(); }

 private:
  void start();
  void stop();
  void produce();

  BatchSampler sampler_;
  HostBatchBuffers buffers_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool ready_[2] = {false, false};  // slot holds a filled batch not yet handed out
  int held_ = -1;                   // slot handed out by the last next(), or -1
  bool stop_ = false;
  int64_t next_fill_ = 0;     // producer: next step to fill
  int64_t next_consume_ = 0;  // consumer: next step to hand out
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace cutrain::data
