// CPU tests of the LR schedules against values worked out by hand from DeepSpeed's formulas.
// Indexing: optimizer update `step` (0-based) runs with DeepSpeed's last_batch_iteration = step - 1.
#include <gtest/gtest.h>

#include "train/lr_schedule.h"

using namespace cutrain;

namespace {

train::TrainConfig cfg(const std::string& json) { return train::parse_config(json, "lr_test.json"); }

// Relative tolerance: float lr against a double worked value.
void expect_lr(const train::LrSchedule& s, int step, double want) {
  double got = s.lr(step);
  EXPECT_NEAR(got, want, 1e-6 * std::max(1e-12, std::abs(want)) + 1e-12) << "step " << step << " of " << s.describe();
}

}  // namespace

TEST(LrSchedule, ConstantWithoutScheduler) {
  auto s = train::LrSchedule::from_config(cfg(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"lr": 3e-4}}})"));
  EXPECT_EQ(s.kind(), train::LrSchedule::Kind::Constant);
  for (int step : {0, 1, 7, 100000}) expect_lr(s, step, 3e-4);
}

TEST(LrSchedule, WarmupLrLog) {
  auto s = train::LrSchedule::from_config(cfg(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupLR",
      "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 10}}})"));
  EXPECT_EQ(s.kind(), train::LrSchedule::Kind::WarmupLR);
  expect_lr(s, 0, 0.0);                     // set at construction: warmup_min_lr
  expect_lr(s, 1, 0.0);                     // iteration 0: log(1) / log(10) = 0
  expect_lr(s, 2, 3.0102999566398113e-4);   // log(2) / log(10)
  expect_lr(s, 5, 6.989700043360188e-4);    // log(5) / log(10)
  expect_lr(s, 10, 1e-3);                   // iteration 9: log(10) / log(10)
  expect_lr(s, 11, 1e-3);                   // past warmup: max
  expect_lr(s, 5000, 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at_iteration(-1), 0.0);
}

TEST(LrSchedule, WarmupLrLinearAndDefaults) {
  auto s = train::LrSchedule::from_config(cfg(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupLR",
      "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3, "warmup_num_steps": 4, "warmup_type": "linear"}}})"));
  expect_lr(s, 0, 1e-5);
  expect_lr(s, 1, 1e-5);       // 1e-5 + 0.99e-3 * 0/4
  expect_lr(s, 2, 2.575e-4);   // 1e-5 + 0.99e-3 * 1/4
  expect_lr(s, 4, 7.525e-4);   // 1e-5 + 0.99e-3 * 3/4
  expect_lr(s, 5, 1e-3);
  // warmup_max_lr absent: WarmupLR peaks at the optimizer lr.
  auto d = train::LrSchedule::from_config(cfg(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"lr": 2e-4}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}}})"));
  expect_lr(d, 3, 1e-4);  // 2e-4 * 2/4
  expect_lr(d, 9, 2e-4);
  // warmup_num_steps 1 is clamped to 2 (DeepSpeed: log(1) would divide by zero).
  auto one = train::LrSchedule::from_config(cfg(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupLR",
      "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 1}}})"));
  expect_lr(one, 1, 0.0);   // iteration 0 < 2: log(1) / log(2) = 0
  expect_lr(one, 2, 1e-3);  // iteration 1: log(2) / log(2) = 1
}

TEST(LrSchedule, WarmupDecayLr) {
  auto s = train::LrSchedule::from_config(cfg(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupDecayLR",
      "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 10, "warmup_type": "linear", "total_num_steps": 110}}})"));
  expect_lr(s, 0, 0.0);
  expect_lr(s, 6, 5e-4);    // iteration 5: 5/10
  expect_lr(s, 11, 1e-3);   // iteration 10: (110 - 10) / (110 - 10)
  expect_lr(s, 61, 5e-4);   // iteration 60: (110 - 60) / 100
  expect_lr(s, 101, 1e-4);  // iteration 100: 10 / 100
  expect_lr(s, 111, 0.0);   // iteration 110: 0
  expect_lr(s, 500, 0.0);   // clamped at 0 past the end
  // warmup_max_lr absent: WarmupDecayLR's own default 0.001, not the optimizer lr.
  auto d = train::LrSchedule::from_config(cfg(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"lr": 5e-5}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 20}}})"));
  expect_lr(d, 11, 1e-3);   // iteration 10: gamma (20 - 10) / 10 = 1
  expect_lr(d, 16, 5e-4);   // iteration 15: 5 / 10
}

TEST(LrSchedule, WarmupCosineLr) {
  auto s = train::LrSchedule::from_config(cfg(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"lr": 1e-3}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 110, "warmup_num_steps": 10,
      "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01, "warmup_type": "linear"}}})"));
  EXPECT_EQ(s.kind(), train::LrSchedule::Kind::WarmupCosineLR);
  expect_lr(s, 0, 0.0);                     // DeepSpeed's WarmupCosineLR starts at 0
  expect_lr(s, 1, 1e-4);                    // iteration 0: ratio 0.1
  expect_lr(s, 6, 5.5e-4);                  // iteration 5: 0.1 + 0.9 * 5/10
  expect_lr(s, 10, 9.1e-4);                 // iteration 9: 0.1 + 0.9 * 9/10
  expect_lr(s, 11, 9.997557473810372e-4);   // iteration 10: progress 1/100, 0.01 + 0.99 (1 + cos(0.01 pi)) / 2
  expect_lr(s, 60, 5.05e-4);                // iteration 59: progress 1/2, 0.01 + 0.99 / 2
  expect_lr(s, 110, 1e-5);                  // iteration 109: progress 1, cos_min_ratio
  expect_lr(s, 1000, 1e-5);                 // stays at the floor
  auto log = train::LrSchedule::from_config(cfg(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"lr": 1e-3}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 110, "warmup_num_steps": 10,
      "warmup_min_ratio": 0.1}}})"));
  expect_lr(log, 5, 7.290730039024168e-4);  // iteration 4: 0.1 + 0.9 * log(5) / log(10)
}

TEST(LrSchedule, RejectsHandBuiltNonsense) {
  train::TrainConfig c = cfg(R"({"train_micro_batch_size_per_gpu": 1})");
  c.scheduler.type = train::SchedulerType::WarmupDecayLR;
  c.scheduler.total_num_steps = 0;
  EXPECT_THROW(train::LrSchedule::from_config(c), Error);
}
