// CPU tests of the training loop's profiling glue: the model-FLOP count, which steps are timed,
// --profile_steps validation, and that nothing CUDA is touched on the CPU backend.
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "runtime/error.h"
#include "runtime/profiler.h"
#include "runtime/timing.h"
#include "tests/support/test_support.h"
#include "train/step_profiler.h"

using namespace cutrain;

TEST(ModelFlops, MatchesTheHandCount) {
  auto rng = test::fresh_rng();
  const int heads = std::uniform_int_distribution<int>(1, 4)(rng);
  const int h = heads * 16 * std::uniform_int_distribution<int>(1, 4)(rng);
  const int L = std::uniform_int_distribution<int>(1, 5)(rng), V = std::uniform_int_distribution<int>(7, 999)(rng);
  const int S = std::uniform_int_distribution<int>(1, 64)(rng), B = std::uniform_int_distribution<int>(1, 4)(rng);
  const int accum = std::uniform_int_distribution<int>(1, 3)(rng);
  model::TransformerParams t(model::ModelDims{h, L, heads, V, S});
  // Per block: in_proj 3h*h+3h, out_proj h*h+h, two LayerNorms 4h, ff 8h*h+5h; head V*h+V.
  const double N = double(L) * (12.0 * h * h + 13.0 * h) + double(V) * h + V;
  const double tokens = double(B) * S * accum;
  std::string formula;
  EXPECT_DOUBLE_EQ(train::model_flops_per_step(t, B, S, accum, false, &formula), (6 * N + 12.0 * L * S * h) * tokens);
  EXPECT_DOUBLE_EQ(train::model_flops_per_step(t, B, S, accum, true), (6 * N + 6.0 * L * S * h) * tokens);
  EXPECT_NE(formula.find("12*L*T*C"), std::string::npos) << formula;
  EXPECT_NE(formula.find("N=" + std::to_string(std::size_t(N))), std::string::npos) << formula;
}

// GPT-2's head is the token embedding (tied): its GEMM counts, as llm.c's N counts wte; the position
// table does not (a lookup).
TEST(ModelFlops, TiedHeadCountsTheEmbeddingOnce) {
  auto rng = test::fresh_rng();
  const int heads = std::uniform_int_distribution<int>(1, 4)(rng);
  const int h = heads * 16 * std::uniform_int_distribution<int>(1, 4)(rng);
  const int L = std::uniform_int_distribution<int>(1, 5)(rng), V = std::uniform_int_distribution<int>(7, 999)(rng);
  const int S = std::uniform_int_distribution<int>(1, 64)(rng);
  model::ModelDims d{h, L, heads, V, S};
  d.arch = model::Arch::Gpt2;
  d.padded_vocab = (V + 63) / 64 * 64;
  model::TransformerParams t(d);
  // Per block as above; the final LayerNorm 2h; the padded token embedding as the head, no bias.
  const double N = double(L) * (12.0 * h * h + 13.0 * h) + 2.0 * h + double(d.padded_vocab) * h;
  std::string formula;
  EXPECT_DOUBLE_EQ(train::model_flops_per_step(t, 2, S, 1, true, &formula), (6 * N + 6.0 * L * S * h) * 2 * S);
  EXPECT_NE(formula.find("N=" + std::to_string(std::size_t(N))), std::string::npos) << formula;
  EXPECT_NE(formula.find("tied head"), std::string::npos) << formula;
}

TEST(StepProfiler, TimesStepsAfterWarmupAndClipsToTheRun) {
  model::TransformerParams t(model::ModelDims{64, 2, 4, 512, 32});
  train::ProfilingOptions o;
  o.timing_report = true;
  o.timing_steps = 5;
  {
    train::StepProfiler p(o, t, 2, 32, 1, false, /*on_gpu=*/false);
    p.set_steps(0, 19, 5);
    EXPECT_EQ(p.timed_first(), 5);
    EXPECT_EQ(p.timed_last(), 9);
    EXPECT_FALSE(p.timing());  // no CUDA events on the CPU backend
  }
  {
    train::StepProfiler p(o, t, 2, 32, 1, false, false);
    p.set_steps(10, 12, 5);  // resumed at 10, 3 steps
    EXPECT_EQ(p.timed_first(), 12);
    EXPECT_EQ(p.timed_last(), 12);
  }
  {
    train::StepProfiler p(o, t, 2, 32, 1, false, false);
    p.set_steps(0, 0, 5);  // one step: time it anyway
    EXPECT_EQ(p.timed_first(), 0);
    EXPECT_EQ(p.timed_last(), 0);
  }
  {
    train::StepProfiler p(o, t, 2, 32, 1, false, false);
    p.set_steps(0, 9, 0);  // no warm-up asked: still skip step 0
    EXPECT_EQ(p.timed_first(), 1);
    EXPECT_EQ(p.timed_last(), 5);
  }
  {
    train::StepProfiler p(o, t, 2, 32, 1, false, false);
    EXPECT_THROW(p.set_steps(5, 4, 0), Error);
  }
  o.timing_steps = 0;
  EXPECT_THROW(train::StepProfiler(o, t, 2, 32, 1, false, false), Error);
}

TEST(StepProfiler, CpuBackendValidatesButIgnoresTheProfilerFlags) {
  model::TransformerParams t(model::ModelDims{64, 2, 4, 512, 32});
  train::ProfilingOptions o;
  o.profile_steps = "3:1";
  EXPECT_THROW(train::StepProfiler(o, t, 2, 32, 1, false, false), Error);
  o.profile_steps = "1:3";
  o.timing_report = true;
  train::StepProfiler p(o, t, 2, 32, 1, false, false);
  p.set_steps(0, 9, 0);
  EXPECT_FALSE(p.window().active());
  for (int s = 0; s <= 9; ++s) {
    p.begin_step(s);  // would throw without a device if it called cudaProfilerStart
    EXPECT_TRUE(graph_replay_allowed());
    EXPECT_FALSE(region_timer().enabled());
    p.end_step(s);
  }
  std::ostringstream out;
  p.finish(out);
  EXPECT_NE(out.str().find("--profile_steps: ignored on the CPU backend"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("--timing_report: no report on the CPU backend"), std::string::npos) << out.str();
}
