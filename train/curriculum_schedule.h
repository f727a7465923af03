// @brief Curriculum learning's pacing function: the difficulty at a step, as DeepSpeed's
// CurriculumScheduler computes it (deepspeed/runtime/data_pipeline/curriculum_scheduler.py).
//   fixed_linear:   d = floor((s / T) * (max - min) + min), rounded down to a multiple of
//                   difficulty_step, at most max;
//   fixed_root:     the same with (s / T)^(1 / root_degree);
//   fixed_discrete: difficulty[i] for the first i with s <= max_step[i], the last difficulty after.
// The rounding to difficulty_step comes before the clamp to max, as in DeepSpeed: it may go below
// min_difficulty when min is not a multiple of it (min 5, step 8 starts at 0), and a max that is
// not a multiple is reached only past total_curriculum_step (max 100, step 8: 96 until the ratio
// passes 1.04). The config reader accepts both, as DeepSpeed does.
// Stateless: the value depends on the step alone, so a resumed run gets the same difficulties.
#pragma once

#include <cstdint>

#include "train/config_data_efficiency.h"

namespace cutrain::train {

class CurriculumPacing {
 public:
  // `config` as the config reader checked it (ranges, list sizes); checked again here for
  // configs built in code.
  explicit CurriculumPacing(PacingConfig config);
  // The difficulty of step `step` (>= 0; DeepSpeed passes the 1-based step about to run).
  std::int64_t difficulty(std::int64_t step) const;
  const PacingConfig& config() const { return c_; }

 private:
  PacingConfig c_;
};

}  // namespace cutrain::train
