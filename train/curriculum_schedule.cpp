#include "train/curriculum_schedule.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"

namespace cutrain::train {

CurriculumPacing::CurriculumPacing(PacingConfig config) : c_(std::move(config)) {
  CUTRAIN_CHECK(c_.min_difficulty <= c_.max_difficulty, "curriculum pacing: min_difficulty ", c_.min_difficulty,
                " > max_difficulty ", c_.max_difficulty);
  if (c_.type == CurriculumSchedule::FixedDiscrete) {
    CUTRAIN_CHECK(c_.difficulty.size() == c_.max_step.size() + 1, "curriculum pacing: fixed_discrete needs one more "
                  "difficulty than max_step entries, found ", c_.difficulty.size(), " and ", c_.max_step.size());
    for (std::size_t i = 1; i < c_.max_step.size(); ++i)
      CUTRAIN_CHECK(c_.max_step[i] > c_.max_step[i - 1], "curriculum pacing: max_step[", i, "] = ", c_.max_step[i],
                    " is not after max_step[", i - 1, "] = ", c_.max_step[i - 1]);
  } else {
    CUTRAIN_CHECK(c_.total_curriculum_step > 0 && c_.difficulty_step > 0, "curriculum pacing: total_curriculum_step ",
                  c_.total_curriculum_step, " and difficulty_step ", c_.difficulty_step, " must be positive");
    CUTRAIN_CHECK(c_.type == CurriculumSchedule::FixedLinear || c_.root_degree > 0,
                  "curriculum pacing: root_degree must be positive, found ", c_.root_degree);
  }
}

std::int64_t CurriculumPacing::difficulty(std::int64_t step) const {
  CUTRAIN_CHECK(step >= 0, "curriculum pacing: step ", step, " is negative");
  if (c_.type == CurriculumSchedule::FixedDiscrete) {
    for (std::size_t i = 0; i < c_.max_step.size(); ++i)
      if (step <= c_.max_step[i]) return c_.difficulty[i];
    return c_.difficulty.back();
  }
  // Past the end the ratio exceeds 1 and the clamp to max holds it (DeepSpeed does the same).
  const double degree = c_.type == CurriculumSchedule::FixedLinear ? 1.0 : c_.root_degree;
  const double ratio = std::pow(static_cast<double>(step) / static_cast<double>(c_.total_curriculum_step), 1.0 / degree);
  const double span = static_cast<double>(c_.max_difficulty - c_.min_difficulty);
  const double raw = std::floor(ratio * span + static_cast<double>(c_.min_difficulty));
  // Rounded down to a multiple of difficulty_step, raised to the first multiple at or above
  // min_difficulty, then clamped to max (DeepSpeed 0.19.8's order: a min that is not a multiple is
  // never undershot, and a max that is not a multiple is reached only once the ratio passes 1 by a
  // step). Far past the end, clamp before converting.
  if (raw >= static_cast<double>(c_.max_difficulty) + static_cast<double>(c_.difficulty_step)) return c_.max_difficulty;
  auto d = static_cast<std::int64_t>(raw);
  d -= d % c_.difficulty_step;
  const std::int64_t floor_step = (c_.min_difficulty + c_.difficulty_step - 1) / c_.difficulty_step * c_.difficulty_step;
  return std::min(std::max(d, floor_step), c_.max_difficulty);
}

}  // namespace cutrain::train
