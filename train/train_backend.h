// @brief What the training loop needs from a device: one optimizer step over a batch, memory
// statistics, and the training state for checkpoints. The GPU engine and the CPU reference
// backend both implement it, so `cutrain train --device cpu` runs the very same loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/transformer_params.h"
#include "runtime/dtype.h"

namespace cutrain::train {

struct MemoryStats {
  std::int64_t allocated = 0, reserved = 0, peak = 0;
};

struct StepStats {
  double loss = 0;       // mean over the micro-batches of this step
  double grad_norm = 0;  // global norm before clipping
  bool skipped = false;  // NaN/Inf gradients: the optimizer changed nothing
};

// The whole training state as host fp32 copies, in the flat layout (checkpoints).
struct HostState {
  std::vector<float> params, master, exp_avg, exp_avg_sq;  // master empty when the layout has none
  std::vector<float> compensation;  // the bf16 master's compensation (bf16 values); empty when off
  DType param_dtype = DType::BF16;  // what the params really are (F32 on the CPU backend)
};

class TrainBackend {
 public:
  virtual ~TrainBackend() = default;
  virtual const model::TransformerParams& table() const = 0;
  // tokens, labels: host int32 [accumulation, B, S]. `step` is 1-based (Adam bias correction).
  virtual StepStats step(const std::int32_t* tokens, const std::int32_t* labels, int step, float lr) = 0;
  // Evaluation: the mean loss of one micro-batch (tokens, labels: host int32 [B, S]) under the
  // current parameters; no gradient, no optimizer state touched.
  virtual double eval_loss(const std::int32_t* tokens, const std::int32_t* labels) = 0;
  virtual MemoryStats memory() const = 0;
  virtual void reset_peak() = 0;
  // Frees activations and scratch (they come back on the next step): the final allocated figure
  // then counts the training state only, as PyTorch's does once its activations are freed.
  virtual void release_workspace() {}
  virtual HostState save_state() const = 0;
  virtual void load_state(const HostState& state) = 0;
  virtual const char* describe() const = 0;  // "cuda (NVIDIA H200)", "cpu (reference model)"
};

}  // namespace cutrain::train
