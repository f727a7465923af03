// @brief LAMB on the CPU: the reference (tests/reference/lamb_ref.h) on a hand-worked step, the
// trust ratio's clamps and zero-norm rule; the host LAMB of --device cpu (train/lamb_optimizer.h)
// against the reference's fp32-master path over several odd tensors.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/reference/lamb_ref.h"
#include "tests/support/test_support.h"
#include "train/checkpoint.h"
#include "train/lamb_optimizer.h"

namespace cutrain {
namespace {

using kernels::LambParams;
using kernels::LambTensor;
using kernels::OptimizerLayout;

// One element: the ratio times u is |w| sign(u), so w' = w - lr sqrt(1 - b2) / (1 - b1) |w|.
TEST(LambRef, HandWorkedSingleElementStep) {
  LambParams p;
  p.lr = 0.1f;
  p.eps = 0.f;
  p.step = 1;
  std::vector<float> params{2.f}, master{2.f}, m{0.f}, v{0.f}, grads{1.f};
  std::vector<double> ratios;
  ref::lamb_step(OptimizerLayout::Baseline, p, 1.0, {{0, 1, true}}, params, grads, master, m, v, nullptr, &ratios);
  const double b1 = p.beta1, b2 = p.beta2;  // the float betas, as the kernel takes them
  const double u = (1 - b1) / std::sqrt(1 - b2);  // m / sqrt(v) after one step from zero moments
  EXPECT_NEAR(ratios[0], 2.0 / u, 1e-12);
  EXPECT_NEAR(master[0], 2.0 - 0.1 * std::sqrt(1 - b2) / (1 - b1) * 2.0, 1e-6);
  EXPECT_FLOAT_EQ(m[0], float(1 - b1));
  EXPECT_FLOAT_EQ(v[0], float(1 - b2));
}

TEST(LambRef, RatioClampsAndZeroNorms) {
  LambParams p;
  p.max_coeff = 2.f;
  p.min_coeff = 0.5f;
  // Tensor 0: |w| = 1000 for |u| = 1 per element -> clamped to 2; tensor 1: |w| tiny -> 0.5;
  // tensor 2: zero weights -> 1.
  std::vector<float> w{1000.f, -1000.f, 1e-6f, 1e-6f, 0.f, 0.f};
  std::vector<float> g{1.f, -1.f, 1.f, 1.f, 1.f, -1.f}, m(6, 0.f), v(6, 0.f), params = w, master = w;
  std::vector<double> ratios;
  ref::lamb_step(OptimizerLayout::Baseline, p, 1.0, {{0, 2, true}, {2, 2, true}, {4, 2, false}}, params, g, master, m, v,
                 nullptr, &ratios);
  EXPECT_EQ(ratios[0], 2.0);
  EXPECT_EQ(ratios[1], 0.5);
  EXPECT_EQ(ratios[2], 1.0);
  std::vector<double> host_ratios;
  std::vector<float> hw = w, hm(6, 0.f), hv(6, 0.f);
  train::host_lamb_step(p, 1.0, {{0, 2, true}, {2, 2, true}, {4, 2, false}}, hw.data(), g.data(), hm.data(), hv.data(),
                        &host_ratios);
  EXPECT_EQ(host_ratios, ratios);
}

TEST(LambHost, MatchesTheReferenceOverOddTensors) {
  auto rng = test::fresh_rng();
  const std::vector<LambTensor> tensors{{0, 1, true}, {64, 1000, false}, {1088, 4097, true}, {5248, 77, true}};
  const std::size_t n = 5248 + 77 + 5;
  std::vector<float> w = test::random_normal(n, rng, 0.f, 0.3f), m(n, 0.f), v(n, 0.f);
  std::vector<float> rw = w, rparams = test::round_bf16(w), rm = m, rv = v;
  LambParams p;
  p.lr = 1e-2f;
  p.weight_decay = 0.01f;
  for (int step = 1; step <= 4; ++step) {
    p.step = step;
    p.eps_inside_sqrt = step == 3;
    p.bias_correction = step != 4;
    const auto g = test::random_normal(n, rng, 0.f, 1e-2f);
    std::vector<double> hr, rr;
    train::host_lamb_step(p, 0.7, tensors, w.data(), g.data(), m.data(), v.data(), &hr);
    ref::lamb_step(OptimizerLayout::Baseline, p, 0.7, tensors, rparams, g, rw, rm, rv, nullptr, &rr);
    for (std::size_t t = 0; t < tensors.size(); ++t) EXPECT_NEAR(hr[t], rr[t], 1e-12 * rr[t]) << "tensor " << t;
    EXPECT_LE(test::rel_error(w, rw), 1e-7) << "step " << step;
    EXPECT_LE(test::rel_error(m, rm), 1e-7) << "step " << step;
    EXPECT_LE(test::rel_error(v, rv), 1e-7) << "step " << step;
  }
  // The padding between tensors is never touched.
  EXPECT_EQ(m[1], 0.f);
  EXPECT_EQ(m[n - 1], 0.f);
}

// The model's parameter tensors, one LambTensor each, with their decay flags (GPT-2: no decay for
// biases and LayerNorm).
TEST(LambHost, TensorsAreTheModelsParameterTensors) {
  model::ModelDims d;
  d.hidden = 64, d.layers = 2, d.heads = 2, d.vocab = 100, d.max_seq = 16, d.arch = model::Arch::Gpt2;
  const model::TransformerParams table(d);
  const auto t = train::lamb_tensors(table);
  ASSERT_EQ(t.size(), table.tensors().size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].begin, table.tensor(int(i)).offset);
    EXPECT_EQ(t[i].count, table.tensor(int(i)).count);
    EXPECT_EQ(t[i].decay, table.tensor(int(i)).decay);
  }
  EXPECT_NO_THROW(kernels::LambPlan::make(t));
}

TEST(LambCheckpoint, ResumeAcrossOptimizerTypesIsRefused) {
  const nlohmann::json lamb = {{"optimizer", "Lamb"}}, adamw = {{"optimizer", "AdamW"}}, old = nlohmann::json::object();
  EXPECT_NO_THROW(train::check_checkpoint_optimizer(lamb, train::OptimizerType::Lamb, "c.json"));
  EXPECT_NO_THROW(train::check_checkpoint_optimizer(old, train::OptimizerType::AdamW, "c.json"));
  try {
    train::check_checkpoint_optimizer(lamb, train::OptimizerType::AdamW, "c.json");
    ADD_FAILURE() << "no error";
  } catch (const train::OptimizerMismatchError& e) {
    EXPECT_NE(e.message().find("c.json: optimizer: the checkpoint holds the state of optimizer Lamb, this run's "
                               "optimizer.type is AdamW"),
              std::string::npos)
        << e.message();
  }
  EXPECT_THROW(train::check_checkpoint_optimizer(adamw, train::OptimizerType::Lamb, "c.json"), train::OptimizerMismatchError);
  EXPECT_THROW(train::check_checkpoint_optimizer(old, train::OptimizerType::Lamb, "c.json"), train::OptimizerMismatchError);
  EXPECT_THROW(train::check_checkpoint_optimizer(adamw, train::OptimizerType::Adam, "c.json"), train::OptimizerMismatchError);
}

}  // namespace
}  // namespace cutrain
