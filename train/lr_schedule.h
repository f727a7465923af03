// @brief DeepSpeed's learning-rate schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR), same
// formulas and same step indexing, so a cutrain run and a DeepSpeed run see the same lr each step.
#pragma once

#include <cstdint>
#include <string>

#include "train/config.h"

namespace cutrain::train {

class LrSchedule {
 public:
  enum class Kind { Constant, WarmupLR, WarmupDecayLR, WarmupCosineLR };

  // Constant optimizer.lr when the config has no scheduler. Defaults follow DeepSpeed's constructors:
  // WarmupLR peaks at the optimizer lr when warmup_max_lr is not given, WarmupDecayLR at 0.001.
  static LrSchedule from_config(const TrainConfig& config);

  // The lr optimizer step `step` (0-based: 0 is the first update) uses. DeepSpeed sets the lr at
  // construction (last_batch_iteration = -1) and steps the scheduler after each optimizer step, so
  // update `step` runs with last_batch_iteration = step - 1: lr(step) == lr_at_iteration(step - 1).
  // `step` counts applied updates: DeepSpeed does not step the scheduler on an fp16 overflow skip.
  float lr(int step) const { return static_cast<float>(lr_at_iteration(step - 1)); }
  // DeepSpeed's get_lr() for a given last_batch_iteration (-1: before the first scheduler step).
  double lr_at_iteration(int last_batch_iteration) const;

  // Megatron-DeepSpeed's token-based decay (--lr-decay-tokens, what DeepSpeed's sequence-length
  // curriculum example runs with: a short-sequence step trains fewer tokens, so it decays the lr
  // less): the warm-up as lr(step), then WarmupDecayLR's linear and WarmupCosineLR's cosine decay
  // over the tokens from `warmup_tokens` (those trained before decay_start_step()) to
  // `decay_tokens` instead of over the steps to total_num_steps; `tokens_before`: the tokens
  // trained before `step`. Constant and WarmupLR have no decay: lr(step).
  float lr_by_tokens(int step, std::int64_t tokens_before, std::int64_t warmup_tokens, std::int64_t decay_tokens) const;
  // The first (0-based) step past the warm-up: its tokens_before is the decay's warmup_tokens.
  int decay_start_step() const { return warmup_steps_ + 1; }
  bool decays() const { return kind_ == Kind::WarmupDecayLR || kind_ == Kind::WarmupCosineLR; }

  Kind kind() const { return kind_; }
  std::string describe() const;

 private:
  double warmup_fraction(int it) const;  // the log or linear ramp, 0 at it = 0
  Kind kind_ = Kind::Constant;
  double base_lr_ = 0;           // optimizer lr (constant; WarmupCosineLR's 1.0 ratio)
  double min_lr_ = 0, max_lr_ = 0;
  int warmup_steps_ = 2;         // DeepSpeed clamps to >= 2 (log(1) would divide by zero)
  bool log_warmup_ = true;
  int total_steps_ = 0;
  double warmup_min_ratio_ = 0, cos_min_ratio_ = 0;
};

}  // namespace cutrain::train
