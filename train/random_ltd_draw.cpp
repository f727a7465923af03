#include "train/random_ltd_draw.h"

#include <algorithm>

#include "runtime/error.h"
#include "train/random_ltd_schedule.h"

namespace cutrain::train {

RandomLtdDraw::RandomLtdDraw(const TrainConfig& c, int B, int S, int num_layers, int rank)
    : cfg_(c.data_efficiency.random_ltd),
      active_(c.data_efficiency.random_ltd_active()),
      seed_(c.data_efficiency.seed),
      B_(B),
      S_(S),
      layers_(num_layers),
      rank_(rank) {}

int RandomLtdDraw::kept(int step, int seq) const {
  if (!active_) return seq;
  return int(random_ltd_kept_at(cfg_, std::max(step - 1, 0), seq));
}

const model::TokenDropPlan& RandomLtdDraw::draw(int step, int micro, int rows, int seq) {
  CUTRAIN_CHECK(rows > 0 && seq > 0 && seq <= S_, "random-LTD draw: micro-batch ", rows, " x ", seq,
                " outside the run's sequence length ", S_);
  if (!active_) {
    plan_ = model::TokenDropPlan{rows, seq, seq, {}, {}};
    return plan_;
  }
  model::draw_token_drop(plan_, seed_, std::max(step - 1, 0), micro, rank_ * rows, rows, seq, kept(step, seq),
                         cfg_.layer_ids);
  return plan_;
}

}  // namespace cutrain::train
