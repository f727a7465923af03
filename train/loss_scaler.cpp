// @brief fp16 loss scaling (see loss_scaler.h): DeepSpeed's update_scale, step for step.
#include "train/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace cutrain::train {

std::string format_loss_scale(double x) {
  if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9e15) return std::to_string(static_cast<long long>(x));
  return detail::concat(x);
}

LossScalerOptions LossScalerOptions::from_config(const Fp16Config& f) {
  LossScalerOptions o;
  o.dynamic = f.loss_scale == 0.f;
  o.init_scale = o.dynamic ? std::ldexp(1.0, f.initial_scale_power) : double(f.loss_scale);
  o.scale_window = f.loss_scale_window;
  o.min_scale = f.min_loss_scale;
  o.delayed_shift = f.hysteresis;
  o.consecutive_hysteresis = f.consecutive_hysteresis;
  return o;
}

LossScaler::LossScaler(const LossScalerOptions& o) : opt_(o) {
  CUTRAIN_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, "loss scaler: the initial scale must be positive and "
                "finite, got ", o.init_scale);
  CUTRAIN_CHECK(!o.dynamic || (o.scale_window >= 1 && o.delayed_shift >= 1 && o.min_scale > 0),
                "loss scaler: expected loss_scale_window >= 1, hysteresis >= 1 and min_loss_scale > 0, got ",
                o.scale_window, ", ", o.delayed_shift, ", ", o.min_scale);
  state_.scale = o.init_scale;
  state_.hysteresis = o.delayed_shift;
}

void LossScaler::restore(const LossScalerState& s) {
  CUTRAIN_CHECK(std::isfinite(s.scale) && s.scale > 0, "loss scaler state: scale must be positive and finite, got ",
                s.scale);
  CUTRAIN_CHECK(!opt_.dynamic || (s.hysteresis >= 1 && s.hysteresis <= opt_.delayed_shift),
                "loss scaler state: hysteresis ", s.hysteresis, " outside [1, ", opt_.delayed_shift, "]");
  state_ = s;
  overflows_in_a_row_ = 0;
}

LossScaleUpdate LossScaler::update(bool overflow) {
  LossScaleUpdate u;
  u.overflow = overflow;
  u.attempted = state_.scale;
  auto fmt = [](double x) { return detail::concat(static_cast<long long>(x)); };  // DeepSpeed prints int(scale)
  if (!opt_.dynamic) {
    if (overflow) u.message = "OVERFLOW! Skipping step. Gradients are non-finite, weights were not updated.";
  } else if (overflow) {
    ++overflows_in_a_row_;
    if (opt_.delayed_shift == 1 || state_.hysteresis == 1) {
      if (state_.scale == opt_.min_scale)
        throw LossScaleError(
            detail::concat("fp16 loss scaling: the gradients overflowed at loss scale ", state_.scale,
                           ", already fp16.min_loss_scale: the scale cannot go lower, so the run stops (",
                           overflows_in_a_row_, " overflows in a row, at step ", state_.iter,
                           "). The loss or the gradients are inf/NaN at every scale: check the data and the learning "
                           "rate, or lower fp16.min_loss_scale"),
            __FILE__, __LINE__);
      const double next = std::max(state_.scale / 2, opt_.min_scale);
      u.message = "OVERFLOW! Skipping step. Attempted loss scale: " + fmt(state_.scale) + ", reducing to " + fmt(next);
      state_.scale = next;
    } else {
      u.message = "OVERFLOW! Skipping step. Attempted loss scale: " + fmt(state_.scale) + ", but hysteresis is " +
                  std::to_string(state_.hysteresis) + ". Reducing hysteresis to " +
                  std::to_string(state_.hysteresis - 1);
      --state_.hysteresis;
    }
    state_.last_overflow_iter = state_.iter;
  } else {
    overflows_in_a_row_ = 0;
    if (opt_.consecutive_hysteresis) state_.hysteresis = opt_.delayed_shift;
    const std::int64_t stable = state_.iter - state_.last_overflow_iter - 1;
    if (stable > 0 && stable % opt_.scale_window == 0) {
      if (!opt_.consecutive_hysteresis) state_.hysteresis = opt_.delayed_shift;
      state_.scale *= 2;
    }
  }
  ++state_.iter;
  u.scale = state_.scale;
  u.hysteresis = state_.hysteresis;
  return u;
}

}  // namespace cutrain::train
