#include "train/random_ltd_draw.h"

#include <algorithm>

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

int RandomLtdDraw::kept(int step) const {
  if (!active_) return S_;
  return int(std::min<std::int64_t>(random_ltd_kept(cfg_, std::max(step - 1, 0)), S_));
}

const model::TokenDropPlan& RandomLtdDraw::draw(int step, int micro) {
  if (!active_) {
    plan_ = model::TokenDropPlan{B_, S_, S_, {}, {}};
    return plan_;
  }
  model::draw_token_drop(plan_, seed_, std::max(step - 1, 0), micro, rank_ * B_, B_, S_, kept(step), cfg_.layer_ids);
  return plan_;
}

}  // namespace cutrain::train
