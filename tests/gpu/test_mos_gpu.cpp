// @brief Mixture-of-Students on the GPU engine: with a teacher (another shape, bf16 weights) every
// parameter gradient of alpha * ce + beta * T^2 * KL against the CPU reference model's (the
// distillation gradient handed to its backward), over two accumulated micro-batches, and the step's
// kd_loss / ce_loss against the reference's; the student as its own teacher at T = 1 giving 0; the
// stop step freeing the teacher's device memory, the steps after it equal to an LM-only engine
// loaded from the same state.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "model/distillation_loss.h"
#include "model/reference_model.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"

using namespace cutrain;

namespace {

train::TrainConfig config(int accumulation) {
  const std::string text = R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )" +
                           std::to_string(accumulation) + R"(,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}, "bf16": {)" +
                           test::bf16_section("baseline") + "}}";
  train::TrainConfig c = train::parse_config(text, "test:mos_gpu");
  c.resolve_batch(1);
  return c;
}

// GPT-2 student: hidden 128, 2 heads, 2 blocks, vocab 1000, one sequence of 64 per micro-batch.
train::BackendOptions student(std::uint64_t seed) {
  train::BackendOptions o = test::small_model(seed);
  o.dims.arch = model::Arch::Gpt2;
  o.batch = 1;
  o.causal = true;
  return o;
}

// A GPT-2 teacher of 3 blocks of 192 (3 heads of 64), the same vocabulary, weights from `seed`
// rounded to bf16 (what the engine holds).
std::shared_ptr<train::Teacher> teacher(std::uint64_t seed, const model::ModelDims* same = nullptr) {
  auto t = std::make_shared<train::Teacher>();
  if (same) {
    t->dims = *same;
  } else {
    t->dims = model::ModelDims{192, 3, 3, 1000, 64};
    t->dims.arch = model::Arch::Gpt2;
  }
  t->causal = true;
  const model::TransformerParams table(t->dims);
  t->params.assign(table.flat_size(), 0.f);
  table.init(t->params.data(), seed);
  t->params = test::round_bf16(t->params);
  return t;
}

}  // namespace

TEST(MosGpu, EveryGradientAndTheTermMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const int accum = 2;
  train::BackendOptions o = student(rng());
  auto t = teacher(rng());
  o.teacher = t;
  o.distill.mos = true;
  o.distill.kd_alpha_ce = 0.6;
  o.distill.kd_beta_ce = 1.5;
  o.distill.kd_temp = 2.0;
  const std::size_t per = std::size_t(o.batch) * o.seq;
  const auto tok = test::random_ints(accum * per, rng, 0, o.dims.vocab - 1);
  const auto lab = test::random_ints(accum * per, rng, 0, o.dims.vocab - 1);

  train::GpuEngine eng(o, config(accum));
  EXPECT_TRUE(eng.holds_teacher());
  const std::vector<float> params = eng.download_params();
  // The reference: per micro-batch the teacher's forward, the student's, the term's gradient
  // handed to the student's backward at 1 / accumulation; and the LM loss's gradient alone.
  const model::TransformerParams tt(t->dims);
  model::ReferenceModel<double> tm(tt, true), sm(eng.table(), true);
  const std::vector<double> tp(t->params.begin(), t->params.end());
  std::vector<double> p(params.begin(), params.end()), g(params.size(), 0.0), plain(params.size(), 0.0);
  double ce = 0, kd = 0;
  const int Vs = eng.table().dims().vocab_rows(), Vt = tt.dims().vocab_rows();
  for (int a = 0; a < accum; ++a) {
    tm.set_moe_mode(false);
    tm.forward(tp.data(), tok.data() + a * per, lab.data() + a * per, o.batch, o.seq);
    ce += sm.forward(p.data(), tok.data() + a * per, lab.data() + a * per, o.batch, o.seq) / accum;
    std::vector<double> extra(sm.logits().size(), 0.0);
    kd += o.distill.kd_beta_ce *
          model::distillation_loss(sm.logits().data(), Vs, tm.logits().data(), Vt, int(per), o.dims.vocab,
                                   o.distill.kd_temp, o.distill.kd_beta_ce, extra.data()) /
          accum;
    sm.backward(p.data(), plain.data(), 1.0 / accum);
    sm.set_logits_grad_extra(&extra, o.distill.kd_alpha_ce);
    sm.backward(p.data(), g.data(), 1.0 / accum);
    sm.set_logits_grad_extra(nullptr);
  }
  eng.poison_grads();
  eng.forward_backward(tok.data(), lab.data());
  const std::vector<float> grads = eng.download_grads();
  EXPECT_EQ(test::count_nan(grads), 0u);
  double moved = 0, norm = 0;  // the distillation's share of the gradient: large enough to be seen
  for (std::size_t i = 0; i < g.size(); ++i) {
    moved += (g[i] - plain[i]) * (g[i] - plain[i]);
    norm += g[i] * g[i];
  }
  ASSERT_GT(std::sqrt(moved / norm), 0.2);
  for (const auto& ten : eng.table().tensors()) {
    std::vector<float> out(grads.begin() + ten.offset, grads.begin() + ten.offset + ten.count);
    std::vector<double> want(g.begin() + ten.offset, g.begin() + ten.offset + ten.count);
    EXPECT_LE(test::rel_error(out, want), 5e-2) << ten.name;
  }
  // The step's figures (the same engine state: forward_backward changed no parameter).
  const train::StepStats st = eng.step(tok.data(), lab.data(), 1, 1e-3f);
  EXPECT_TRUE(st.distilled);
  EXPECT_NEAR(st.ce_loss, ce, 2e-2 * ce);
  EXPECT_EQ(st.ce_loss, st.loss);
  EXPECT_GT(kd, 1e-4);
  EXPECT_NEAR(st.kd_loss, kd, 5e-2 * kd);
}

TEST(MosGpu, TheStudentAsItsOwnTeacherAtTemperatureOneGivesZero) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  train::BackendOptions o = student(rng());
  o.teacher = teacher(o.seed, &o.dims);  // the student's own initial weights
  o.distill.kd = true;
  auto be = train::make_gpu_backend(o, config(1));
  const auto tok = test::random_ints(std::size_t(o.seq), rng, 0, o.dims.vocab - 1);
  const auto lab = test::random_ints(std::size_t(o.seq), rng, 0, o.dims.vocab - 1);
  const train::StepStats s = be->step(tok.data(), lab.data(), 1, 1e-3f);
  EXPECT_TRUE(s.distilled);
  EXPECT_LE(std::abs(s.kd_loss), 1e-5);
  const train::StepStats s2 = be->step(tok.data(), lab.data(), 2, 1e-3f);  // the student moved
  EXPECT_GT(s2.kd_loss, 1e-7);
}

TEST(MosGpu, StopStepFreesTheTeacherAndTheRunContinuesAsAnLmOnlyRun) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  train::BackendOptions o = student(rng());
  std::shared_ptr<train::Teacher> t = teacher(rng());
  const std::size_t teacher_bytes = 2 * t->params.size();
  o.teacher = std::move(t);
  o.distill.mos = true;
  o.distill.kd_alpha_ce = 0.5;
  o.distill.stop_kd_step = 2;
  const train::TrainConfig cfg = config(1);
  auto be = train::make_gpu_backend(o, cfg);
  o.teacher.reset();
  const test::StepBatches b = test::random_step_batches(rng, 5, o);
  for (int step = 0; step < 2; ++step) {
    const train::StepStats s = be->step(b.tokens[step].data(), b.labels[step].data(), step + 1, 1e-3f);
    EXPECT_TRUE(s.distilled) << step;
    EXPECT_GT(s.kd_loss, 0.0) << step;
  }
  EXPECT_TRUE(be->holds_teacher());
  // The stop step: the teacher's weights, its workspace and the term's buffers go back (measured
  // around the step: the allocator's figures are the process's).
  const train::HostState state = be->save_state();
  const std::int64_t with_teacher = be->memory().allocated;
  std::vector<double> losses;
  for (int step = 2; step < 5; ++step) {
    const train::StepStats x = be->step(b.tokens[step].data(), b.labels[step].data(), step + 1, 1e-3f);
    EXPECT_FALSE(x.distilled) << step;
    EXPECT_EQ(x.kd_loss, 0.0) << step;
    EXPECT_FALSE(be->holds_teacher());
    if (step == 2) EXPECT_GE(with_teacher - be->memory().allocated, std::int64_t(teacher_bytes));
    losses.push_back(x.loss);
  }
  // An LM-only engine from the same state continues with the same losses.
  train::BackendOptions plain = o;
  plain.distill = {};
  auto lm = train::make_gpu_backend(plain, cfg);
  lm->load_state(state);
  for (int step = 2; step < 5; ++step) {
    const train::StepStats y = lm->step(b.tokens[step].data(), b.labels[step].data(), step + 1, 1e-3f);
    EXPECT_NEAR(losses[std::size_t(step - 2)], y.loss, 1e-6 * std::abs(y.loss)) << step;
  }
}
