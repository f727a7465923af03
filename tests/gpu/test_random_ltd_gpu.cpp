// @brief random-LTD on the GPU against the CPU reference model with the same token selection: the
// engine's loss and every parameter gradient (the seed model as encoder and causal, GPT-2 with a
// dropping first or last block, activation checkpointing on and off, gradient accumulation);
// steps through a growing kept count that follow the reference's AdamW steps, with CUDA-graph
// replay (captured again per kept count) equal to eager and checkpointing equal to none, the
// layer-token figure, and no allocation once the kept counts have been seen.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/reference_model.h"
#include "runtime/allocator.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"
#include "train/random_ltd_draw.h"

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
  // One capture per kept count (16, 32, 48 and the full 64): each needs an eager step first.
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
