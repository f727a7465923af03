#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace cutrain::train {

LrSchedule LrSchedule::from_config(const TrainConfig& config) {
  const SchedulerConfig& s = config.scheduler;
  LrSchedule out;
  out.base_lr_ = config.optimizer.lr;
  if (s.type == SchedulerType::None) return out;
  CUTRAIN_CHECK(s.warmup_num_steps >= 1, "scheduler.params.warmup_num_steps: expected a positive integer, found ",
                s.warmup_num_steps);
  out.warmup_steps_ = std::max(2, s.warmup_num_steps);
  out.log_warmup_ = s.warmup_type == WarmupType::Log;
  out.total_steps_ = s.total_num_steps;
  out.min_lr_ = s.warmup_min_lr;
  switch (s.type) {
    case SchedulerType::None: break;
    case SchedulerType::WarmupLR:
      out.kind_ = Kind::WarmupLR;
      out.max_lr_ = s.warmup_max_lr.value_or(config.optimizer.lr);
      break;
    case SchedulerType::WarmupDecayLR:
      out.kind_ = Kind::WarmupDecayLR;
      out.max_lr_ = s.warmup_max_lr.value_or(0.001f);  // WarmupDecayLR's own default in DeepSpeed
      break;
    case SchedulerType::WarmupCosineLR:
      out.kind_ = Kind::WarmupCosineLR;
      out.warmup_min_ratio_ = s.warmup_min_ratio;
      out.cos_min_ratio_ = s.cos_min_ratio;
      break;
  }
  if (out.kind_ != Kind::WarmupLR)
    CUTRAIN_CHECK(s.total_num_steps >= 1, "scheduler.params.total_num_steps: expected a positive integer for ", name(s.type),
                  ", found ", s.total_num_steps);
  return out;
}

double LrSchedule::warmup_fraction(int it) const {
  if (log_warmup_) return std::log(static_cast<double>(it) + 1.0) / std::log(static_cast<double>(warmup_steps_));
  return static_cast<double>(it) / static_cast<double>(warmup_steps_);
}

double LrSchedule::lr_at_iteration(int it) const {
  switch (kind_) {
    case Kind::Constant: return base_lr_;
    case Kind::WarmupLR:
    case Kind::WarmupDecayLR: {
      if (it < 0) return min_lr_;  // the lr set at construction
      double gamma;
      if (it < warmup_steps_) {
        gamma = warmup_fraction(it);
      } else if (kind_ == Kind::WarmupLR) {
        gamma = 1.0;
      } else {
        gamma = std::max(0.0, static_cast<double>(total_steps_ - it) /
                                  std::max(1.0, static_cast<double>(total_steps_ - warmup_steps_)));
      }
      return min_lr_ + (max_lr_ - min_lr_) * gamma;
    }
    case Kind::WarmupCosineLR: {
      if (it < 0) return 0.0;  // DeepSpeed's WarmupCosineLR starts from lr 0 before its first step
      double ratio;
      if (it < warmup_steps_) {
        ratio = warmup_min_ratio_ + warmup_fraction(it) * (1.0 - warmup_min_ratio_);
      } else {
        // The decay counts from 1 at the first post-warmup iteration and stays at the floor past the end.
        double progress = std::min(1.0, static_cast<double>(it - warmup_steps_ + 1) /
                                            static_cast<double>(std::max(1, total_steps_ - warmup_steps_)));
        double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
        ratio = std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
      }
      return base_lr_ * ratio;
    }
  }
  return base_lr_;
}

float LrSchedule::lr_by_tokens(int step, std::int64_t tokens_before, std::int64_t warmup_tokens,
                               std::int64_t decay_tokens) const {
  const int it = step - 1;
  if (!decays() || it < warmup_steps_) return lr(step);
  CUTRAIN_CHECK(decay_tokens > 0, "lr schedule: decay tokens must be positive, found ", decay_tokens);
  const double span = std::max(1.0, static_cast<double>(decay_tokens - warmup_tokens));
  const double progress = std::clamp(static_cast<double>(tokens_before - warmup_tokens) / span, 0.0, 1.0);
  if (kind_ == Kind::WarmupDecayLR) return static_cast<float>(min_lr_ + (max_lr_ - min_lr_) * (1.0 - progress));
  const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
  return static_cast<float>(base_lr_ * std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine));
}

std::string LrSchedule::describe() const {
  switch (kind_) {
    case Kind::Constant: return detail::concat("constant lr ", base_lr_);
    case Kind::WarmupLR:
      return detail::concat("WarmupLR ", min_lr_, " -> ", max_lr_, " over ", warmup_steps_, " steps (",
                            log_warmup_ ? "log" : "linear", ")");
    case Kind::WarmupDecayLR:
      return detail::concat("WarmupDecayLR ", min_lr_, " -> ", max_lr_, " over ", warmup_steps_, " steps (",
                            log_warmup_ ? "log" : "linear", "), linear to 0 at step ", total_steps_);
    case Kind::WarmupCosineLR:
      return detail::concat("WarmupCosineLR ratio ", warmup_min_ratio_, " -> 1 over ", warmup_steps_, " steps (",
                            log_warmup_ ? "log" : "linear", "), cosine to ", cos_min_ratio_, " at step ", total_steps_,
                            ", times lr ", base_lr_);
  }
  return "?";
}

}  // namespace cutrain::train
