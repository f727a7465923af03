// GPT-2 on the GPU engine against the CPU reference model: the loss and every parameter gradient
// (the tied head's share in wte included) at step 0, with one and two micro-batches (the second
// adds, the first writes: gradients poisoned first), with the deterministic and the fast attention
// backward, padded vocabulary rows without gradient, ten training steps, CUDA-graph replay ==
// eager and activation checkpointing == none, evaluation, and an llm.c model file loaded into the
// engine and written back unchanged.
#include <gtest/gtest.h>

#include <cmath>

#include "model/llmc_checkpoint.h"
#include "model/reference_model.h"
#include "runtime/file_util.h"
#include "tests/support/cpu_test_util.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"
#include "train/gpt2_io.h"

using namespace cutrain;

namespace {

train::BackendOptions gpt2_model(std::uint64_t seed) {
  train::BackendOptions o;
  o.dims = model::ModelDims{128, 2, 2, 1000, 64};
  o.dims.padded_vocab = 1024;
  o.dims.arch = model::Arch::Gpt2;
  o.batch = 2;
  o.seq = 64;
  o.seed = seed;
  o.cuda_graph = true;
  return o;
}

train::TrainConfig config_for(const std::string& layout, int accumulation = 1, double wd = 0.0) {
  std::string bf16 = R"("enabled": true)";
  if (layout != "baseline") bf16 += R"(, "bf16_master_weights_and_grads": true)";
  if (layout == "bf16_full") bf16 += R"(, "bf16_optimizer_states": true)";
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" +
                           std::to_string(accumulation) + R"(, "gradient_clipping": 1.0,
                           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95],
                           "eps": 1e-8, "weight_decay": )" + std::to_string(wd) + R"(}}, "bf16": {)" + bf16 + "}}";
  train::TrainConfig c = train::parse_config(text, "test:" + layout);
  c.resolve_batch(1);
  return c;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The loss and every parameter gradient at step 0 against the fp64 reference, with one and two
// micro-batches, and the padded vocabulary rows without gradient.
void expect_gradients_match_reference(const char* layout, bool deterministic_attention) {
  SCOPED_TRACE(std::string(layout) + (deterministic_attention ? "" : ", fast attention backward"));
  for (int accum : {1, 2}) {
    auto rng = test::fresh_rng();
    train::BackendOptions o = gpt2_model(rng());
    o.deterministic_attention = deterministic_attention;
    train::GpuEngine eng(o, config_for(layout, accum));
    const std::size_t n = std::size_t(o.batch) * o.seq;
    const auto tok = test::random_ints(accum * n, rng, 0, o.dims.vocab - 1);
    const auto lab = test::random_ints(accum * n, rng, 0, o.dims.vocab - 1);
    eng.poison_grads();
    const double loss = eng.forward_backward(tok.data(), lab.data());
    const std::vector<float> grads = eng.download_grads();
    EXPECT_EQ(test::count_nan(grads), 0u) << "gradient elements left unwritten (poison) or non-finite";
    std::vector<double> p = to_double(eng.download_params()), g(p.size(), 0.0);
    model::ReferenceModel<double> ref(eng.table());
    double ref_loss = 0;
    for (int a = 0; a < accum; ++a) {
      ref_loss += ref.forward(p.data(), tok.data() + a * n, lab.data() + a * n, o.batch, o.seq) / accum;
      ref.backward(p.data(), g.data(), 1.0 / accum);
    }
    EXPECT_NEAR(loss, ref_loss, 1e-2 * ref_loss) << "accumulation " << accum;
    for (const auto& t : eng.table().tensors()) {
      std::vector<float> out(grads.begin() + t.offset, grads.begin() + t.offset + t.count);
      std::vector<double> want(g.begin() + t.offset, g.begin() + t.offset + t.count);
      EXPECT_LE(test::rel_error(out, want), 2e-2) << "accumulation " << accum << ": " << t.name;
    }
    const auto& wte = eng.table().tensor(eng.table().embedding());
    for (std::size_t i = std::size_t(o.dims.vocab) * o.dims.hidden; i < wte.count; ++i)
      ASSERT_EQ(grads[wte.offset + i], 0.f) << "padded row element " << i;
  }
}

class Gpt2Gpu : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(Gpt2Gpu, LossAndEveryGradientMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  expect_gradients_match_reference(GetParam(), true);
}

// --attention_backward fast (head dim 64 here: dQ by fp32 reduce-adds in any order): the same
// tolerance, since only dQ's fp32 summation order differs.
TEST_P(Gpt2Gpu, FastAttentionBackwardGradientsMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  expect_gradients_match_reference(GetParam(), false);
}

TEST_P(Gpt2Gpu, TenStepsFollowTheReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = gpt2_model(rng());
  // Weight decay 0.1 on the matrices and embeddings only, as llm.c.
  train::GpuEngine eng(o, config_for(GetParam(), 1, 0.1));
  std::vector<float> p = eng.download_params(), g(p.size()), m(p.size(), 0.f), v(p.size(), 0.f);
  model::ReferenceModel<float> ref(eng.table());
  const std::size_t n = std::size_t(o.batch) * o.seq;
  for (int step = 1; step <= 10; ++step) {
    const auto tok = test::random_ints(n, rng, 0, o.dims.vocab - 1);
    const auto lab = test::random_ints(n, rng, 0, o.dims.vocab - 1);
    const train::StepStats st = eng.step(tok.data(), lab.data(), step, 1e-3f);
    const double ref_loss = ref.forward(p.data(), tok.data(), lab.data(), o.batch, o.seq);
    std::fill(g.begin(), g.end(), 0.f);
    ref.backward(p.data(), g.data());
    double norm = 0;
    for (float x : g) norm += double(x) * x;
    norm = std::sqrt(norm);
    const double clip = norm > 1.0 ? 1.0 / norm : 1.0;
    for (const model::DecayRun& r : eng.table().decay_runs())
      model::reference_adam_step(p.data() + r.begin, g.data() + r.begin, m.data() + r.begin, v.data() + r.begin,
                                 r.end - r.begin, 1e-3, 0.9, 0.95, 1e-8, r.decay ? 0.1 : 0.0, true, step, clip);
    EXPECT_FALSE(st.skipped);
    EXPECT_NEAR(st.loss, ref_loss, 0.01 * ref_loss) << GetParam() << " step " << step;
    EXPECT_NEAR(st.grad_norm, norm, 0.03 * norm) << GetParam() << " step " << step;
  }
  EXPECT_TRUE(eng.graph_active());
  // A LayerNorm weight (never decayed) and a matrix after ten steps, against the reference's.
  const std::vector<float> after = eng.download_params();
  for (int idx : {eng.table().layer(1).norm2_w, eng.table().layer(1).ff0_w}) {
    const auto& t = eng.table().tensor(idx);
    std::vector<float> got(after.begin() + t.offset, after.begin() + t.offset + t.count);
    std::vector<float> want(p.begin() + t.offset, p.begin() + t.offset + t.count);
    EXPECT_LE(test::rel_error(got, want), 2e-2) << GetParam() << ": " << t.name;
  }
}

TEST_P(Gpt2Gpu, GraphEqualsEagerAndCheckpointingEqualsNone) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  train::BackendOptions eager = gpt2_model(rng()), graph = eager, ckpt = eager;
  eager.cuda_graph = false;
  ckpt.activation_checkpointing = true;
  const train::TrainConfig cfg = config_for(GetParam());
  train::GpuEngine a(eager, cfg), b(graph, cfg), c(ckpt, cfg);
  const std::size_t n = std::size_t(eager.batch) * eager.seq;
  for (int step = 1; step <= 4; ++step) {
    const auto tok = test::random_ints(n, rng, 0, eager.dims.vocab - 1);
    const auto lab = test::random_ints(n, rng, 0, eager.dims.vocab - 1);
    const train::StepStats sa = a.step(tok.data(), lab.data(), step, 1e-3f);
    const train::StepStats sb = b.step(tok.data(), lab.data(), step, 1e-3f);
    const train::StepStats sc = c.step(tok.data(), lab.data(), step, 1e-3f);
    EXPECT_EQ(sa.loss, sb.loss) << "graph vs eager, step " << step;
    EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "graph vs eager, step " << step;
    EXPECT_EQ(sa.loss, sc.loss) << "checkpointing vs none, step " << step;
    EXPECT_EQ(sa.grad_norm, sc.grad_norm) << "checkpointing vs none, step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Gpt2Gpu, ::testing::Values("baseline", "bf16_full"),
                         [](const auto& i) { return std::string(i.param); });

TEST(Gpt2GpuLlmc, ModelFileLoadsEvaluatesAndWritesBackUnchanged) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const auto dir = test::fresh_temp_dir("gpt2_llmc");
  const train::BackendOptions o = gpt2_model(rng());
  model::TransformerParams table(o.dims);
  std::vector<float> flat(table.flat_size());
  table.init(flat.data(), rng());
  for (float& x : flat) x *= 5.f;  // away from GPT-2's small init, so the loss says something
  model::save_llmc_checkpoint(dir / "in.bin", table, flat.data(), /*bf16=*/true);
  train::GpuEngine eng(o, config_for("bf16_full"));
  train::init_from_llmc(eng, dir / "in.bin");
  std::vector<float> want(table.flat_size());
  model::load_llmc_checkpoint(dir / "in.bin", table, want.data());
  EXPECT_EQ(eng.download_params(), want);
  const std::size_t n = std::size_t(o.batch) * o.seq;
  const auto tok = test::random_ints(n, rng, 0, o.dims.vocab - 1);
  const auto lab = test::random_ints(n, rng, 0, o.dims.vocab - 1);
  std::vector<double> p = to_double(want);
  model::ReferenceModel<double> ref(table);
  const double ref_loss = ref.forward(p.data(), tok.data(), lab.data(), o.batch, o.seq);
  EXPECT_NEAR(eng.eval_loss(tok.data(), lab.data()), ref_loss, 2e-2 * ref_loss);
  train::save_llmc(eng, dir / "out.bin", /*bf16=*/true);
  EXPECT_EQ(read_file(dir / "out.bin"), read_file(dir / "in.bin"));
}

// --recompute_gelu: one GELU output buffer for every block, recomputed in backward. The forward
// is the same bits (the loss), the gradients the same up to the recomputed GELU's rounding, and
// (layers - 1) x B x S x 4C bf16 less memory stays allocated.
TEST(Gpt2GpuRecompute, RecomputedGeluTrainsTheSameWithLessMemory) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  train::BackendOptions plain = gpt2_model(rng()), rec = plain;
  rec.recompute_gelu = true;
  const std::size_t n = std::size_t(plain.batch) * plain.seq;
  const auto tok = test::random_ints(n, rng, 0, plain.dims.vocab - 1);
  const auto lab = test::random_ints(n, rng, 0, plain.dims.vocab - 1);
  std::int64_t mem[2];
  double loss[2];
  std::vector<float> grads[2];
  for (int k = 0; k < 2; ++k) {
    train::GpuEngine eng(k ? rec : plain, config_for("baseline"));
    loss[k] = eng.forward_backward(tok.data(), lab.data());
    grads[k] = eng.download_grads();
    mem[k] = eng.memory().allocated;
  }
  EXPECT_EQ(loss[0], loss[1]);
  EXPECT_LE(test::rel_error(grads[1], grads[0]), 1e-2);
  const std::int64_t saved = std::int64_t(plain.dims.layers - 1) * std::int64_t(n) * plain.dims.ffn() * 2;
  EXPECT_GE(mem[0] - mem[1], saved) << "allocated " << mem[0] << " without, " << mem[1] << " with recompute";
  EXPECT_LE(mem[0] - mem[1], saved + (2 << 20));
}
