// The CPU reference model: every parameter gradient against central finite differences in fp64
// (with and without the causal mask), and a few Adam steps on a fixed batch lower the loss.
#include <gtest/gtest.h>

#include <cmath>

#include "model/reference_model.h"
#include "runtime/error.h"
#include "tests/support/finite_difference.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {

void gradient_check(bool causal) {
  auto rng = test::fresh_rng();
  model::ModelDims d{8, 2, 2, 11, 5};
  model::TransformerParams table(d);
  std::vector<float> init(table.flat_size());
  table.init(init.data(), rng());
  std::vector<double> p(init.begin(), init.end());
  const int B = 2, S = 5;
  auto tok = test::random_ints(B * S, rng, 0, d.vocab - 1);
  auto lab = test::random_ints(B * S, rng, 0, d.vocab - 1);
  lab[3] = -100;  // an ignored row

  model::ReferenceModel<double> model(table, causal);
  // fd is rounded to float for rel_error's signature; 1e-5 leaves room for that and FD error.
  const std::vector<double> g = test::check_gradients(
      model, table, p, tok, lab, B, S,
      [&](const model::ParamTensor& t, const std::vector<float>& fd, const std::vector<double>& an) {
        double norm = 0;
        for (double v : an) norm += v * v;
        if (norm == 0) {
          for (float v : fd) EXPECT_NEAR(v, 0.0, 1e-7) << t.name;
          return;
        }
        EXPECT_LE(test::rel_error(fd, an), 1e-5) << t.name << (causal ? " (causal)" : "");
      });
  // Padding of the flat buffer gets no gradient.
  std::size_t end = 0;
  for (const auto& t : table.tensors()) {
    for (std::size_t i = end; i < t.offset; ++i) EXPECT_EQ(g[i], 0.0);
    end = t.offset + t.count;
  }
}

}  // namespace

TEST(ReferenceModel, GradientsMatchFiniteDifferences) { gradient_check(false); }
TEST(ReferenceModel, GradientsMatchFiniteDifferencesCausal) { gradient_check(true); }

TEST(ReferenceModel, CausalMaskIgnoresTheFuture) {
  auto rng = test::fresh_rng();
  model::ModelDims d{16, 1, 2, 13, 6};
  model::TransformerParams table(d);
  std::vector<float> p(table.flat_size());
  table.init(p.data(), rng());
  auto tok = test::random_ints(6, rng, 0, 12);
  auto lab = test::random_ints(6, rng, 0, 12);
  model::ReferenceModel<float> causal(table, true), full(table, false);
  causal.forward(p.data(), tok.data(), lab.data(), 1, 6);
  std::vector<float> before = causal.logits();
  full.forward(p.data(), tok.data(), lab.data(), 1, 6);
  tok[5] = (tok[5] + 1) % 13;  // changing the last token leaves earlier causal logits alone
  causal.forward(p.data(), tok.data(), lab.data(), 1, 6);
  for (std::size_t i = 0; i < 5u * 13u; ++i) EXPECT_FLOAT_EQ(causal.logits()[i], before[i]);
  // and the unmasked model is different from the masked one at position 0
  double diff = 0;
  for (std::size_t i = 0; i < 13; ++i) diff += std::abs(full.logits()[i] - before[i]);
  EXPECT_GT(diff, 1e-4);
}

TEST(ReferenceModel, AdamStepsLowerTheLossOnAFixedBatch) {
  auto rng = test::fresh_rng();
  model::ModelDims d{32, 2, 4, 50, 16};
  model::TransformerParams table(d);
  std::vector<float> p(table.flat_size()), g(table.flat_size()), m(table.flat_size(), 0.f), v(table.flat_size(), 0.f);
  table.init(p.data(), rng());
  const int B = 2, S = 16;
  auto tok = test::random_ints(B * S, rng, 0, d.vocab - 1);
  auto lab = test::random_ints(B * S, rng, 0, d.vocab - 1);
  model::ReferenceModel<float> model(table);
  double first = 0, last = 0;
  for (int step = 1; step <= 8; ++step) {
    const double loss = model.forward(p.data(), tok.data(), lab.data(), B, S);
    ASSERT_TRUE(std::isfinite(loss));
    if (step == 1) first = loss;
    last = loss;
    std::fill(g.begin(), g.end(), 0.f);
    model.backward(p.data(), g.data());
    model::reference_adam_step(p.data(), g.data(), m.data(), v.data(), p.size(), 1e-2, 0.9, 0.999, 1e-8, 0.01, true, step);
  }
  EXPECT_LT(last, first - 0.5) << "first " << first << " last " << last;
  EXPECT_GT(first, std::log(50.0) - 3.0);  // initial loss near log(V) give or take the random init
}

TEST(ReferenceModel, RejectsBadTokensAndLabels) {
  model::ModelDims d{8, 1, 2, 5, 4};
  model::TransformerParams table(d);
  std::vector<float> p(table.flat_size());
  table.init(p.data(), 1);
  model::ReferenceModel<float> model(table);
  std::vector<int32_t> tok{0, 1, 5, 2}, lab{0, 1, 2, 3};
  EXPECT_THROW(model.forward(p.data(), tok.data(), lab.data(), 1, 4), Error);
  tok[2] = 4;
  lab[1] = 7;
  EXPECT_THROW(model.forward(p.data(), tok.data(), lab.data(), 1, 4), Error);
  EXPECT_THROW(model.forward(p.data(), tok.data(), lab.data(), 1, 5), Error);  // seq > max_seq
}

// --pad_vocab: a model whose embedding and output projection have padded rows computes the same
// loss and the same gradients as the unpadded model holding its real rows, and its padded rows get
// zero gradient (whatever their values: they are random here, so a leak would show).
TEST(ReferenceModel, PaddedVocabularyIsInvisible) {
  auto rng = test::fresh_rng();
  model::ModelDims d{8, 1, 2, 11, 5};
  model::ModelDims dp = d;
  dp.padded_vocab = 16;
  model::TransformerParams plain(d), padded(dp);
  ASSERT_EQ(padded.tensor(padded.output_w()).shape[0], 16);
  std::vector<float> pi(padded.flat_size());
  padded.init(pi.data(), rng());
  std::vector<double> pp(pi.begin(), pi.end()), p0(plain.flat_size(), 0.0);
  for (std::size_t i = 0; i < plain.tensors().size(); ++i) {  // the real rows: each tensor's leading part
    const model::ParamTensor& a = plain.tensor(int(i));
    const model::ParamTensor& b = padded.tensor(int(i));
    ASSERT_EQ(a.name, b.name);
    std::copy(pp.begin() + b.offset, pp.begin() + b.offset + a.count, p0.begin() + a.offset);
  }
  const int B = 2, S = 5;
  auto tok = test::random_ints(B * S, rng, 0, d.vocab - 1);
  auto lab = test::random_ints(B * S, rng, 0, d.vocab - 1);
  model::ReferenceModel<double> m0(plain, true), mp(padded, true);
  const double l0 = m0.forward(p0.data(), tok.data(), lab.data(), B, S);
  const double lp = mp.forward(pp.data(), tok.data(), lab.data(), B, S);
  EXPECT_DOUBLE_EQ(l0, lp);
  std::vector<double> g0(plain.flat_size(), 0.0), gp(padded.flat_size(), 0.0);
  m0.backward(p0.data(), g0.data());
  mp.backward(pp.data(), gp.data());
  for (std::size_t i = 0; i < plain.tensors().size(); ++i) {
    const model::ParamTensor& a = plain.tensor(int(i));
    const model::ParamTensor& b = padded.tensor(int(i));
    for (std::size_t k = 0; k < b.count; ++k) {
      const double want = k < a.count ? g0[a.offset + k] : 0.0;
      ASSERT_NEAR(gp[b.offset + k], want, 1e-12 + 1e-9 * std::abs(want)) << b.name << " element " << k;
    }
  }
  // Tokens and labels of the padded rows are still out of range.
  tok[0] = 12;
  EXPECT_THROW(mp.forward(pp.data(), tok.data(), lab.data(), B, S), Error);
}

// Pipeline stages: the model cut into spans (embedding + blocks, blocks, blocks + head), each
// span's output fed to the next and the gradients back, gives the whole model's loss and
// gradients bit for bit (the same operations in the same order; GPT-2's tied head adds into the
// token embedding's gradient before the embedding does, as in the whole model).
class ReferenceModelSpans : public ::testing::TestWithParam<model::Arch> {};
INSTANTIATE_TEST_SUITE_P(Archs, ReferenceModelSpans, ::testing::Values(model::Arch::Simple, model::Arch::Gpt2));
TEST_P(ReferenceModelSpans, ChainedSpansEqualTheWholeModel) {
  auto rng = test::fresh_rng();
  model::ModelDims d{16, 4, 2, 13, 6};
  d.arch = GetParam();
  model::TransformerParams table(d);
  std::vector<float> p(table.flat_size());
  table.init(p.data(), rng());
  const int B = 2, S = 6;
  auto tok = test::random_ints(B * S, rng, 0, d.vocab - 1);
  auto lab = test::random_ints(B * S, rng, 0, d.vocab - 1);
  model::ReferenceModel<float> whole(table, true);
  const double loss = whole.forward(p.data(), tok.data(), lab.data(), B, S);
  std::vector<float> g(table.flat_size(), 0.f), gs(table.flat_size(), 0.f);
  whole.backward(p.data(), g.data(), 0.5);

  const model::LayerSpan spans[3] = {{true, 0, 1, false}, {false, 1, 3, false}, {false, 3, 4, true}};
  std::vector<model::ReferenceModel<float>> parts;
  for (int i = 0; i < 3; ++i) parts.emplace_back(table, true);
  std::vector<float> x, y;
  parts[0].forward_span(p.data(), spans[0], tok.data(), nullptr, nullptr, B, S, &x);
  parts[1].forward_span(p.data(), spans[1], nullptr, nullptr, x.data(), B, S, &y);
  const double l2 = parts[2].forward_span(p.data(), spans[2], nullptr, lab.data(), y.data(), B, S, nullptr);
  EXPECT_EQ(l2, loss);
  std::vector<float> dy, dx;
  parts[2].backward_span(p.data(), gs.data(), nullptr, 0.5, &dy);
  parts[1].backward_span(p.data(), gs.data(), dy.data(), 0.5, &dx);
  parts[0].backward_span(p.data(), gs.data(), dx.data(), 0.5, nullptr);
  for (std::size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], gs[i]) << "element " << i;
  EXPECT_THROW(parts[1].backward(p.data(), gs.data(), 1.0), Error);
}
