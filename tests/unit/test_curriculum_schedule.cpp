// CPU tests of the curriculum pacing function (train/curriculum_schedule.h) against hand-computed
// values of DeepSpeed's formulas, with the rounding and clamping edge cases.
#include <gtest/gtest.h>

#include "runtime/error.h"
#include "train/curriculum_schedule.h"

using namespace cutrain;
using train::CurriculumSchedule;

namespace {

train::PacingConfig root(std::int64_t min, std::int64_t max, std::int64_t total, std::int64_t step, double degree) {
  train::PacingConfig p;
  p.type = degree == 1 ? CurriculumSchedule::FixedLinear : CurriculumSchedule::FixedRoot;
  p.min_difficulty = min, p.max_difficulty = max, p.total_curriculum_step = total, p.difficulty_step = step;
  p.root_degree = degree;
  return p;
}

}  // namespace

TEST(CurriculumPacing, FixedLinearSeqlenWarmup) {
  // min 8, max 1024 over 100 steps in multiples of 8 (DeepSpeed's seqlen example shape).
  const train::CurriculumPacing p(root(8, 1024, 100, 8, 1));
  EXPECT_EQ(p.difficulty(0), 8);      // floor(8) = 8
  EXPECT_EQ(p.difficulty(1), 16);     // floor(0.01 * 1016 + 8) = 18 -> 16
  EXPECT_EQ(p.difficulty(50), 512);   // 516 -> 512
  EXPECT_EQ(p.difficulty(99), 1008);  // floor(1013.84) = 1013 -> 1008
  EXPECT_EQ(p.difficulty(100), 1024);
  EXPECT_EQ(p.difficulty(1000000), 1024);  // clamped past the end
}

TEST(CurriculumPacing, FixedRootGrowsFasterEarly) {
  const train::CurriculumPacing p(root(0, 100, 64, 1, 2));
  EXPECT_EQ(p.difficulty(0), 0);
  EXPECT_EQ(p.difficulty(1), 12);   // sqrt(1/64) = 0.125 -> 12.5 -> 12
  EXPECT_EQ(p.difficulty(4), 25);   // sqrt(1/16)
  EXPECT_EQ(p.difficulty(16), 50);  // sqrt(1/4)
  EXPECT_EQ(p.difficulty(64), 100);
  const train::CurriculumPacing linear(root(0, 100, 64, 1, 1));
  EXPECT_EQ(linear.difficulty(16), 25);
  const train::CurriculumPacing fourth(root(0, 100, 64, 1, 4));
  EXPECT_EQ(fourth.difficulty(4), 50);  // (1/16)^(1/4)
}

TEST(CurriculumPacing, RoundingBeforeTheClampAsDeepSpeed) {
  // min not a multiple of difficulty_step: raised to the first multiple at or above min (DeepSpeed
  // 0.19.8's floor), never below it; here floor(5) -> 0 -> 8, and at step 1 floor(14.5) -> 8.
  const train::CurriculumPacing low(root(5, 100, 10, 8, 1));
  EXPECT_EQ(low.difficulty(0), 8);
  EXPECT_EQ(low.difficulty(1), 8);
  EXPECT_EQ(low.difficulty(2), 24);  // 0.2 x 95 + 5 = 24, a multiple
  // a min that is a multiple is its own floor
  EXPECT_EQ(train::CurriculumPacing(root(16, 100, 10, 8, 2)).difficulty(0), 16);
  // max not a multiple: 96 at the end of the curriculum, max only once the ratio passes 1.04.
  const train::CurriculumPacing p(root(0, 100, 100, 8, 1));
  EXPECT_EQ(p.difficulty(100), 96);
  EXPECT_EQ(p.difficulty(103), 96);
  EXPECT_EQ(p.difficulty(104), 100);
  // min == max: constant.
  const train::CurriculumPacing flat(root(64, 64, 10, 8, 2));
  for (std::int64_t s : {0, 1, 5, 10, 11}) EXPECT_EQ(flat.difficulty(s), 64);
}

TEST(CurriculumPacing, FixedDiscreteSteps) {
  train::PacingConfig c;
  c.type = CurriculumSchedule::FixedDiscrete;
  c.min_difficulty = 1, c.max_difficulty = 3;
  c.difficulty = {1, 2, 3};
  c.max_step = {5, 10};
  const train::CurriculumPacing p(c);
  for (std::int64_t s = 0; s <= 5; ++s) EXPECT_EQ(p.difficulty(s), 1) << s;
  for (std::int64_t s = 6; s <= 10; ++s) EXPECT_EQ(p.difficulty(s), 2) << s;
  EXPECT_EQ(p.difficulty(11), 3);
  EXPECT_EQ(p.difficulty(1 << 30), 3);
  c.difficulty = {7};
  c.max_step = {};
  EXPECT_EQ(train::CurriculumPacing(c).difficulty(0), 7);
}

TEST(CurriculumPacing, BadScheduleBuiltInCodeIsAnError) {
  train::PacingConfig c;
  c.type = CurriculumSchedule::FixedDiscrete;
  c.difficulty = {1, 2};
  c.max_step = {5, 10};
  c.max_difficulty = 2;
  EXPECT_THROW(train::CurriculumPacing{c}, Error);
  c.difficulty = {1, 2, 2};
  c.max_step = {10, 5};
  EXPECT_THROW(train::CurriculumPacing{c}, Error);
  EXPECT_THROW(train::CurriculumPacing{root(0, 10, 0, 1, 1)}, Error);
  EXPECT_THROW(train::CurriculumPacing{root(10, 0, 10, 1, 1)}, Error);
  EXPECT_THROW(train::CurriculumPacing(root(0, 10, 10, 1, 1)).difficulty(-1), Error);
}
