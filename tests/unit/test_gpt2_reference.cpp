// GPT-2 in the CPU reference model and its parameter table: every gradient (the tied head's
// included) against central finite differences in fp64, llm.c's parameter count and init, and
// that padded vocabulary rows get no gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/reference_model.h"
#include "tests/support/finite_difference.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {

model::ModelDims gpt2_dims(int C, int L, int H, int V, int T, int Vp) {
  model::ModelDims d{C, L, H, V, T};
  d.padded_vocab = Vp;
  d.arch = model::Arch::Gpt2;
  return d;
}

}  // namespace

TEST(Gpt2Reference, GradientsMatchFiniteDifferences) {
  auto rng = test::fresh_rng();
  const model::ModelDims d = gpt2_dims(8, 2, 2, 11, 6, 16);
  model::TransformerParams table(d);
  std::vector<float> init(table.flat_size());
  table.init(init.data(), rng());
  // GPT-2's init (0.02) leaves the model near uniform; spread the values so every path matters.
  std::uniform_real_distribution<double> u(-0.6, 0.6);
  std::vector<double> p(init.begin(), init.end());
  for (const auto& t : table.tensors())
    for (std::size_t i = 0; i < t.count; ++i) p[t.offset + i] += u(rng);
  const int B = 2, S = 5;
  auto tok = test::random_ints(B * S, rng, 0, d.vocab - 1);
  auto lab = test::random_ints(B * S, rng, 0, d.vocab - 1);
  lab[4] = -100;
  model::ReferenceModel<double> model(table);
  const std::vector<double> g = test::check_gradients(
      model, table, p, tok, lab, B, S,
      test::every_tensor_within(1e-5));
  // The padded rows of the tied embedding: no token, no logit in the loss, no gradient.
  const auto& wte = table.tensor(table.embedding());
  for (std::size_t i = std::size_t(d.vocab) * d.hidden; i < wte.count; ++i) EXPECT_EQ(g[wte.offset + i], 0.0);
}

TEST(Gpt2Reference, CausalWhateverTheFlagSays) {
  auto rng = test::fresh_rng();
  const model::ModelDims d = gpt2_dims(16, 1, 2, 13, 6, 0);
  model::TransformerParams table(d);
  std::vector<float> p(table.flat_size());
  table.init(p.data(), rng());
  auto tok = test::random_ints(6, rng, 0, 12);
  auto lab = test::random_ints(6, rng, 0, 12);
  model::ReferenceModel<float> m(table, false);
  m.forward(p.data(), tok.data(), lab.data(), 1, 6);
  const std::vector<float> before = m.logits();
  tok[5] = (tok[5] + 1) % 13;
  m.forward(p.data(), tok.data(), lab.data(), 1, 6);
  for (std::size_t i = 0; i < 5u * 13u; ++i) EXPECT_FLOAT_EQ(m.logits()[i], before[i]);
  double diff = 0;
  for (std::size_t i = 5u * 13u; i < 6u * 13u; ++i) diff += std::abs(m.logits()[i] - before[i]);
  EXPECT_GT(diff, 0.0);
}

TEST(Gpt2Params, Gpt2SmallHasLlmcsParameterCountAndUnits) {
  const model::ModelDims d = gpt2_dims(768, 12, 12, 50257, 1024, 50304);
  model::TransformerParams t(d);
  EXPECT_EQ(t.num_params(), 124475904u);  // llm.c's "num_parameters" for d12
  EXPECT_TRUE(t.tied_head());
  EXPECT_EQ(t.output_w(), t.embedding());
  EXPECT_EQ(t.output_b(), -1);
  EXPECT_EQ(t.tensor(t.layer(3).in_proj_w).name, "h.3.attn.qkv.weight");
  EXPECT_EQ(t.tensor(t.layer(3).in_proj_w).shape, (std::vector<std::int64_t>{3 * 768, 768}));
  EXPECT_EQ(t.tensor(t.final_norm_w()).name, "ln_f.weight");
  EXPECT_EQ(t.unit_of(t.final_norm_b()), t.head_unit());
  EXPECT_EQ(t.unit_of(t.layer(11).norm1_w), t.layer_unit(11));
  EXPECT_EQ(t.unit_of(t.layer(11).ff2_b), t.layer_unit(11));
  EXPECT_EQ(t.units().back().end, t.flat_size());
  for (std::size_t u = 1; u < t.units().size(); ++u) EXPECT_EQ(t.units()[u].begin, t.units()[u - 1].end);
}

TEST(Gpt2Params, InitIsGpt2s) {
  const model::ModelDims d = gpt2_dims(256, 8, 4, 1000, 64, 1024);
  model::TransformerParams t(d);
  std::vector<float> p(t.flat_size());
  t.init(p.data(), 7);
  auto stdev = [&](int idx) {
    const auto& x = t.tensor(idx);
    return test::stdev(p.data() + x.offset, x.count);
  };
  EXPECT_NEAR(stdev(t.embedding()), 0.02, 5e-4);
  EXPECT_NEAR(stdev(t.pos_embedding()), 0.02, 1e-3);
  EXPECT_NEAR(stdev(t.layer(2).in_proj_w), 0.02, 5e-4);
  EXPECT_NEAR(stdev(t.layer(2).ff0_w), 0.02, 5e-4);
  EXPECT_NEAR(stdev(t.layer(2).out_proj_w), 0.02 / 4.0, 2e-4);  // 1/sqrt(2 * 8 layers)
  EXPECT_NEAR(stdev(t.layer(2).ff2_w), 0.02 / 4.0, 2e-4);
  const auto& b = t.tensor(t.layer(2).ff0_b);
  const auto& w = t.tensor(t.layer(5).norm2_w);
  for (std::size_t i = 0; i < b.count; ++i) ASSERT_EQ(p[b.offset + i], 0.f);
  for (std::size_t i = 0; i < w.count; ++i) ASSERT_EQ(p[w.offset + i], 1.f);
}

// llm.c decays wte, wpe and the four matrices of each block; nothing else. The seed model decays all.
TEST(Gpt2Params, WeightDecayRunsCoverTheMatricesOnly) {
  const model::ModelDims d = gpt2_dims(64, 3, 2, 100, 32, 128);
  model::TransformerParams t(d);
  const auto runs = t.decay_runs();
  ASSERT_EQ(runs.size(), 6u);  // two per block
  EXPECT_EQ(runs.front().begin, 0u);
  EXPECT_EQ(runs.back().end, t.flat_size());
  for (std::size_t k = 1; k < runs.size(); ++k) {
    EXPECT_EQ(runs[k].begin, runs[k - 1].end);
    EXPECT_NE(runs[k].decay, runs[k - 1].decay);
  }
  std::size_t decayed = 0;
  for (const auto& r : runs)
    for (const auto& x : t.tensors())
      if (x.offset >= r.begin && x.offset < r.end) {
        EXPECT_EQ(r.decay, x.decay) << x.name;
        if (r.decay) decayed += x.count;
      }
  const std::size_t C = 64, L = 3;
  EXPECT_EQ(decayed, 128 * C + 32 * C + L * (3 * C * C + C * C + 4 * C * C + 4 * C * C));
  EXPECT_FALSE(t.tensor(t.layer(0).in_proj_b).decay);
  EXPECT_FALSE(t.tensor(t.final_norm_w()).decay);
  EXPECT_TRUE(t.tensor(t.pos_embedding()).decay);
  model::TransformerParams simple(model::ModelDims{64, 2, 2, 100, 32});
  ASSERT_EQ(simple.decay_runs().size(), 1u);
  EXPECT_TRUE(simple.decay_runs()[0].decay);
  EXPECT_EQ(simple.decay_runs()[0].end, simple.flat_size());
}
