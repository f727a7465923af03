// @brief fp16 loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py): a
// static scale (fp16.loss_scale > 0), or the dynamic scaler (loss_scale 0) that halves the scale on
// an overflow once its hysteresis is used up, doubles it after loss_scale_window clean steps, and
// stops the run (LossScaleError) when an overflow comes at min_loss_scale. Pure: no device, no
// training step; the caller (the GPU engine's fp16 step, train/engine.h) skips the step on an
// overflow and logs it.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/error.h"
#include "train/config.h"

namespace cutrain::train {

// An overflow at the minimum loss scale: the scale cannot go lower, so the run stops.
class LossScaleError : public Error {
 public:
  using Error::Error;
};

struct LossScalerOptions {
  bool dynamic = true;
  double init_scale = 65536;  // dynamic: 2^initial_scale_power; static: loss_scale
  int scale_window = 1000;     // clean steps (since the last overflow) per doubling
  double min_scale = 1;
  int delayed_shift = 2;       // hysteresis: overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;  // refill the hysteresis on every clean step (else on a doubling)
  // From the config's fp16 section (DeepSpeed's dynamic_loss_scale_args): dynamic when loss_scale is 0.
  static LossScalerOptions from_config(const Fp16Config& fp16);
};

// What one update did.
struct LossScaleUpdate {
  bool overflow = false;
  double attempted = 0;  // the scale the step ran with
  double scale = 0;      // the scale of the next step
  int hysteresis = 0;    // what is left of it
  std::string message;   // the log line of an overflow ("" on a clean step)
};

// The scaler's state, for checkpoints: DeepSpeed's cur_iter, last_overflow_iter, cur_scale,
// cur_hysteresis.
struct LossScalerState {
  std::int64_t iter = 0, last_overflow_iter = -1;
  double scale = 0;
  int hysteresis = 0;
};

// A scale as the logs print it: an integer (1073741824, not 1.07374e+09) when it is one.
std::string format_loss_scale(double scale);

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options);
  double loss_scale() const { return state_.scale; }
  bool dynamic() const { return opt_.dynamic; }
  const LossScalerOptions& options() const { return opt_; }
  // After a step's gradients were checked: `overflow` when any is inf/NaN (the step is skipped).
  // Throws LossScaleError (dynamic, an overflow when the scale already is min_scale and the
  // hysteresis is used up).
  LossScaleUpdate update(bool overflow);
  const LossScalerState& state() const { return state_; }
  void restore(const LossScalerState& s);  // checks the scale (positive, finite) and the hysteresis

 private:
  LossScalerOptions opt_;
  LossScalerState state_;
  int overflows_in_a_row_ = 0;
};

}  // namespace cutrain::train
