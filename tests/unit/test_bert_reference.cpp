// BERT (Arch::Bert) in the CPU reference model and its parameter table: every gradient against
// central finite differences in fp64 (Pre-LN and Post-LN, with padded sequences, dropout off and
// on at a fixed key), padded keys never reaching the real rows, dropout's keying (off = the eval
// path; the step and the micro-batch change the masks), HF's names, DeepSpeed's init and decay.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/reference_model.h"
#include "tests/support/finite_difference.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {

// vocab 13: tokens 0..10, [MASK] 11, [PAD] 12; 16 embedding rows.
model::ModelDims bert_dims(bool pre_ln, float attn_p, float hidden_p) {
  model::ModelDims d{16, 2, 2, 13, 6};
  d.padded_vocab = 16;
  d.intermediate = 24;
  d.arch = model::Arch::Bert;
  d.bert.pre_layer_norm = pre_ln;
  d.bert.attn_dropout_ratio = attn_p;
  d.bert.hidden_dropout_ratio = hidden_p;
  d.bert.mask_id = 11;
  d.bert.pad_id = 12;
  return d;
}

// B sequences of S tokens; sequence b (b > 0) padded over its last b + 1 positions. Labels at
// about half the real positions (the masked-LM targets), -100 elsewhere and at every pad.
struct Batch {
  std::vector<std::int32_t> tok, lab;
};
Batch padded_batch(int B, int S, std::mt19937_64& rng) {
  Batch b{test::random_ints(B * S, rng, 0, 11), test::random_ints(B * S, rng, 0, 10)};
  std::bernoulli_distribution half(0.5);
  for (int s = 0; s < B; ++s)
    for (int t = 0; t < S; ++t) {
      const int m = s * S + t;
      const bool pad = s > 0 && t >= S - (s + 1);
      if (pad) b.tok[m] = 12;
      if (pad || half(rng)) b.lab[m] = -100;
    }
  b.lab[0] = 3;  // at least one target
  return b;
}

// The table's init with every tensor spread (0.02 leaves the model near uniform).
std::vector<double> spread_params(const model::TransformerParams& table, std::mt19937_64& rng) {
  std::vector<float> init(table.flat_size());
  table.init(init.data(), rng());
  std::uniform_real_distribution<double> u(-0.5, 0.5);
  std::vector<double> p(init.begin(), init.end());
  for (const auto& t : table.tensors())
    for (std::size_t i = 0; i < t.count; ++i) p[t.offset + i] += u(rng);
  return p;
}

struct Case {
  bool pre_ln;
  bool dropout;
};

class BertGradients : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(BertGradients, MatchFiniteDifferences) {
  const Case c = GetParam();
  auto rng = test::fresh_rng();
  const model::ModelDims d = bert_dims(c.pre_ln, c.dropout ? 0.3f : 0.f, c.dropout ? 0.2f : 0.f);
  model::TransformerParams table(d);
  std::vector<double> p = spread_params(table, rng);
  const int B = 3, S = 5;
  const Batch b = padded_batch(B, S, rng);
  model::ReferenceModel<double> model(table);
  model.set_dropout(rng(), 7, 1);
  const std::vector<double> g = test::check_gradients(
      model, table, p, b.tok, b.lab, B, S,
      test::every_tensor_within(1e-5));
  // The tied decoder's padded rows and [PAD]'s word embedding: never a target, never attended.
  const auto& wte = table.tensor(table.embedding());
  for (std::size_t i = std::size_t(d.vocab) * d.hidden; i < wte.count; ++i) ASSERT_EQ(g[wte.offset + i], 0.0);
  const auto& bias = table.tensor(table.output_b());
  for (std::size_t i = std::size_t(d.vocab); i < bias.count; ++i) ASSERT_EQ(g[bias.offset + i], 0.0);
}

INSTANTIATE_TEST_SUITE_P(Bert, BertGradients,
                         ::testing::Values(Case{true, false}, Case{true, true}, Case{false, false}, Case{false, true}),
                         [](const auto& i) {
                           return std::string(i.param.pre_ln ? "PreLN" : "PostLN") +
                                  (i.param.dropout ? "Dropout" : "NoDropout");
                         });

// A padded sequence's real rows are those of the same sequence without its padding (evaluation:
// no dropout, whose element indices depend on S), and with dropout on, changing what the pad
// positions hold (their position embeddings; [PAD]'s word row is also a decoder row) changes no
// real row.
TEST(BertReference, PaddedKeysDoNotReachTheRealRows) {
  for (bool pre_ln : {true, false}) {
    auto rng = test::fresh_rng();
    const model::ModelDims d = bert_dims(pre_ln, 0.25f, 0.25f);
    model::TransformerParams table(d);
    std::vector<double> p = spread_params(table, rng);
    const std::vector<std::int32_t> tok5{4, 11, 7, 12, 12}, lab5{-100, 2, -100, -100, -100};
    const std::vector<std::int32_t> tok3{4, 11, 7}, lab3{-100, 2, -100};
    model::ReferenceModel<double> m(table);
    m.set_training(false);
    const double l5 = m.forward(p.data(), tok5.data(), lab5.data(), 1, 5);
    const std::vector<double> logits5 = m.logits();
    const double l3 = m.forward(p.data(), tok3.data(), lab3.data(), 1, 3);
    EXPECT_NEAR(l5, l3, 1e-12);
    const std::size_t Vr = std::size_t(d.vocab_rows());
    for (std::size_t i = 0; i < 3 * Vr; ++i) ASSERT_NEAR(logits5[i], m.logits()[i], 1e-12) << "element " << i;

    m.set_training(true);
    m.set_dropout(5, 3);
    m.forward(p.data(), tok5.data(), lab5.data(), 1, 5);
    const std::vector<double> before = m.logits();
    const auto& wpe = table.tensor(table.pos_embedding());
    for (std::size_t i = 3 * std::size_t(d.hidden); i < 5 * std::size_t(d.hidden); ++i) p[wpe.offset + i] += 0.7;
    m.forward(p.data(), tok5.data(), lab5.data(), 1, 5);
    for (std::size_t i = 0; i < 3 * Vr; ++i) ASSERT_EQ(before[i], m.logits()[i]) << "element " << i;
    double pad_diff = 0;
    for (std::size_t i = 3 * Vr; i < 5 * Vr; ++i) pad_diff += std::abs(before[i] - m.logits()[i]);
    EXPECT_GT(pad_diff, 0.0) << "the pad rows themselves change";
  }
}

// Ratios 0 in training are the evaluation forward of a model with dropout; with dropout the loss
// is a function of (seed, step, micro-batch): the same key repeats it, another step or
// micro-batch draws other masks.
TEST(BertReference, DropoutIsKeyedAndOffInEvaluation) {
  for (bool pre_ln : {true, false}) {
    auto rng = test::fresh_rng();
    const model::ModelDims with = bert_dims(pre_ln, 0.1f, 0.1f), without = bert_dims(pre_ln, 0.f, 0.f);
    model::TransformerParams tw(with), t0(without);
    ASSERT_EQ(tw.flat_size(), t0.flat_size());
    std::vector<double> p = spread_params(tw, rng);
    const Batch b = padded_batch(2, 6, rng);
    model::ReferenceModel<double> mw(tw), m0(t0);
    mw.set_training(false);
    const double eval = mw.forward(p.data(), b.tok.data(), b.lab.data(), 2, 6);
    EXPECT_EQ(eval, m0.forward(p.data(), b.tok.data(), b.lab.data(), 2, 6));
    mw.set_training(true);
    mw.set_dropout(11, 1);
    const double s1 = mw.forward(p.data(), b.tok.data(), b.lab.data(), 2, 6);
    EXPECT_NE(s1, eval);
    EXPECT_EQ(s1, mw.forward(p.data(), b.tok.data(), b.lab.data(), 2, 6));
    mw.set_dropout(11, 2);
    EXPECT_NE(s1, mw.forward(p.data(), b.tok.data(), b.lab.data(), 2, 6));
    mw.set_dropout(11, 1, 1);
    EXPECT_NE(s1, mw.forward(p.data(), b.tok.data(), b.lab.data(), 2, 6));
  }
}

// The sites of model/bert_config.h: micro-batch 0's are 4l + site and 4·layers.
TEST(BertReference, DropoutSitesNumberTheBlocks) {
  EXPECT_EQ(model::bert_dropout_layer(24, 0, 0, model::BertDropoutSite::Attention), 0u);
  EXPECT_EQ(model::bert_dropout_layer(24, 0, 3, model::BertDropoutSite::AttentionOutput), 13u);
  EXPECT_EQ(model::bert_dropout_layer(24, 0, 3, model::BertDropoutSite::Output), 14u);
  EXPECT_EQ(model::bert_embedding_dropout_layer(24, 0), 96u);
  EXPECT_EQ(model::bert_dropout_layer(24, 1, 0, model::BertDropoutSite::Attention), 97u);
}

TEST(BertParams, HfNamesTiedHeadAndUnits) {
  for (bool pre_ln : {true, false}) {
    model::ModelDims d{1024, 24, 16, 50259, 512};
    d.padded_vocab = 50304;
    d.arch = model::Arch::Bert;
    d.bert.pre_layer_norm = pre_ln;
    d.bert.mask_id = 50257;
    d.bert.pad_id = 50258;
    model::TransformerParams t(d);
    // BERT-Large's encoder (24 x 12,596,224) + embeddings + MLM transform, without token types.
    const std::size_t h = 1024, F = 4096, V = 50304;
    const std::size_t block = 4 * h * h + 2 * h * F + 3 * h + h + F + h + 4 * h;
    const std::size_t want = V * h + 512 * h + 2 * h + 24 * block + h * h + h + 2 * h + V + (pre_ln ? 2 * h : 0);
    EXPECT_EQ(t.num_params(), want);
    EXPECT_TRUE(t.tied_head());
    EXPECT_EQ(t.output_w(), t.embedding());
    EXPECT_EQ(t.tensor(t.output_b()).name, "cls.predictions.bias");
    EXPECT_EQ(t.tensor(t.output_b()).shape, (std::vector<std::int64_t>{50304}));
    EXPECT_EQ(t.tensor(t.embedding()).name, "bert.embeddings.word_embeddings.weight");
    EXPECT_EQ(t.tensor(t.layer(5).in_proj_w).name, "bert.encoder.layer.5.attention.self.qkv.weight");
    EXPECT_EQ(t.tensor(t.layer(5).in_proj_w).shape, (std::vector<std::int64_t>{3 * 1024, 1024}));
    EXPECT_EQ(t.tensor(t.layer(5).norm1_w).name, "bert.encoder.layer.5.attention.output.LayerNorm.weight");
    EXPECT_EQ(t.tensor(t.layer(5).ff0_w).name, "bert.encoder.layer.5.intermediate.dense.weight");
    EXPECT_EQ(t.tensor(t.layer(5).ff2_w).name, "bert.encoder.layer.5.output.dense.weight");
    EXPECT_EQ(t.tensor(t.layer(5).norm2_b).name, "bert.encoder.layer.5.output.LayerNorm.bias");
    EXPECT_EQ(t.tensor(t.head_dense_w()).name, "cls.predictions.transform.dense.weight");
    EXPECT_EQ(t.tensor(t.head_norm_w()).name, "cls.predictions.transform.LayerNorm.weight");
    EXPECT_EQ(t.unit_of(t.embedding_norm_b()), t.embedding_unit());
    EXPECT_EQ(t.unit_of(t.head_dense_w()), t.head_unit());
    EXPECT_EQ(t.unit_of(t.output_b()), t.head_unit());
    EXPECT_EQ(t.unit_of(t.layer(23).norm2_b), t.layer_unit(23));
    if (pre_ln) EXPECT_EQ(t.tensor(t.final_norm_w()).name, "bert.encoder.final_layernorm.weight");
    else EXPECT_EQ(t.final_norm_w(), -1);
    EXPECT_EQ(t.units().back().end, t.flat_size());
    for (std::size_t u = 1; u < t.units().size(); ++u) EXPECT_EQ(t.units()[u].begin, t.units()[u - 1].end);
    // Decay: the matrices and embeddings; two runs per block plus the embedding's and the head's.
    for (const auto& x : t.tensors()) EXPECT_EQ(x.decay, x.shape.size() == 2) << x.name;
  }
}

TEST(BertParams, InitIsDeepSpeeds) {
  for (bool adjust : {true, false}) {
    model::ModelDims d{256, 8, 4, 1000, 64};
    d.arch = model::Arch::Bert;
    d.bert.initializer_range = 0.03;
    d.bert.adjust_init_range = adjust;
    model::TransformerParams t(d);
    std::vector<float> p(t.flat_size());
    t.init(p.data(), 7);
    auto stdev = [&](int idx) {
      const auto& x = t.tensor(idx);
      return test::stdev(p.data() + x.offset, x.count);
    };
    EXPECT_NEAR(stdev(t.embedding()), 0.03, 5e-4);
    EXPECT_NEAR(stdev(t.layer(2).in_proj_w), 0.03, 5e-4);
    EXPECT_NEAR(stdev(t.layer(2).ff0_w), 0.03, 5e-4);
    EXPECT_NEAR(stdev(t.head_dense_w()), 0.03, 1e-3);
    const double out = adjust ? 0.03 / 4.0 : 0.03;  // 1/sqrt(2 * 8 layers)
    EXPECT_NEAR(stdev(t.layer(2).out_proj_w), out, 5e-4);
    EXPECT_NEAR(stdev(t.layer(2).ff2_w), out, 5e-4);
    for (int idx : {t.layer(1).ff0_b, t.output_b(), t.embedding_norm_b()})
      for (std::size_t i = 0; i < t.tensor(idx).count; ++i) ASSERT_EQ(p[t.tensor(idx).offset + i], 0.f);
    for (int idx : {t.layer(1).norm2_w, t.head_norm_w(), t.embedding_norm_w()})
      for (std::size_t i = 0; i < t.tensor(idx).count; ++i) ASSERT_EQ(p[t.tensor(idx).offset + i], 1.f);
  }
}

TEST(BertParams, BadConfigsAreRefusedByField) {
  model::ModelDims d{64, 2, 2, 100, 32};
  d.arch = model::Arch::Bert;
  auto refused = [&](const model::ModelDims& x, const std::string& field) {
    try {
      x.validate();
      ADD_FAILURE() << "accepted a bad " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  model::ModelDims x = d;
  x.bert.pad_id = 100;
  refused(x, "pad_id");
  x = d;
  x.bert.attn_dropout_ratio = 1.f;
  refused(x, "attn_dropout_ratio");
  x = d;
  x.bert.layer_norm_eps = 0;
  refused(x, "layer_norm_eps");
  x = d;
  x.moe.experts = {0, 4};
  refused(x, "MoE");
}
