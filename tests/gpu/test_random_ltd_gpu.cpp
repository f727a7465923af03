// @brief random-LTD on the GPU against the CPU reference model with the same token selection: the
// engine's loss and every parameter gradient (the seed model as encoder and causal, GPT-2 with a
// dropping first or last block, activation checkpointing on and off, gradient accumulation);
// steps through a growing kept count that follow the reference's AdamW steps, with CUDA-graph
// replay (captured again per kept count) equal to eager and checkpointing equal to none, the
// layer-token figure, and no allocation once the kept counts have been seen. Composed with a
// sequence-length curriculum: the kept count min(schedule, L) at each step's rows x L, the loss and
// gradients against the reference at two shapes, steps graph == eager, one capture per (kept, rows
// x L), the layer tokens at the real length, and no allocation once every shape has run twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "model/reference_model.h"
#include "runtime/allocator.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"
#include "train/random_ltd_draw.h"
#include "train/seqlen_curriculum.h"

using namespace cutrain;

namespace {

struct Case {
  const char* name;
  model::Arch arch;
  bool causal;
  const char* ids;  // random_ltd_layer_id
  int accumulation;
};

// kept = 16, 16, 16, 32, 32, 32, 48, 48, 64 (= S: no drop) at the 1-based steps 1..9.
train::TrainConfig ltd_config(const Case& c, int layers) {
  const std::string ids = c.ids;
  const int n = int(std::count(ids.begin(), ids.end(), ',')) + 1;
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" +
                           std::to_string(c.accumulation) + R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3,
    "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}}, "bf16": {"enabled": true},
    "data_efficiency": {"enabled": true, "seed": 5, "data_routing": {"enabled": true, "random_ltd": {"enabled": true,
      "total_layer_num": )" + std::to_string(layers) + R"(, "random_ltd_layer_num": )" + std::to_string(n) +
                           R"(, "random_ltd_layer_id": [)" + ids + R"(], "model_type": ")" +
                           (c.causal ? "decoder" : "encoder") + R"(", "random_ltd_schedule": {"min_value": 16,
      "max_value": 64, "schedule_type": "fixed_linear", "schedule_config": {"require_steps": 8, "seq_per_step": 16}}}}}})";
  train::TrainConfig cfg = train::parse_config(text, std::string("test:") + c.name);
  cfg.resolve_batch(1);
  return cfg;
}

train::BackendOptions options(const Case& c, std::uint64_t seed) {
  train::BackendOptions o = test::small_model(seed);
  o.dims.arch = c.arch;
  o.causal = c.causal;
  return o;
}

class RandomLtdGpu : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(RandomLtdGpu, LossAndEveryGradientMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  const Case c = GetParam();
  auto rng = test::fresh_rng();
  for (bool ckpt : {false, true}) {
    train::BackendOptions o = options(c, rng());
    o.activation_checkpointing = ckpt;
    const train::TrainConfig cfg = ltd_config(c, o.dims.layers);
    train::GpuEngine eng(o, cfg);
    const std::size_t n = std::size_t(c.accumulation) * o.batch * o.seq;
    const auto tok = test::random_ints(n, rng, 0, o.dims.vocab - 1), lab = test::random_ints(n, rng, 0, o.dims.vocab - 1);
    const int step = 5;  // kept 32 of 64
    eng.poison_grads();
    const double loss = eng.forward_backward(tok.data(), lab.data(), step);
    const std::vector<float> grads = eng.download_grads();
    EXPECT_EQ(test::count_nan(grads), 0u) << "gradient elements left unwritten (poison) or non-finite";
    const std::vector<float> params = eng.download_params();
    std::vector<double> p(params.begin(), params.end()), g(params.size(), 0.0);
    model::ReferenceModel<double> ref(eng.table(), c.causal);
    train::RandomLtdDraw draw(cfg, o.batch, o.seq, o.dims.layers, 0);
    double ref_loss = 0;
    const std::size_t per = std::size_t(o.batch) * o.seq;
    for (int a = 0; a < c.accumulation; ++a) {
      const model::TokenDropPlan& plan = draw.draw(step, a);
      ASSERT_TRUE(plan.active());
      ASSERT_EQ(plan.kept, 32);
      ref.set_token_drop(&plan);
      ref_loss += ref.forward(p.data(), tok.data() + a * per, lab.data() + a * per, o.batch, o.seq) / c.accumulation;
      ref.backward(p.data(), g.data(), 1.0 / c.accumulation);
    }
    // The same model without the drop gives another loss: the selection is in effect.
    model::ReferenceModel<double> plain(eng.table(), c.causal);
    EXPECT_GT(std::abs(plain.forward(p.data(), tok.data(), lab.data(), o.batch, o.seq) -
                       [&] {
                         model::ReferenceModel<double> r(eng.table(), c.causal);
                         r.set_token_drop(&draw.draw(step, 0));
                         return r.forward(p.data(), tok.data(), lab.data(), o.batch, o.seq);
                       }()),
              1e-6);
    EXPECT_NEAR(loss, ref_loss, 2e-2 * ref_loss) << c.name << (ckpt ? " checkpointing" : "");
    for (const auto& t : eng.table().tensors()) {
      std::vector<float> out(grads.begin() + t.offset, grads.begin() + t.offset + t.count);
      std::vector<double> want(g.begin() + t.offset, g.begin() + t.offset + t.count);
      EXPECT_LE(test::rel_error(out, want), 2e-2) << c.name << (ckpt ? " checkpointing: " : ": ") << t.name;
    }
  }
}

TEST_P(RandomLtdGpu, StepsFollowTheReferenceGraphEqualsEagerAndNothingIsAllocated) {
  CUTRAIN_REQUIRE_GPU();
  const Case c = GetParam();
  auto rng = test::fresh_rng();
  const std::uint64_t seed = rng();
  train::BackendOptions graph = options(c, seed), eager = graph, ckpt = graph;
  eager.cuda_graph = false;
  ckpt.activation_checkpointing = true;
  const train::TrainConfig cfg = ltd_config(c, graph.dims.layers);
  train::GpuEngine a(eager, cfg), b(graph, cfg), k(ckpt, cfg);
  const std::vector<float> init = b.download_params();
  std::vector<float> p = init, g(init.size()), m(init.size(), 0.f), v(init.size(), 0.f);
  model::ReferenceModel<float> ref(b.table(), c.causal);
  train::RandomLtdDraw draw(cfg, graph.batch, graph.seq, graph.dims.layers, 0);
  const std::size_t per = std::size_t(graph.batch) * graph.seq, n = per * c.accumulation;
  std::int64_t allocs_after_warmup = -1;
  for (int step = 1; step <= 12; ++step) {
    const auto tok = test::random_ints(n, rng, 0, graph.dims.vocab - 1);
    const auto lab = test::random_ints(n, rng, 0, graph.dims.vocab - 1);
    const train::StepStats sa = a.step(tok.data(), lab.data(), step, 1e-3f);
    const train::StepStats sb = b.step(tok.data(), lab.data(), step, 1e-3f);
    const train::StepStats sk = k.step(tok.data(), lab.data(), step, 1e-3f);
    EXPECT_EQ(sa.loss, sb.loss) << "graph vs eager, step " << step;
    EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "graph vs eager, step " << step;
    EXPECT_EQ(sa.loss, sk.loss) << "checkpointing vs none, step " << step;
    std::fill(g.begin(), g.end(), 0.f);
    double ref_loss = 0;
    std::int64_t tokens = 0;
    for (int mb = 0; mb < c.accumulation; ++mb) {
      const model::TokenDropPlan& plan = draw.draw(step, mb);
      ref.set_token_drop(&plan);
      ref_loss += ref.forward(p.data(), tok.data() + mb * per, lab.data() + mb * per, graph.batch, graph.seq) /
                  c.accumulation;
      ref.backward(p.data(), g.data(), 1.0 / c.accumulation);
      tokens += plan.layer_tokens(graph.dims.layers);
    }
    model::reference_adam_step(p.data(), g.data(), m.data(), v.data(), p.size(), 1e-3, 0.9, 0.999, 1e-8, 0.01, true,
                               step);
    EXPECT_NEAR(sb.loss, ref_loss, 0.02 * ref_loss) << c.name << " step " << step;
    EXPECT_EQ(sb.layer_tokens, tokens) << "step " << step;
    // Steps 1..9 see every kept count (16, 32, 48, 64); after them the step allocates nothing.
    if (step == 9) allocs_after_warmup = device_allocator().stats().allocation.allocated;
  }
  EXPECT_EQ(device_allocator().stats().allocation.allocated, allocs_after_warmup)
      << "a step allocated after every kept count had been seen";
  EXPECT_TRUE(b.graph_active());
  // One capture per kept count (16, 32, 48 and the full 64), each at the count's first step.
  EXPECT_GE(b.graph_captures(), 3);
  EXPECT_EQ(a.download_params(), b.download_params());
  EXPECT_EQ(a.download_params(), k.download_params());
}

INSTANTIATE_TEST_SUITE_P(Models, RandomLtdGpu,
                         ::testing::Values(Case{"encoder_block1", model::Arch::Simple, false, "1", 1},
                                           Case{"causal_both_blocks_accum2", model::Arch::Simple, true, "0, 1", 2},
                                           Case{"gpt2_last_block", model::Arch::Gpt2, true, "1", 1},
                                           Case{"gpt2_first_block_accum2", model::Arch::Gpt2, true, "0", 2}),
                         [](const auto& i) { return std::string(i.param.name); });

namespace {

struct ComposedCase {
  const char* name;
  model::Arch arch;
  train::CurriculumMetric metric;
  const char* ids;
  int accumulation;
};

// kept = 16, 16, 32, 32, then 48 from the 1-based step 5 on (max_value 48 < S: the curriculum's
// length decides whether a step drops).
train::TrainConfig composed_config(const ComposedCase& c, int layers) {
  const std::string ids = c.ids;
  const int n = int(std::count(ids.begin(), ids.end(), ',')) + 1;
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" +
                           std::to_string(c.accumulation) + R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3,
    "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}}, "bf16": {"enabled": true},
    "data_efficiency": {"enabled": true, "seed": 7, "data_routing": {"enabled": true, "random_ltd": {"enabled": true,
      "total_layer_num": )" + std::to_string(layers) + R"(, "random_ltd_layer_num": )" + std::to_string(n) +
                           R"(, "random_ltd_layer_id": [)" + ids + R"(], "model_type": "decoder", "random_ltd_schedule":
      {"min_value": 16, "max_value": 48, "schedule_type": "fixed_linear", "schedule_config": {"require_steps": 4,
      "seq_per_step": 16}}}}}})";
  train::TrainConfig cfg = train::parse_config(text, std::string("test:") + c.name);
  cfg.resolve_batch(1);
  return cfg;
}

train::SeqlenCurriculum composed_curriculum(const ComposedCase& c, const train::BackendOptions& o) {
  train::PacingConfig p;
  p.min_difficulty = 8;
  p.max_difficulty = o.seq;
  p.total_curriculum_step = 8;
  p.difficulty_step = 8;
  return train::SeqlenCurriculum(c.metric, p, o.batch, o.seq, "test");
}

class ComposedGpu : public ::testing::TestWithParam<ComposedCase> {};

}  // namespace

// The composed engine at two shapes that drop (L 40 keeping 32, L 56 keeping 48) against the
// reference model with the draw at that shape: the loss and every gradient.
TEST_P(ComposedGpu, LossAndEveryGradientMatchTheReferenceAtTwoShapes) {
  CUTRAIN_REQUIRE_GPU();
  const ComposedCase c = GetParam();
  auto rng = test::fresh_rng();
  train::BackendOptions o = test::small_model(rng());
  o.dims.arch = c.arch;
  o.causal = true;
  const train::TrainConfig cfg = composed_config(c, o.dims.layers);
  const train::SeqlenCurriculum cl = composed_curriculum(c, o);
  o.max_tokens = cl.max_tokens();
  for (auto [step, L, kept] : {std::tuple{3, 40, 32}, std::tuple{5, 56, 48}}) {
    SCOPED_TRACE(::testing::Message() << c.name << " step " << step << " L=" << L);
    train::GpuEngine eng(o, cfg);
    const train::SeqShape sh = cl.shape(L);
    const std::size_t n = std::size_t(c.accumulation) * o.batch * o.seq;
    const auto t = test::random_ints(n, rng, 0, o.dims.vocab - 1), l = test::random_ints(n, rng, 0, o.dims.vocab - 1);
    std::vector<std::int32_t> tok, lab;
    cl.apply(L, c.accumulation, t.data(), l.data(), tok, lab);
    eng.set_seq_shape(sh.rows, sh.seq);
    eng.poison_grads();
    const double loss = eng.forward_backward(tok.data(), lab.data(), step);
    const std::vector<float> grads = eng.download_grads();
    EXPECT_EQ(test::count_nan(grads), 0u) << "gradient elements left unwritten (poison) or non-finite";
    const std::vector<float> params = eng.download_params();
    std::vector<double> p(params.begin(), params.end()), g(params.size(), 0.0);
    model::ReferenceModel<double> ref(eng.table(), true);
    train::RandomLtdDraw draw(cfg, o.batch, o.seq, o.dims.layers, 0);
    const std::size_t per = sh.tokens();
    double ref_loss = 0;
    for (int a = 0; a < c.accumulation; ++a) {
      const model::TokenDropPlan& plan = draw.draw(step, a, sh.rows, sh.seq);
      ASSERT_TRUE(plan.active());
      ASSERT_EQ(plan.kept, kept);
      ASSERT_EQ(plan.batch, sh.rows);
      ref.set_token_drop(&plan);
      ref_loss += ref.forward(p.data(), tok.data() + a * per, lab.data() + a * per, sh.rows, sh.seq) / c.accumulation;
      ref.backward(p.data(), g.data(), 1.0 / c.accumulation);
    }
    EXPECT_NEAR(loss, ref_loss, 2e-2 * ref_loss);
    for (const auto& tn : eng.table().tensors()) {
      std::vector<float> out(grads.begin() + tn.offset, grads.begin() + tn.offset + tn.count);
      std::vector<double> want(g.begin() + tn.offset, g.begin() + tn.offset + tn.count);
      EXPECT_LE(test::rel_error(out, want), 2e-2) << tn.name;
    }
  }
}

// A composed run over lengths and kept counts: graph == eager, the reference's AdamW steps, the
// layer tokens at the real length, one capture per (kept, rows x L), no allocation after warm-up.
TEST_P(ComposedGpu, StepsFollowTheReferenceOneGraphPerShapeNoAllocation) {
  CUTRAIN_REQUIRE_GPU();
  const ComposedCase c = GetParam();
  auto rng = test::fresh_rng();
  train::BackendOptions graph = test::small_model(rng());
  graph.dims.arch = c.arch;
  graph.causal = true;
  const train::TrainConfig cfg = composed_config(c, graph.dims.layers);
  const train::SeqlenCurriculum cl = composed_curriculum(c, graph);
  graph.max_tokens = cl.max_tokens();
  train::BackendOptions eager = graph;
  eager.cuda_graph = false;
  train::GpuEngine a(eager, cfg), b(graph, cfg);
  const std::vector<float> init = b.download_params();
  std::vector<float> p = init, g(init.size()), m(init.size(), 0.f), v(init.size(), 0.f);
  model::ReferenceModel<float> ref(b.table(), true);
  train::RandomLtdDraw draw(cfg, graph.batch, graph.seq, graph.dims.layers, 0);
  // Steps 1..10: each (kept, shape) twice in a row: (16, 24), (32, 40), (48, 56), (no drop, 40:
  // the schedule's 48 reaches L), (48, 64); then those shapes again, replayed.
  const std::vector<int> lengths = {24, 24, 40, 40, 56, 56, 40, 40, 64, 64, 56, 40, 64, 56};
  const std::vector<int> want_kept = {16, 16, 32, 32, 48, 48, 0, 0, 48, 48, 48, 0, 48, 48};
  const std::size_t warm = 10;
  std::int64_t allocs = -1;
  std::set<std::tuple<int, int, int>> shapes;
  std::vector<std::int32_t> tok, lab;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const int L = lengths[i], step = int(i) + 1;
    const train::SeqShape sh = cl.shape(L);
    const std::size_t n = std::size_t(c.accumulation) * graph.batch * graph.seq;
    const auto t = test::random_ints(n, rng, 0, graph.dims.vocab - 1);
    const auto l = test::random_ints(n, rng, 0, graph.dims.vocab - 1);
    cl.apply(L, c.accumulation, t.data(), l.data(), tok, lab);
    if (i == warm) allocs = device_allocator().stats().allocation.allocated;
    a.set_seq_shape(sh.rows, sh.seq);
    b.set_seq_shape(sh.rows, sh.seq);
    const train::StepStats sa = a.step(tok.data(), lab.data(), step, 1e-3f);
    const train::StepStats sb = b.step(tok.data(), lab.data(), step, 1e-3f);
    const std::int64_t after = device_allocator().stats().allocation.allocated;
    SCOPED_TRACE(::testing::Message() << c.name << " step " << step << " L=" << L << " rows=" << sh.rows);
    EXPECT_EQ(sa.loss, sb.loss) << "graph vs eager";
    EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "graph vs eager";
    std::fill(g.begin(), g.end(), 0.f);
    double ref_loss = 0;
    std::int64_t tokens = 0;
    int kept = 0;
    const std::size_t per = sh.tokens();
    for (int mb = 0; mb < c.accumulation; ++mb) {
      const model::TokenDropPlan& plan = draw.draw(step, mb, sh.rows, sh.seq);
      kept = plan.active() ? plan.kept : 0;
      ref.set_token_drop(&plan);
      ref_loss += ref.forward(p.data(), tok.data() + mb * per, lab.data() + mb * per, sh.rows, sh.seq) / c.accumulation;
      ref.backward(p.data(), g.data(), 1.0 / c.accumulation);
      tokens += plan.layer_tokens(graph.dims.layers);
    }
    EXPECT_EQ(kept, want_kept[i]) << "min(schedule, L), no drop where the schedule reaches L";
    shapes.insert({kept, sh.rows, sh.seq});
    model::reference_adam_step(p.data(), g.data(), m.data(), v.data(), p.size(), 1e-3, 0.9, 0.999, 1e-8, 0.01, true,
                               step);
    EXPECT_NEAR(sb.loss, ref_loss, 0.02 * ref_loss);
    // Layer tokens at the real length: rows x (kept per dropping block + L per other block).
    EXPECT_EQ(sb.layer_tokens, tokens);
    // After the run's first (eager) step, a new shape is captured at its first step.
    if (i >= 1) EXPECT_TRUE(b.graph_active()) << "the shape's graph, captured at its first step";
    if (i >= warm) {
      EXPECT_EQ(after, allocs) << "a step allocated after every shape had run twice";
      allocs = device_allocator().stats().allocation.allocated;
    }
  }
  EXPECT_EQ(shapes.size(), 5u);
  EXPECT_EQ(b.graph_captures(), 5);
  EXPECT_EQ(b.graph_count(), 5);
  EXPECT_EQ(a.download_params(), b.download_params());
}

INSTANTIATE_TEST_SUITE_P(Models, ComposedGpu,
                         ::testing::Values(ComposedCase{"causal_truncate_both_blocks", model::Arch::Simple,
                                                        train::CurriculumMetric::SeqlenTruncate, "0, 1", 1},
                                           ComposedCase{"causal_reshape_accum2", model::Arch::Simple,
                                                        train::CurriculumMetric::SeqlenReshape, "1", 2},
                                           ComposedCase{"gpt2_truncate_first_block_accum2", model::Arch::Gpt2,
                                                        train::CurriculumMetric::SeqlenTruncate, "0", 2},
                                           ComposedCase{"gpt2_reshape_both_blocks", model::Arch::Gpt2,
                                                        train::CurriculumMetric::SeqlenReshape, "0, 1", 1}),
                         [](const auto& i) { return std::string(i.param.name); });
