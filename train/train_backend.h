// @brief What the training loop needs from a device: one optimizer step over a batch, memory
// statistics, and the training state for checkpoints. The GPU engine and the CPU reference
// backend both implement it, so `cutrain train --device cpu` runs the very same loop.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <optional>
#include <vector>

#include "model/moe_stats.h"
#include "model/transformer_params.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "train/loss_scaler.h"
#include "train/state_snapshot.h"

namespace cutrain::train {

struct MemoryStats {
  std::int64_t allocated = 0, reserved = 0, peak = 0;
};

struct StepStats {
  double loss = 0;       // mean over the micro-batches of this step
  double grad_norm = 0;  // global norm before clipping
  bool skipped = false;  // NaN/Inf gradients (fp16: an overflow): the optimizer changed nothing
  // Each MoE block's routing over the step's micro-batches (empty for a dense model). `loss` is
  // the LM loss; the objective adds moe.loss_coeff times the sum of their l_aux.
  std::vector<model::MoeBlockStats> moe;
  // The tokens this rank's blocks processed over the step's micro-batches (random-LTD's
  // layer_token: a dropping block counts its kept tokens, the others every token).
  std::int64_t layer_tokens = 0;
  // Knowledge distillation (Mixture-of-Students, train/mos_options.h): whether this step distilled,
  // its LM loss (= loss) and its distillation term kd_beta_ce * T^2 * KL(teacher || student), the
  // mean over the step's micro-batches (0 when it did not distill).
  bool distilled = false;
  double ce_loss = 0, kd_loss = 0;
  // fp16: the loss scale this step ran with (0 without fp16) and the next step's (after an
  // overflow: halved, or kept by the hysteresis).
  double loss_scale = 0;
  double next_loss_scale = 0;
};

// The factor the gradients are scaled by before the optimizer: DeepSpeed's gradient clipping to
// `clipping` (0: off) of a step whose global norm is `grad_norm`.
inline double clip_scale(double clipping, double grad_norm) {
  return clipping > 0 ? std::min(1.0, clipping / (grad_norm + 1e-6)) : 1.0;
}

// The whole training state as host fp32 copies, in the flat layout (checkpoints).
struct HostState {
  std::vector<float> params, master, exp_avg, exp_avg_sq;  // master empty when the layout has none
  std::vector<float> compensation;  // the bf16 master's compensation (bf16 values); empty when off
  DType param_dtype = DType::BF16;  // what the params really are (F32 on the CPU backend)
  DType moment_dtype = DType::F32;  // what exp_avg / exp_avg_sq really are (BF16 with bf16_optimizer_states)
};

// A load straight into device memory: scratch buffers for the state's parts that the load fills
// (zeroed first: the flat layout's padding), made the backend's state by commit(). Nothing of the
// state changes before commit(); destroyed without it, the scratch is freed.
class DeviceRestore {
 public:
  enum Part { Params, Master, ExpAvg, ExpAvgSq, Compensation };
  virtual ~DeviceRestore() = default;
  // The part's device buffer (the flat size, in the dtype device_restore was offered), or nullptr
  // for a part the state does not hold (the fp32 master of a layout without one): not to be read.
  virtual void* part(Part p) = 0;
  virtual void commit() = 0;
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
  // The state in its own dtypes, into `out`'s reused storage (checkpoints). A collective under
  // ZeRO, as save_state(). The default goes through save_state().
  virtual void snapshot_state(StateSnapshot& out) const { snapshot_from_host_state(save_state(), out); }
  // The inverse (a checkpoint read into a snapshot): the state becomes the snapshot's. The default
  // goes through load_state().
  virtual void restore_snapshot(const StateSnapshot& s) { load_state(host_state_from_snapshot(s)); }
  // A device restore for a checkpoint whose parts are in these dtypes (master, compensation:
  // nullopt when it has none), when the backend takes them as they are and has the device memory
  // for the scratch; nullptr otherwise (the load goes through restore_snapshot).
  virtual std::unique_ptr<DeviceRestore> device_restore(DType params, std::optional<DType> master, DType moments,
                                                        std::optional<DType> compensation) {
    (void)params, (void)master, (void)moments, (void)compensation;
    return nullptr;
  }
  // A sequence-length curriculum (train/seqlen_curriculum.h): the next steps' micro-batches hold
  // `rows` sequences of `seq` tokens, so step() takes tokens and labels [accumulation, rows, seq].
  // rows x seq must fit the backend's capacity (BackendOptions::max_tokens) and seq its sequence
  // length; the default (a backend without a variable shape) refuses any shape.
  virtual void set_seq_shape(int rows, int seq) {
    CUTRAIN_CHECK(false, "train: a sequence-length curriculum (micro-batches of ", rows, " x ", seq, ") is not built for ",
                  describe());
  }
  // Whether the state holds a bf16 master's compensation (bf16.bf16_master_compensation).
  virtual bool has_compensation() const { return false; }
  // fp16's dynamic loss scaler, for checkpoints: its state (nullopt without one), and the state a
  // resumed run continues from (a backend without a dynamic scaler ignores it and returns false).
  virtual std::optional<LossScalerState> loss_scaler_state() const { return std::nullopt; }
  virtual bool restore_loss_scaler(const LossScalerState& state) {
    (void)state;
    return false;
  }
  // Whether a distillation teacher is still held (Mixture-of-Students: freed at --stop_kd_step).
  virtual bool holds_teacher() const { return false; }
  virtual const char* describe() const = 0;  // "cuda (NVIDIA H200)", "cpu (reference model)"
  // A line for the run's summary from the parallel layout (tensor parallelism: Domino's modelled
  // overlap); empty when there is none.
  virtual std::string run_summary() const { return {}; }
};

}  // namespace cutrain::train
