// @brief fp16 loss scaling (train/loss_scaler.h) against DeepSpeed's DynamicLossScaler step by
// step (deepspeed/runtime/fp16/loss_scaler.py, update_scale): the options from the fp16 block,
// hysteresis (plain and consecutive), growth after loss_scale_window clean steps counted from the
// last overflow, the floor at min_loss_scale and the error when overflows keep coming there, the
// static scale, the state round trip; and the fp16 block's checks in the config reader.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train/config.h"
#include "train/loss_scaler.h"

namespace cutrain {
namespace {

using train::LossScaler;
using train::LossScalerOptions;

LossScalerOptions opts(double init, int window, double min_scale, int hysteresis, bool consecutive = false) {
  LossScalerOptions o;
  o.init_scale = init;
  o.scale_window = window;
  o.min_scale = min_scale;
  o.delayed_shift = hysteresis;
  o.consecutive_hysteresis = consecutive;
  return o;
}

TEST(LossScaler, OptionsFromTheFp16Block) {
  train::Fp16Config f;  // DeepSpeed's defaults
  LossScalerOptions o = LossScalerOptions::from_config(f);
  EXPECT_TRUE(o.dynamic);
  EXPECT_EQ(o.init_scale, 65536.0);
  EXPECT_EQ(o.scale_window, 1000);
  EXPECT_EQ(o.delayed_shift, 2);
  EXPECT_EQ(o.min_scale, 1.0);
  f.loss_scale = 128.f;
  o = LossScalerOptions::from_config(f);
  EXPECT_FALSE(o.dynamic);
  EXPECT_EQ(o.init_scale, 128.0);
}

// The scale after each update, by hand from DeepSpeed's rule: window 3 from a fresh scaler grows
// on the 4th clean update (stable_interval = iter - last_overflow_iter - 1 = 3 at iter 3).
TEST(LossScaler, GrowsAfterTheWindowOfCleanSteps) {
  LossScaler s(opts(8, 3, 1, 1));
  std::vector<double> got;
  for (int i = 0; i < 8; ++i) got.push_back(s.update(false).scale);
  EXPECT_EQ(got, (std::vector<double>{8, 8, 8, 16, 16, 16, 32, 32}));
}

TEST(LossScaler, HysteresisDelaysTheHalvingAndRefillsOnGrowth) {
  LossScaler s(opts(1024, 2, 1, 2));
  auto u = s.update(true);  // hysteresis 2 -> 1, scale kept
  EXPECT_TRUE(u.overflow);
  EXPECT_EQ(u.scale, 1024);
  EXPECT_EQ(u.hysteresis, 1);
  EXPECT_EQ(u.message, "OVERFLOW! Skipping step. Attempted loss scale: 1024, but hysteresis is 2. Reducing hysteresis to 1");
  u = s.update(true);  // now halves
  EXPECT_EQ(u.scale, 512);
  EXPECT_EQ(u.message, "OVERFLOW! Skipping step. Attempted loss scale: 1024, reducing to 512");
  // Not consecutive: clean steps do not refill the hysteresis until the scale grows.
  EXPECT_EQ(s.update(false).hysteresis, 1);  // iter 2, last overflow 1: stable 0
  EXPECT_EQ(s.update(false).hysteresis, 1);  // stable 1
  u = s.update(false);                       // stable 2 = window: grows, refills
  EXPECT_EQ(u.scale, 1024);
  EXPECT_EQ(u.hysteresis, 2);
  EXPECT_TRUE(u.message.empty());
  // One overflow after the refill costs hysteresis only.
  EXPECT_EQ(s.update(true).scale, 1024);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScaler s(opts(1024, 100, 1, 2, /*consecutive=*/true));
  EXPECT_EQ(s.update(true).hysteresis, 1);
  EXPECT_EQ(s.update(false).hysteresis, 2);  // refilled at once
  EXPECT_EQ(s.update(true).scale, 1024);     // so a single overflow never halves
  EXPECT_EQ(s.update(false).scale, 1024);
  EXPECT_EQ(s.update(true).scale, 1024);
  EXPECT_EQ(s.update(true).scale, 512);      // two in a row do
}

TEST(LossScaler, FloorsAtMinScaleThenStopsTheRunWithAClearError) {
  LossScaler s(opts(12, 1000, 4, 1));
  EXPECT_EQ(s.update(true).scale, 6);
  EXPECT_EQ(s.update(true).scale, 4);  // max(3, min 4)
  try {
    s.update(true);
    ADD_FAILURE() << "no LossScaleError at the minimum scale";
  } catch (const train::LossScaleError& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("overflowed at loss scale 4, already fp16.min_loss_scale"), std::string::npos) << m;
    EXPECT_NE(m.find("3 overflows in a row, at step 2"), std::string::npos) << m;
  }
  // The same from DeepSpeed's defaults: 2^16 halves to 1 in 16 pairs of overflows (hysteresis 2
  // is used up by the first one, never refilled without growth), then the next one stops the run.
  LossScaler d(LossScalerOptions::from_config(train::Fp16Config{}));
  int steps = 0;
  EXPECT_THROW(
      {
        for (;; ++steps) d.update(true);
      },
      train::LossScaleError);
  EXPECT_EQ(steps, 17);  // 1 hysteresis + 16 halvings, the 18th update throws
  EXPECT_EQ(d.loss_scale(), 1.0);
}

TEST(LossScaler, StaticScaleNeverMoves) {
  LossScalerOptions o;
  o.dynamic = false;
  o.init_scale = 128;
  LossScaler s(o);
  for (int i = 0; i < 5; ++i) {
    const auto u = s.update(true);
    EXPECT_EQ(u.scale, 128);
    EXPECT_EQ(u.message, "OVERFLOW! Skipping step. Gradients are non-finite, weights were not updated.");
  }
  for (int i = 0; i < 3000; ++i) EXPECT_EQ(s.update(false).scale, 128);
}

// A restored scaler continues exactly as the one it was saved from.
TEST(LossScaler, StateRoundTripContinuesTheSame) {
  LossScaler a(opts(256, 3, 1, 2)), b(opts(256, 3, 1, 2));
  const bool seq[] = {true, false, true, true, false, false, false, false, true, false, false, false, false};
  for (int i = 0; i < 6; ++i) a.update(seq[i]);
  b.restore(a.state());
  for (int i = 6; i < 13; ++i) {
    const auto x = a.update(seq[i]), y = b.update(seq[i]);
    EXPECT_EQ(x.scale, y.scale);
    EXPECT_EQ(x.hysteresis, y.hysteresis);
  }
  train::LossScalerState bad = a.state();
  bad.hysteresis = 5;
  EXPECT_THROW(b.restore(bad), Error);
  bad = a.state();
  bad.scale = 0;
  EXPECT_THROW(b.restore(bad), Error);
}

// The fp16 block's checks (fp16.enabled: true itself parses: fp16 training exists).
void expect_config_error(const std::string& text, const std::string& part) {
  try {
    train::parse_config(text, "f.json");
    ADD_FAILURE() << "no ConfigError for " << text;
  } catch (const train::ConfigError& e) {
    EXPECT_NE(e.message().find(part), std::string::npos) << e.message();
  }
}

TEST(LossScalerConfig, TheFp16BlockIsChecked) {
  const std::string pre = R"({"train_micro_batch_size_per_gpu": 1, "fp16": )";
  EXPECT_TRUE(train::parse_config(pre + R"({"enabled": true}})", "f.json").fp16.enabled);
  expect_config_error(pre + R"({"min_loss_scale": 0.5}})", "fp16.min_loss_scale");
  expect_config_error(pre + R"({"min_loss_scale": 0}})", "fp16.min_loss_scale");
  expect_config_error(pre + R"({"loss_scale_window": 0}})", "fp16.loss_scale_window");
  expect_config_error(pre + R"({"hysteresis": 0}})", "fp16.hysteresis");
  expect_config_error(pre + R"({"loss_scale": -1}})", "fp16.loss_scale");
  expect_config_error(pre + R"({"initial_scale_power": 64}})", "fp16.initial_scale_power");
  expect_config_error(pre + R"({"initial_scale_power": 2, "min_loss_scale": 8}})",
                      "fp16.initial_scale_power: the dynamic scale starts at 2^2, below min_loss_scale 8");
  const train::TrainConfig c = train::parse_config(
      pre + R"({"enabled": false, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 200,
               "hysteresis": 4, "consecutive_hysteresis": true, "min_loss_scale": 2}})",
      "f.json");
  const LossScalerOptions o = LossScalerOptions::from_config(c.fp16);
  EXPECT_EQ(o.init_scale, 4096);
  EXPECT_EQ(o.scale_window, 200);
  EXPECT_EQ(o.delayed_shift, 4);
  EXPECT_TRUE(o.consecutive_hysteresis);
  EXPECT_EQ(o.min_scale, 2);
}

}  // namespace
}  // namespace cutrain
