// @brief random-LTD in a training backend: the token selection of each micro-batch of a step, from
// the config's schedule (train/random_ltd_schedule.h) and data_efficiency.seed. The CPU backend and
// the GPU engine both draw through it, so a step drops the same tokens on either device. Under a
// sequence-length curriculum the micro-batch is the step's rows x L, and the kept count applies to
// L: min(schedule, L), no drop when the schedule reaches L (DeepSpeed's rule, random_ltd_kept_at).
#pragma once

#include <cstdint>

#include "model/token_drop_plan.h"
#include "train/config.h"

namespace cutrain::train {

class RandomLtdDraw {
 public:
  // B, S: the run's micro-batch; `rank`: this data-parallel rank (its sequences are rank*rows ..
  // rank*rows+rows-1 of each global micro-batch of `rows` sequences). Inactive (no drop, ever) when
  // the config's random-LTD is off.
  RandomLtdDraw(const TrainConfig& config, int B, int S, int num_layers, int rank);
  bool active() const { return active_; }
  // Kept tokens per sequence at the 1-based step `step` for sequences of `seq` tokens (the run's S
  // by default): min(schedule, seq), `seq` when nothing is dropped.
  int kept(int step) const { return kept(step, S_); }
  int kept(int step, int seq) const;
  // The plan of micro-batch `micro` of the 1-based step `step` at the micro-batch shape rows x seq
  // (the run's B x S by default; inactive when the kept count reaches seq), valid until the next
  // call.
  const model::TokenDropPlan& draw(int step, int micro) { return draw(step, micro, B_, S_); }
  const model::TokenDropPlan& draw(int step, int micro, int rows, int seq);

 private:
  RandomLtdConfig cfg_;
  bool active_;
  std::uint64_t seed_;
  int B_, S_, layers_, rank_;
  model::TokenDropPlan plan_;
};

}  // namespace cutrain::train
