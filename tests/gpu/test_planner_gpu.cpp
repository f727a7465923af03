// The planner's memory prediction (parallel/planner.h: single_gpu_memory) against the single-GPU
// engine: the caching allocator's peak over a few training steps, from before the engine is built,
// must be within 5% of the prediction, at several shapes, precision layouts, accumulation and
// activation checkpointing, and under ZeRO stages 1 and 3 on a one-rank NCCL communicator (the
// engine's partitioned and sharded paths at world size 1: stage 3's full gradient buffer, its shard
// and the two gather buffers); the persistent state within 1% of what the engine allocated for it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>

#include "parallel/planner.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"
#include "train/precision.h"

using namespace cutrain;

namespace {

struct Case {
  const char* name;
  const char* layout;  // baseline | bf16_master_wg | bf16_full
  int hidden, heads, layers, vocab, batch, seq;
  int accumulation = 1;
  bool checkpointing = false;
  int zero_stage = -1;  // -1: no communicator (the single-process engine); else ZeRO on one NCCL rank
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

train::TrainConfig config_for(const Case& c) {
  const std::string text = R"({"train_micro_batch_size_per_gpu": )" + std::to_string(c.batch) +
                           R"(, "gradient_accumulation_steps": )" + std::to_string(c.accumulation) +
                           R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "bf16": {)" +
                           test::bf16_section(c.layout) + R"(}, "zero_optimization": {"stage": )" +
                           std::to_string(std::max(c.zero_stage, 0)) + "}}";
  train::TrainConfig cfg = train::parse_config(text, std::string("test:") + c.name);
  cfg.resolve_batch(1);
  return cfg;
}

parallel::PlanModel plan_for(const Case& c, const train::TrainConfig& cfg) {
  const train::PrecisionPlan p = train::plan_from_config(cfg);
  parallel::PlanModel m;
  m.dims = model::ModelDims{c.hidden, c.layers, c.heads, c.vocab, c.seq};
  m.micro_batch = c.batch;
  m.seq = c.seq;
  m.accumulation = cfg.accumulation();
  m.checkpointing = c.checkpointing;
  m.persistence_threshold = std::size_t(cfg.zero_optimization.stage3_param_persistence_threshold);
  m.state = parallel::StateBytes{p.label(), double(dtype_size(p.param)), double(dtype_size(p.grad)),
                                 p.has_master ? 4.0 : 0.0, 2.0 * double(dtype_size(p.moment)), p.compensation ? 2.0 : 0.0};
  return m;
}

class PlannerGpu : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(PlannerGpu, PredictedPeakWithinFivePercentOfTheAllocators) {
  CUTRAIN_REQUIRE_GPU();
  const Case c = GetParam();
  if (c.zero_stage >= 0 && !comm::nccl_available()) GTEST_SKIP() << "cutrain was built without NCCL";
  const train::TrainConfig cfg = config_for(c);
  train::BackendOptions o;
  o.dims = model::ModelDims{c.hidden, c.layers, c.heads, c.vocab, c.seq};
  o.batch = c.batch;
  o.seq = c.seq;
  o.activation_checkpointing = c.checkpointing;
  o.cuda_graph = true;
  auto rng = test::fresh_rng();
  o.seed = rng();
  if (c.zero_stage >= 0) {
    comm::LaunchEnv env;  // rank 0 of 1: the rendezvous returns at once
    o.comm = std::shared_ptr<comm::Communicator>(comm::Communicator::create(env, /*device=*/0));
  }
  CachingAllocator& A = device_allocator();
  A.empty_cache();  // the engine's buffers from fresh segments, as the prediction assumes
  const std::int64_t before = A.stats().allocated_bytes.current;
  A.reset_peak();
  double peak = 0, state = 0;
  {
    train::GpuEngine eng(o, cfg);
    state = double(eng.state_bytes());
    const std::size_t per_step = std::size_t(c.accumulation) * c.batch * c.seq;
    for (int step = 1; step <= 3; ++step) {
      const auto tokens = test::random_ints(per_step, rng, 0, c.vocab - 1);
      const auto labels = test::random_ints(per_step, rng, 0, c.vocab - 1);
      const train::StepStats st = eng.step(tokens.data(), labels.data(), step, 1e-4f);
      ASSERT_FALSE(st.skipped) << "step " << step;
    }
    peak = double(A.stats().allocated_bytes.peak - before);
  }
  const parallel::PlanModel pm = plan_for(c, cfg);
  const parallel::MemoryBreakdown m =
      c.zero_stage < 0 ? parallel::single_gpu_memory(pm) : parallel::zero_rank_memory(pm, c.zero_stage, 1);
  const double pred_state = m.params + m.grads + m.optimizer;
  EXPECT_NEAR(pred_state, state, 0.01 * state) << c.name << ": the persistent state";
  EXPECT_NEAR(m.total(), peak, 0.05 * peak)
      << c.name << ": predicted " << m.total() << " bytes (state " << pred_state << ", activations " << m.activations
      << ", buffers " << m.buffers << "), allocator peak " << peak << " bytes (state " << state << ")";
  std::printf("[planner] %s: predicted %.1f MiB, measured peak %.1f MiB (%+.2f%%)\n", c.name, m.total() / 1048576.0,
              peak / 1048576.0, 100 * (m.total() - peak) / peak);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PlannerGpu,
    ::testing::Values(Case{"bf16_full_h512_l4", "bf16_full", 512, 8, 4, 8000, 4, 256},
                      Case{"baseline_h512_l4_accum2", "baseline", 512, 8, 4, 8000, 4, 256, 2},
                      Case{"bf16_master_wg_h512_l4_ckpt", "bf16_master_wg", 512, 8, 4, 8000, 4, 256, 1, true},
                      Case{"bf16_full_h1024_l4_b4s512", "bf16_full", 1024, 16, 4, 50000, 4, 512},
                      Case{"baseline_h1024_l6_ckpt_accum2", "baseline", 1024, 16, 6, 50000, 2, 512, 2, true},
                      Case{"bf16_full_h2048_l4_b1s512_ckpt", "bf16_full", 2048, 16, 4, 50000, 1, 512, 1, true},
                      Case{"baseline_h1024_l4_zero1", "baseline", 1024, 16, 4, 50000, 2, 512, 1, false, 1},
                      Case{"bf16_full_h1024_l4_zero3", "bf16_full", 1024, 16, 4, 50000, 2, 512, 1, false, 3},
                      Case{"baseline_h1024_l4_zero3_ckpt_accum2", "baseline", 1024, 16, 4, 50000, 2, 512, 2, true, 3}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });
