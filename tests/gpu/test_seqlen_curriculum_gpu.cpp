// @brief The sequence-length curriculum on the GPU engine: a ramp over lengths (seqlen_truncate and
// seqlen_reshape, the seed model causal and GPT-2) whose every step equals a step of an engine
// built at that step's shape from the same state and tokens (loss, norm, params); one CUDA graph
// per length, captured once and replayed when the length comes back; no allocation once every
// length has run twice; the validation forward at the whole sequence between curriculum steps.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/allocator.h"
#include "tests/support/cpu_test_util.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"
#include "train/seqlen_curriculum.h"

using namespace cutrain;

namespace {

struct Case {
  const char* name;
  model::Arch arch;
  train::CurriculumMetric metric;
  int accumulation;
};

train::TrainConfig config(int accumulation) {
  train::TrainConfig cfg = train::parse_config(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" +
                                                   std::to_string(accumulation) + R"(, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}, "bf16": {"enabled": true}})",
                                               "test:seqlen");
  cfg.resolve_batch(1);
  return cfg;
}

// The curriculum's rows x L for the small model (B 2, S 64); lengths in multiples of 8 as
// difficulty_step 8 gives them, reshape's odd row counts included.
train::SeqlenCurriculum curriculum(const Case& c, const train::BackendOptions& o) {
  train::PacingConfig p;
  p.min_difficulty = 8;
  p.max_difficulty = o.seq;
  p.total_curriculum_step = 8;
  p.difficulty_step = 8;
  return train::SeqlenCurriculum(c.metric, p, o.batch, o.seq, "test");
}

class SeqlenGpu : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(SeqlenGpu, RampStepsEqualFixedShapeEnginesOneGraphPerLengthNoAllocation) {
  CUTRAIN_REQUIRE_GPU();
  const Case c = GetParam();
  auto rng = test::fresh_rng();
  train::BackendOptions o = test::small_model(rng());
  o.dims.arch = c.arch;
  o.causal = true;
  const train::TrainConfig cfg = config(c.accumulation);
  const train::SeqlenCurriculum cl = curriculum(c, o);
  o.max_tokens = cl.max_tokens();
  train::GpuEngine ramp(o, cfg);
  // One engine per length, built at its shape (workspace exactly rows x L), given the ramp's state
  // before each of its steps.
  std::map<int, std::unique_ptr<train::GpuEngine>> fixed;
  // Each length twice in a row (an eager step, then the capture), then the lengths again in another
  // order: those steps replay, and allocate nothing.
  const std::vector<int> lengths = {8, 8, 24, 24, 40, 40, 64, 64, 8, 40, 24, 64, 8, 8, 64};
  const std::size_t warm = 8;  // steps before every length has run twice
  std::int64_t allocs = -1;
  std::vector<std::int32_t> tok, lab;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const int L = lengths[i], step = int(i) + 1;
    const train::SeqShape sh = cl.shape(L);
    const std::size_t n = std::size_t(c.accumulation) * o.batch * o.seq;
    const auto t = test::random_ints(n, rng, 0, o.dims.vocab - 1), l = test::random_ints(n, rng, 0, o.dims.vocab - 1);
    cl.apply(L, c.accumulation, t.data(), l.data(), tok, lab);
    auto& f = fixed[L];
    if (!f) {
      train::BackendOptions fo = o;
      fo.batch = sh.rows;
      fo.seq = sh.seq;
      fo.max_tokens = 0;
      f = std::make_unique<train::GpuEngine>(fo, cfg);
    }
    f->load_state(ramp.save_state());
    if (i == warm) allocs = device_allocator().stats().allocation.allocated;
    ramp.set_seq_shape(sh.rows, sh.seq);
    const train::StepStats a = ramp.step(tok.data(), lab.data(), step, 1e-3f);
    const std::int64_t after = device_allocator().stats().allocation.allocated;
    const train::StepStats b = f->step(tok.data(), lab.data(), step, 1e-3f);
    SCOPED_TRACE(::testing::Message() << c.name << " step " << step << " L=" << L << " rows=" << sh.rows);
    EXPECT_TRUE(std::isfinite(a.loss));
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    EXPECT_EQ(ramp.download_params(), f->download_params());
    if (i >= warm) {
      EXPECT_EQ(after, allocs) << "the ramp's step allocated after every length had run twice";
      EXPECT_TRUE(ramp.graph_active()) << "the length's graph replays";
      allocs = device_allocator().stats().allocation.allocated;  // the fixed engine's and the checks' own blocks
    }
  }
  // One capture per length (8, 24, 40, 64), none when a length comes back.
  EXPECT_EQ(ramp.graph_captures(), 4);
  EXPECT_EQ(ramp.graph_count(), 4);
  // Validation runs whole samples between curriculum steps: the loss of an engine built at B x S.
  const std::size_t per = std::size_t(o.batch) * o.seq;
  const auto et = test::random_ints(per, rng, 0, o.dims.vocab - 1), el = test::random_ints(per, rng, 0, o.dims.vocab - 1);
  fixed[64]->load_state(ramp.save_state());
  EXPECT_EQ(ramp.eval_loss(et.data(), el.data()), fixed[64]->eval_loss(et.data(), el.data()));
  // A shape the workspace cannot hold is refused, named.
  EXPECT_NE(test::message_of([&] { ramp.set_seq_shape(o.batch, o.seq + 8); }).find("outside the run's sequence length"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Models, SeqlenGpu,
                         ::testing::Values(Case{"causal_truncate", model::Arch::Simple,
                                                train::CurriculumMetric::SeqlenTruncate, 1},
                                           Case{"causal_reshape_accum2", model::Arch::Simple,
                                                train::CurriculumMetric::SeqlenReshape, 2},
                                           Case{"gpt2_truncate_accum2", model::Arch::Gpt2,
                                                train::CurriculumMetric::SeqlenTruncate, 2},
                                           Case{"gpt2_reshape", model::Arch::Gpt2, train::CurriculumMetric::SeqlenReshape,
                                                1}),
                         [](const auto& i) { return std::string(i.param.name); });
