// @brief random-LTD in a training backend: the token selection of each micro-batch of a step, from
// the config's schedule (train/random_ltd_schedule.h) and data_efficiency.seed. The CPU backend and the GPU engine both draw through it, so a step
// drops the same tokens on either device.
#pragma once

#include <cstdint>

#include "model/token_drop_plan.h"
#include "train/config.h"

namespace cutrain::train {

class RandomLtdDraw {
 public:
  // B, S: the micro-batch; `rank`: this data-parallel rank (its sequences are rank*B .. rank*B+B-1
  // of each global micro-batch). Inactive (no drop, ever) when the config's random-LTD is off.
  RandomLtdDraw(const TrainConfig& config, int B, int S, int num_layers, int rank);
  bool active() const { return active_; }
  // Kept tokens per sequence at the 1-based step `step` (S when nothing is dropped).
  int kept(int step) const;
  // The plan of micro-batch `micro` of the 1-based step `step` (inactive when kept >= S), valid
  // until the next call.
  const model::TokenDropPlan& draw(int step, int micro);

 private:
  RandomLtdConfig cfg_;
  bool active_;
  std::uint64_t seed_;
  int B_, S_, layers_, rank_;
  model::TokenDropPlan plan_;
};

}  // namespace cutrain::train
