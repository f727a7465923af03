// @brief zero_optimization.offload_optimizer for the GPU engine: the optimizer state (exp_avg,
// exp_avg_sq and, where the layout has it, the fp32 master) lives in files under nvme_path
// (device "nvme") or in host memory (device "cpu") between steps, and on the device only around
// the optimizer launch. pipeline_read: the reload starts at the step start and runs during
// forward/backward; the optimizer launch waits for it. pipeline_write: the write-out starts right
// after the optimizer launch and runs while the step finishes (and between steps). Either false:
// a blocking reload right before the optimizer launch / a blocking write right after it.
//
// The swap has its own StateOffloader, whose reloads the engine's CUDA graph does not watch: the
// graph covers forward/backward/norm, which never touch these states, so it is never re-captured
// for the swap.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/offload.h"
#include "train/config.h"

namespace cutrain::train {

class OptimizerSwap {
 public:
  // `states`: (name, buffer) of what is swapped; the buffers come from `alloc` and are used on
  // `stream`. Checks the config (nvme_path an existing folder); the states stay resident until
  // the first swap_out.
  OptimizerSwap(const TrainConfig& config, CachingAllocator& alloc, cudaStream_t stream,
                std::vector<std::pair<std::string, Buffer*>> states);

  // At the step start: with pipeline_read, starts the non-blocking reload.
  void begin_step();
  // Right before the optimizer launch: reloads what is still offloaded (blocking without
  // pipeline_read) and makes `stream` wait for the reloads.
  void before_optimizer();
  // Right after the optimizer launch: writes the states out (non-blocking with pipeline_write).
  void after_optimizer() { swap_out(cfg_.pipeline_write); }
  void swap_out(bool non_blocking);
  // Blocking reload (checkpoints, offload_states): the states are resident and ready on return.
  void make_resident();
  // Waits for I/O in flight and gives released memory back (tests: memory between steps).
  void synchronize() { off_.synchronize(); }

  std::size_t bytes() const;  // the swapped states' bytes
  bool swapped_out() const;   // every state offloaded
  const std::string& describe() const { return describe_; }  // the start-up log line
  StateOffloader& offloader() { return off_; }

 private:
  OffloadConfig cfg_;
  OffloadOptions opts_;
  cudaStream_t stream_;
  std::vector<std::string> names_;
  StateOffloader off_;
  std::string describe_;
};

}  // namespace cutrain::train
