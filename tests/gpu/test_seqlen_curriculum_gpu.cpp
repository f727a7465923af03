// @brief The sequence-length curriculum on the GPU engine: a ramp over lengths (seqlen_truncate and
// seqlen_reshape, the seed model causal and GPT-2) whose every step equals a step of an engine
// built at that step's shape from the same state and tokens (loss, norm, params); one CUDA graph
// per length, captured once and replayed when the length comes back; no allocation once every
// length has run twice; the validation forward at the whole sequence between curriculum steps.
// BERT's padding to the longest sequence (issue #20) through the same per-length graphs.
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
#include "train/bert_options.h"
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
  // Each length twice in a row (the run's first step eager, then each length captured at its first
  // step), then the lengths again in another order: those steps replay, and allocate nothing.
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
    if (i >= 1) EXPECT_TRUE(ramp.graph_active()) << "a new length is captured at its first step";
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

// Issue #20's padding to the longest sequence on the engine: BERT (dropout off: its masks are
// keyed by the layout) with each step's [PAD]-padded micro-batches cut to the longest sample
// rounded up to 16 follows an engine that trains the full length (the key mask hides the [PAD]
// keys, the loss is over the labelled rows), one graph per padded length, no allocation once every
// length has run twice.
TEST(SeqlenGpuBert, PaddedToLongestFollowsTheFullLengthOneGraphPerLength) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  train::BackendOptions o = test::small_model(rng());
  o.dims.arch = model::Arch::Bert;
  o.dims.intermediate = 256;
  o.dims.bert.pre_layer_norm = true;
  o.dims.bert.attn_dropout_ratio = 0.f;
  o.dims.bert.hidden_dropout_ratio = 0.f;
  o.dims.bert.mask_id = 998;
  o.dims.bert.pad_id = 999;
  o.max_predictions = 8;
  const train::TrainConfig cfg = config(2);
  train::GpuEngine full(o, cfg), padded(o, cfg);
  const int B = o.batch, S = o.seq, accum = 2, bucket = 16;
  const std::vector<int> longest = {10, 12, 30, 20, 64, 50, 5, 28, 60, 16, 62};
  std::vector<std::int32_t> ct, cl;
  std::int64_t allocs = -1;
  std::map<int, int> seen;
  for (std::size_t i = 0; i < longest.size(); ++i) {
    const int step = int(i) + 1;
    std::vector<std::int32_t> t(std::size_t(accum) * B * S, 999), l(t.size(), -100);
    for (int r = 0; r < accum * B; ++r) {
      const int len = r == 1 ? longest[i] : 1 + int(rng() % std::uint64_t(longest[i]));
      for (int j = 0; j < len; ++j) {
        t[std::size_t(r) * S + j] = std::int32_t(rng() % 998);
        if (j % 9 == 4) l[std::size_t(r) * S + j] = std::int32_t(rng() % 998);  // at most 7 per row (max_pred 8)
      }
    }
    const int L = train::bert_padded_length(longest[i], bucket, o.max_predictions, S);
    train::rebuild_micro_batches(train::CurriculumMetric::SeqlenTruncate, B, S, L, accum, t.data(), l.data(), ct, cl);
    // Lengths 16, 32, 64 each run twice by step 6 (16, 16, 32, 32, 64, 64): from then on no allocation.
    if (i == 6) allocs = device_allocator().stats().allocation.allocated;
    padded.set_seq_shape(B, L);
    const train::StepStats b = padded.step(ct.data(), cl.data(), step, 1e-3f);
    const std::int64_t after = device_allocator().stats().allocation.allocated;
    const train::StepStats a = full.step(t.data(), l.data(), step, 1e-3f);
    ++seen[L];
    SCOPED_TRACE(::testing::Message() << "step " << step << " longest " << longest[i] << " padded to " << L);
    EXPECT_TRUE(std::isfinite(b.loss));
    EXPECT_NEAR(b.loss, a.loss, 1e-2 * std::abs(a.loss));
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 2e-2 * a.grad_norm);
    if (i >= 6) {
      EXPECT_EQ(after, allocs) << "the padded step allocated after every length had run twice";
      EXPECT_TRUE(padded.graph_active());
      allocs = device_allocator().stats().allocation.allocated;
    }
  }
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(padded.graph_captures(), 3);  // 16, 32, 64: one capture each
  // BERT keeps its rows (the head's B x max_pred slots), named.
  EXPECT_NE(test::message_of([&] { padded.set_seq_shape(B + 1, 16); }).find("expected 2 rows of at least"),
            std::string::npos);
}
