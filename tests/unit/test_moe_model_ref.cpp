// MoE blocks in the models: the parameter table's DeepSpeed names and packed layout (what the MoE
// layer reads as one buffer), the decay rules, the CPU reference model's every gradient (the aux
// loss's share included) against finite differences for both architectures, standard and PR-MoE,
// and the --num_experts / --moe_* resolution with its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "model/reference_model.h"
#include "runtime/error.h"
#include "tests/support/finite_difference.h"
#include "tests/support/test_support.h"
#include "train/moe_options.h"
#include "train/step_profiler.h"

using namespace cutrain;

namespace {

model::ModelDims moe_dims(model::Arch arch, bool residual, int k) {
  model::ModelDims d{8, 2, 2, 11, 5};
  d.arch = arch;
  d.moe.experts = {0, 3};
  d.moe.k = k;
  d.moe.min_capacity = 1;
  d.moe.capacity_factor = 1.0;  // top-1 over 10 tokens and 3 experts: capacity 4, some routes dropped
  d.moe.use_residual = residual;
  d.moe.loss_coeff = 0.1;  // large enough that the aux loss's share of the gate gradient shows
  return d;
}

void expect_error(const std::function<void()>& f, const std::string& want) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one containing: " << want;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

void gradient_check(model::Arch arch, bool residual, int k) {
  auto rng = test::fresh_rng();
  const model::ModelDims d = moe_dims(arch, residual, k);
  model::TransformerParams table(d);
  std::vector<float> init(table.flat_size());
  table.init(init.data(), rng());
  std::vector<double> p(init.begin(), init.end());
  const int B = 2, S = 5;
  auto tok = test::random_ints(B * S, rng, 0, d.vocab - 1);
  auto lab = test::random_ints(B * S, rng, 0, d.vocab - 1);
  model::ReferenceModel<double> model(table, true);
  model.forward(p.data(), tok.data(), lab.data(), B, S);
  ASSERT_EQ(model.moe_stats().size(), 1u);
  EXPECT_EQ(model.moe_stats()[0].layer, 1);
  EXPECT_GT(model.aux_loss(), 0.0);
  EXPECT_EQ(model.aux_loss(), model.moe_stats()[0].l_aux);
  const std::vector<double> g = test::check_gradients(
      model, table, p, tok, lab, B, S,
      [&](const model::ParamTensor& t, const std::vector<float>& fd, const std::vector<double>& an) {
        double norm = 0;
        for (double v : an) norm += v * v;
        if (norm == 0) {
          for (float v : fd) EXPECT_NEAR(v, 0.0, 1e-7) << t.name;
          return;
        }
        // A gradient near fp64's differencing noise (PR-MoE's 2-element coefficient bias): an absolute floor.
        double worst = 0;
        for (std::size_t i = 0; i < an.size(); ++i) worst = std::max(worst, std::abs(double(fd[i]) - an[i]));
        if (worst > 1e-9) {
          EXPECT_LE(test::rel_error(fd, an), 1e-5) << t.name;
        }
      });
  // The gate gets a gradient, and its aux share is part of it: without the coefficient it differs.
  const model::ParamTensor& wg = table.find(arch == model::Arch::Gpt2 ? "h.1.mlp.deepspeed_moe.gate.wg.weight"
                                                                       : "layers.1.ff.deepspeed_moe.gate.wg.weight");
  model::ModelDims d0 = d;
  d0.moe.loss_coeff = 0;
  model::TransformerParams t0(d0);
  model::ReferenceModel<double> m0(t0, true);
  m0.forward(p.data(), tok.data(), lab.data(), B, S);
  std::vector<double> g0(t0.flat_size(), 0.0);
  m0.backward(p.data(), g0.data());
  double diff = 0;
  for (std::size_t i = 0; i < wg.count; ++i) diff += std::abs(g[wg.offset + i] - g0[wg.offset + i]);
  EXPECT_GT(diff, 1e-6);
}

}  // namespace

TEST(MoeModelTable, DeepSpeedNamesAtTheLayersOffsets) {
  model::ModelDims d{64, 3, 2, 100, 16};
  d.moe.experts = {0, 4, 2};
  d.moe.use_residual = true;
  model::TransformerParams t(d);
  EXPECT_GE(t.layer(0).ff0_w, 0);
  EXPECT_EQ(t.layer(0).moe, -1);
  for (int l : {1, 2}) {
    const model::LayerIndex& L = t.layer(l);
    EXPECT_EQ(L.ff0_w, -1);
    EXPECT_EQ(L.ff2_b, -1);
    ASSERT_GE(L.moe, 0);
    const std::string p = "layers." + std::to_string(l) + ".ff.";
    const model::ParamTensor& wg = t.tensor(L.moe);
    EXPECT_EQ(wg.name, p + "deepspeed_moe.gate.wg.weight");
    EXPECT_EQ(wg.shape, (std::vector<std::int64_t>{d.moe.experts[std::size_t(l)], 64}));
    const model::MoeConfig c = d.moe.layer_config(l, d.hidden, d.ffn());
    const model::MoeParamLayout lay = model::moe_param_layout(c);
    const std::size_t F = std::size_t(d.ffn()), H = 64;
    for (int e = 0; e < c.experts; ++e) {
      const std::string ex = p + "deepspeed_moe.experts.deepspeed_experts." + std::to_string(e);
      EXPECT_EQ(t.find(ex + ".fc1.weight").offset, wg.offset + lay.w1 + std::size_t(e) * F * H);
      EXPECT_EQ(t.find(ex + ".fc2.weight").offset, wg.offset + lay.w2 + std::size_t(e) * H * F);
      EXPECT_EQ(t.find(ex + ".fc1.weight").shape, (std::vector<std::int64_t>{std::int64_t(F), 64}));
    }
    EXPECT_EQ(t.find(p + "mlp.fc1.weight").offset, wg.offset + lay.r1);
    EXPECT_EQ(t.find(p + "mlp.fc2.weight").offset, wg.offset + lay.r2);
    EXPECT_EQ(t.find(p + "coefficient.weight").offset, wg.offset + lay.cw);
    EXPECT_EQ(t.find(p + "coefficient.bias").offset, wg.offset + lay.cb);
    EXPECT_EQ(t.unit_of(L.moe), t.layer_unit(l));
    EXPECT_EQ(t.unit_of(L.norm2_b), t.layer_unit(l));
    // hidden 64: every tensor aligned, and the layer's block inside its unit
    for (const auto& x : t.tensors()) EXPECT_EQ(x.offset % model::TransformerParams::kAlign, 0u) << x.name;
    EXPECT_LE(wg.offset + lay.total, t.units()[std::size_t(t.layer_unit(l))].end);
  }
  std::size_t n = 0;
  for (const auto& x : t.tensors()) n += x.count;
  EXPECT_EQ(n, t.num_params());
}

TEST(MoeModelTable, Gpt2DecaysTheMatricesOnly) {
  model::ModelDims d{64, 2, 2, 100, 16};
  d.arch = model::Arch::Gpt2;
  d.moe.experts = {2, 0};
  d.moe.use_residual = true;
  model::TransformerParams t(d);
  EXPECT_TRUE(t.find("h.0.mlp.deepspeed_moe.gate.wg.weight").decay);
  EXPECT_TRUE(t.find("h.0.mlp.deepspeed_moe.experts.deepspeed_experts.1.fc2.weight").decay);
  EXPECT_TRUE(t.find("h.0.mlp.coefficient.weight").decay);
  EXPECT_FALSE(t.find("h.0.mlp.coefficient.bias").decay);
  EXPECT_FALSE(t.find("h.0.ln_2.bias").decay);
  EXPECT_TRUE(t.find("h.1.mlp.fc.weight").decay);
  // The decay runs tile the buffer and agree with every tensor's flag.
  for (const auto& r : t.decay_runs())
    for (const auto& x : t.tensors())
      if (x.offset >= r.begin && x.offset < r.end) {
        EXPECT_EQ(x.decay, r.decay) << x.name;
      }
}

TEST(MoeModelTable, BadMoeDimsAreNamed) {
  model::ModelDims d{8, 2, 2, 11, 5};
  d.moe.experts = {4};
  expect_error([&] { model::TransformerParams t(d); }, "list 1 entries (num_experts per block), the model has num_layers = 2");
  d.moe.experts = {0, 2};
  d.moe.k = 3;
  expect_error([&] { model::TransformerParams t(d); }, "block 1's MoE layer: k must be 1 (top-1) or 2");
}

TEST(MoeReferenceModel, GradientsMatchFiniteDifferencesSimpleTop1) { gradient_check(model::Arch::Simple, false, 1); }
TEST(MoeReferenceModel, GradientsMatchFiniteDifferencesSimpleTop2Residual) {
  gradient_check(model::Arch::Simple, true, 2);
}
TEST(MoeReferenceModel, GradientsMatchFiniteDifferencesGpt2Top2) { gradient_check(model::Arch::Gpt2, false, 2); }
TEST(MoeReferenceModel, GradientsMatchFiniteDifferencesGpt2Top1Residual) {
  gradient_check(model::Arch::Gpt2, true, 1);
}

TEST(MoeReferenceModel, EvalUsesTheEvalCapacityFactor) {
  auto rng = test::fresh_rng();
  model::ModelDims d = moe_dims(model::Arch::Simple, false, 1);
  d.moe.eval_capacity_factor = 4.0;  // capacity >= every count: nothing dropped in evaluation
  model::TransformerParams table(d);
  std::vector<float> p(table.flat_size());
  table.init(p.data(), rng());
  auto tok = test::random_ints(10, rng, 0, d.vocab - 1), lab = test::random_ints(10, rng, 0, d.vocab - 1);
  model::ReferenceModel<float> m(table);
  m.set_moe_mode(false);
  m.forward(p.data(), tok.data(), lab.data(), 2, 5);
  EXPECT_EQ(m.moe_stats()[0].capacity, 14);  // ceil(10 / 3 * 4)
  EXPECT_EQ(m.moe_stats()[0].dropped, 0);
  m.set_moe_mode(true);
  m.forward(p.data(), tok.data(), lab.data(), 2, 5);
  EXPECT_EQ(m.moe_stats()[0].capacity, 4);  // ceil(10 / 3 * 1)
}

TEST(MoeOptions, BlocksFromTheIntervalOrTheList) {
  train::MoeOptions o;
  o.num_experts = {8};
  EXPECT_EQ(train::resolve_moe(o, 4, 64).experts, (std::vector<int>{0, 8, 0, 8}));  // Megatron-DeepSpeed's every 2nd
  o.expert_interval = 3;
  EXPECT_EQ(train::resolve_moe(o, 6, 64).experts, (std::vector<int>{0, 0, 8, 0, 0, 8}));
  o.expert_interval = 0;
  o.moe_layers = "every:1";
  o.num_experts = {2, 4, 8};
  EXPECT_EQ(train::resolve_moe(o, 3, 64).experts, (std::vector<int>{2, 4, 8}));  // the pyramid
  o.moe_layers = "2,0";
  o.num_experts = {4, 2};
  const model::MoeDims m = train::resolve_moe(o, 3, 64);
  EXPECT_EQ(m.experts, (std::vector<int>{2, 0, 4}));
  EXPECT_TRUE(m.drop_tokens);
  EXPECT_FALSE(m.use_residual);
  EXPECT_DOUBLE_EQ(m.loss_coeff, 0.01);
  train::MoeOptions dense;
  EXPECT_FALSE(train::resolve_moe(dense, 3, 64).any());
}

TEST(MoeOptions, BadValuesAreNamed) {
  auto bad = [](const std::function<void(train::MoeOptions&)>& set, const std::string& want, int layers = 4,
                int tokens = 64) {
    train::MoeOptions o;
    o.num_experts = {4};
    set(o);
    expect_error([&] { train::resolve_moe(o, layers, tokens); }, want);
  };
  bad([](auto& o) { o.num_experts = {1}; o.top_k = 2; }, "--top_k 2 is more than --num_experts 1");
  bad([](auto& o) { o.top_k = 0; }, "--top_k must be 1 or 2, got 0");
  bad([](auto& o) { o.train_capacity_factor = 0; }, "--moe_train_capacity_factor must be a finite number > 0");
  bad([](auto& o) { o.eval_capacity_factor = NAN; }, "--moe_eval_capacity_factor must be a finite number > 0");
  bad([](auto& o) { o.min_capacity = -1; }, "--moe_min_capacity must be >= 0");
  bad([](auto& o) { o.min_capacity = 100; }, "--moe_min_capacity 100 is more than the micro-batch's 64 tokens");
  bad([](auto& o) { o.loss_coeff = -1; }, "--moe_loss_coeff must be a finite number >= 0");
  bad([](auto& o) { o.expert_parallel_size = 3; }, "--moe_expert_parallel_size 3 does not divide --num_experts 4");
  bad([](auto& o) { o.expert_parallel_size = 0; }, "--moe_expert_parallel_size must be >= 1");
  bad([](auto& o) { o.num_experts = {4, 8, 16}; }, "--num_experts lists 3 counts, expected 1 or one per MoE block (2)");
  bad([](auto& o) { o.num_experts = {2000}; }, "each count must be in [1, 1024], got 2000");
  bad([](auto& o) { o.moe_layers = "1,x"; }, "found 'x' in '1,x'");
  bad([](auto& o) { o.moe_layers = "1,1"; }, "block 1 is listed twice");
  bad([](auto& o) { o.moe_layers = "4"; }, "block 4 is outside [0, 4)");
  bad([](auto& o) { o.moe_layers = "every:0"; }, "every:N: expected N >= 1");
  bad([](auto& o) { o.expert_interval = 5; }, "no block is a MoE block");
  bad([](auto& o) { o.moe_layers = "1"; o.expert_interval = 2; }, "--moe_layers and --expert_interval both given");
  bad([](auto& o) { o.mlp_type = "dense"; }, "--mlp_type: expected standard or residual");
  bad([](auto& o) { o.noisy_gate_policy = "Gumbel"; }, "expected None, Jitter or RSample, found 'Gumbel'");
  bad([](auto& o) { o.noisy_gate_policy = "RSample"; o.top_k = 2; }, "RSample routes top-1 only");
  bad([](auto& o) { o.num_experts.clear(); o.given = {"--top_k"}; }, "--top_k configure MoE blocks: expected --num_experts");
  bad([](auto& o) { o.use_rts = "yes"; }, "--moe_use_rts: expected true or false, found 'yes'");
  bad([](auto& o) { o.use_rts = "True"; }, "--moe_use_rts: expected true or false, found 'True'");
  bad([](auto& o) { o.use_rts = "true"; o.top_k = 2; }, "--moe_use_rts true (random token selection) is top-1's");
  bad([](auto& o) { o.num_experts.clear(); o.given = {"--moe_use_rts"}; },
      "--moe_use_rts configure MoE blocks: expected --num_experts");
}

// --moe_use_rts: DeepSpeed's MoE default (use_rts=True) for top-1 when not given; top-2 has no
// random token selection (DeepSpeed's top2gating ignores the argument), so it is off there unless
// given true, which is refused above. The layers get it through MoeDims::layer_config.
TEST(MoeOptions, UseRtsDefaultsToDeepSpeedsForTop1) {
  train::MoeOptions o;
  o.num_experts = {4};
  EXPECT_TRUE(train::resolve_moe(o, 4, 64).use_rts);
  EXPECT_NE(train::describe_moe(train::resolve_moe(o, 4, 64)).find("random token selection"), std::string::npos);
  o.use_rts = "false";
  EXPECT_FALSE(train::resolve_moe(o, 4, 64).use_rts);
  EXPECT_NE(train::describe_moe(train::resolve_moe(o, 4, 64)).find("first tokens kept"), std::string::npos);
  o.use_rts = "true";
  const model::MoeDims m = train::resolve_moe(o, 4, 64);
  EXPECT_TRUE(m.use_rts);
  EXPECT_TRUE(m.layer_config(1, 8, 32).use_rts);
  o.use_rts.clear();
  o.top_k = 2;
  const model::MoeDims m2 = train::resolve_moe(o, 4, 64);
  EXPECT_FALSE(m2.use_rts);
  EXPECT_FALSE(m2.layer_config(1, 8, 32).use_rts);
  o.use_rts = "false";
  EXPECT_FALSE(train::resolve_moe(o, 4, 64).use_rts);
}

// The model's MoE blocks run the layer's random token selection: with use_rts the training step
// keeps other routes of an over-capacity expert than the first ones (same capacity, same drop
// count, another loss), a function of the forward's seed; evaluation's selection is the fixed
// seed 0's, so two evaluations agree.
TEST(MoeReferenceModel, UseRtsReachesTheLayersAndFollowsTheSeed) {
  auto rng = test::fresh_rng();
  model::ModelDims d = moe_dims(model::Arch::Gpt2, false, 1);
  d.moe.capacity_factor = d.moe.eval_capacity_factor = 0.5;
  model::ModelDims dr = d;
  dr.moe.use_rts = true;
  model::TransformerParams table(d), table_r(dr);
  ASSERT_EQ(table.flat_size(), table_r.flat_size());
  std::vector<double> p(table.flat_size());
  {
    std::vector<float> init(table.flat_size());
    table.init(init.data(), rng());
    p.assign(init.begin(), init.end());
  }
  const int B = 4, S = 5;
  auto tok = test::random_ints(B * S, rng, 0, d.vocab - 1), lab = test::random_ints(B * S, rng, 0, d.vocab - 1);
  model::ReferenceModel<double> first(table, true), rts(table_r, true);
  auto run = [&](model::ReferenceModel<double>& m, bool train, std::uint64_t seed) {
    m.set_moe_mode(train, seed);
    const double loss = m.forward(p.data(), tok.data(), lab.data(), B, S);
    return std::make_pair(loss, m.moe_stats()[0]);
  };
  int differs = 0;
  for (std::uint64_t step = 1; step <= 4; ++step) {
    const std::uint64_t seed = model::moe_forward_seed(rng(), int(step), 0);
    const auto [l0, s0] = run(first, true, seed);
    const auto [l1, s1] = run(rts, true, seed);
    ASSERT_GT(s0.dropped, 0);
    EXPECT_EQ(s1.capacity, s0.capacity);
    EXPECT_EQ(s1.dropped, s0.dropped);
    EXPECT_EQ(run(rts, true, seed).first, l1);  // the same seed, the same routes
    differs += l1 != l0;
  }
  EXPECT_GT(differs, 0);
  const double e1 = run(rts, false, 0).first;
  EXPECT_EQ(run(rts, false, 0).first, e1);
}

TEST(MoeOptions, CheckpointConfigRoundTripAndResumeChecks) {
  model::MoeDims m;
  m.experts = {0, 4, 0, 8};
  m.k = 2;
  m.capacity_factor = 1.25;
  m.eval_capacity_factor = 2.0;
  m.min_capacity = 3;
  m.drop_tokens = false;
  m.use_residual = true;
  m.noisy_gate_policy = model::MoeNoisyGate::Jitter;
  m.loss_coeff = 0.02;
  {  // use_rts (top-1's): written and read back; absent in older checkpoints: their runs kept the first routes
    model::MoeDims t = m;
    t.k = 1;
    t.use_rts = true;
    nlohmann::json jt = train::moe_config_json(t);
    EXPECT_EQ(jt["use_rts"], true);
    EXPECT_TRUE(train::moe_dims_from_json(jt, "ck/config.json").use_rts);
    jt.erase("use_rts");
    EXPECT_FALSE(train::moe_dims_from_json(jt, "ck/config.json").use_rts);
    jt["use_rts"] = "true";
    expect_error([&] { train::moe_dims_from_json(jt, "ck/config.json"); }, "ck/config.json: moe.use_rts: missing or of the wrong type");
    jt["use_rts"] = true;
    jt["top_k"] = 2;
    expect_error([&] { train::moe_dims_from_json(jt, "ck/config.json"); }, "moe.use_rts: true is top-1's, found top_k 2");
  }
  const nlohmann::json j = train::moe_config_json(m);
  EXPECT_EQ(j["use_rts"], false);
  EXPECT_EQ(j["mlp_type"], "residual");
  const model::MoeDims r = train::moe_dims_from_json(j, "ck/config.json");
  EXPECT_EQ(r.experts, m.experts);
  EXPECT_EQ(r.k, 2);
  EXPECT_DOUBLE_EQ(r.capacity_factor, 1.25);
  EXPECT_DOUBLE_EQ(r.eval_capacity_factor, 2.0);
  EXPECT_EQ(r.min_capacity, 3);
  EXPECT_FALSE(r.drop_tokens);
  EXPECT_TRUE(r.use_residual);
  EXPECT_EQ(r.noisy_gate_policy, model::MoeNoisyGate::Jitter);
  EXPECT_DOUBLE_EQ(r.loss_coeff, 0.02);
  nlohmann::json bad = j;
  bad.erase("top_k");
  expect_error([&] { train::moe_dims_from_json(bad, "ck/config.json"); }, "ck/config.json: moe.top_k: missing");
  bad = j;
  bad["mlp_type"] = "dense";
  expect_error([&] { train::moe_dims_from_json(bad, "ck/config.json"); }, "moe.mlp_type: expected standard or residual");
  train::check_checkpoint_moe(r, m, "ck");  // the same blocks
  model::MoeDims other = m;
  other.k = 1;  // routing options may change on resume
  train::check_checkpoint_moe(other, m, "ck");
  other.experts = {0, 4, 0, 4};
  expect_error([&] { train::check_checkpoint_moe(other, m, "ck"); }, "experts per block 0,4,0,4, the checkpoint (ck) has 0,4,0,8");
  expect_error([&] { train::check_checkpoint_moe(model::MoeDims{}, m, "ck"); }, "experts per block 0,0,0,0");
  other = m;
  other.use_residual = false;
  expect_error([&] { train::check_checkpoint_moe(other, m, "ck"); }, "--mlp_type standard, the checkpoint (ck) has residual");
}

TEST(MoeOptions, ModelFlopsCountTheActiveExperts) {
  model::ModelDims dense{64, 2, 2, 100, 16};
  model::ModelDims moe = dense;
  moe.moe.experts = {0, 8};
  moe.moe.k = 2;
  const model::TransformerParams td(dense), tm(moe);
  const double fd = train::model_flops_per_step(td, 2, 16, 1, true, nullptr);
  const double fm = train::model_flops_per_step(tm, 2, 16, 1, true, nullptr);
  // Block 1: the dense FFN (two matrices and their biases) out, the gate and 2 experts' fc1 / fc2 in.
  const double F = 256, H = 64, tokens = 32;
  const double dN = (8 * H + 2 * 2 * F * H) - (2 * F * H + F + H);
  EXPECT_DOUBLE_EQ(fm - fd, 6 * dN * tokens);
}
