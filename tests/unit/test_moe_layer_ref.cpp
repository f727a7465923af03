// CPU tests of the MoE layer's reference (model/moe_reference.h) and configuration: every gradient
// (input, gate, both expert weights, through the combine weights and the aux loss) against central
// finite differences with the routing held fixed, dropping and the capacity of train and eval,
// random token selection's kept routes by their keys, and bad configurations named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/moe_gate.cuh"
#include "model/moe_config.h"
#include "model/moe_reference.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using model::MoeConfig;

namespace {

std::vector<double> normal(std::size_t n, std::mt19937_64& rng, double sd) {
  const auto f = test::random_normal(n, rng, 0.f, float(sd));
  return {f.begin(), f.end()};
}

struct Loss {
  std::vector<double> c;  // loss = Σ c·y + a·l_aux
  double a;
};

double loss_of(model::MoeReference& r, const std::vector<double>& p, const std::vector<double>& x, int T,
               const Loss& L, std::uint64_t seed) {
  std::vector<double> y(x.size());
  const double l_aux = r.forward(p.data(), x.data(), T, true, y.data(), seed);
  double l = L.a * l_aux;
  for (std::size_t i = 0; i < y.size(); ++i) l += L.c[i] * y[i];
  return l;
}

}  // namespace

TEST(MoeLayerRef, GradientsMatchFiniteDifferences) {
  auto rng = test::fresh_rng();
  // top-1, top-2, top-2 with the residual MLP (PR-MoE), top-1 RSample + RTS, top-2 Jitter + 2nd-expert sampling
  for (int variant = 0; variant < 5; ++variant) {
    const int k = variant == 0 || variant == 3 ? 1 : 2;
    MoeConfig c;
    c.hidden = 6, c.ffn = 5, c.experts = 4, c.k = k, c.capacity_factor = 0.75, c.min_capacity = 1;
    c.use_residual = variant == 2;
    if (variant == 3) c.noisy_gate_policy = model::MoeNoisyGate::RSample, c.use_rts = true;
    if (variant == 4) c.noisy_gate_policy = model::MoeNoisyGate::Jitter, c.top2_2nd_expert_sampling = true;
    const std::uint64_t seed = rng();
    const int T = 10;
    const auto lay = model::moe_param_layout(c);
    model::MoeReference r(c);
    std::vector<double> p, x;
    for (int tries = 0;; ++tries) {  // inputs whose routing survives a step of h
      ASSERT_LT(tries, 50);
      p = normal(lay.total, rng, 0.5);
      x = normal(std::size_t(T) * c.hidden, rng, 1.0);
      std::vector<double> y(x.size());
      r.forward(p.data(), x.data(), T, true, y.data(), seed);
      if (r.routing_gap() > 1e-3 && r.dropped() > 0) break;
    }
    const Loss L{normal(x.size(), rng, 1.0), 0.3};
    loss_of(r, p, x, T, L, seed);
    std::vector<double> dx(x.size()), dp(lay.total, 0.0);
    r.backward(p.data(), L.c.data(), L.a, dx.data(), dp.data());
    const double h = 1e-6;
    auto fd = [&](std::vector<double>& v, std::size_t i) {
      const double v0 = v[i];
      v[i] = v0 + h;
      const double lp = loss_of(r, p, x, T, L, seed);
      v[i] = v0 - h;
      const double lm = loss_of(r, p, x, T, L, seed);
      v[i] = v0;
      return (lp - lm) / (2 * h);
    };
    for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], fd(x, i), 1e-6) << "variant " << variant << " dx " << i;
    for (std::size_t i = 0; i < lay.total; ++i) EXPECT_NEAR(dp[i], fd(p, i), 1e-6) << "variant " << variant << " dparam " << i;
  }
}

TEST(MoeLayerRef, CapacityTrainEvalAndNoDrop) {
  auto rng = test::fresh_rng();
  MoeConfig c;
  c.hidden = 4, c.ffn = 3, c.experts = 3, c.k = 1, c.capacity_factor = 0.5, c.eval_capacity_factor = 2.0;
  c.min_capacity = 0;
  const int T = 12;
  const auto p = normal(model::moe_param_layout(c).total, rng, 1.0);
  const auto x = normal(std::size_t(T) * c.hidden, rng, 1.0);
  std::vector<double> y(x.size());
  model::MoeReference r(c);
  r.forward(p.data(), x.data(), T, true, y.data());
  EXPECT_EQ(r.capacity(), 2);  // ceil(12/3 · 0.5)
  r.forward(p.data(), x.data(), T, false, y.data());
  EXPECT_EQ(r.capacity(), 8);  // eval factor 2.0
  c.drop_tokens = false;
  model::MoeReference nd(c);
  nd.forward(p.data(), x.data(), T, true, y.data());
  EXPECT_EQ(nd.dropped(), 0);
  EXPECT_EQ(nd.capacity(), *std::max_element(nd.expert_counts().begin(), nd.expert_counts().end()));
}

TEST(MoeLayerRef, BadConfigurationsAreNamed) {
  auto message = [](MoeConfig c, int tokens) {
    try {
      model::validate(c, tokens, "moe.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  MoeConfig ok;
  ok.hidden = 8, ok.ffn = 16, ok.experts = 4;
  EXPECT_EQ(message(ok, 32), "no error");
  auto with = [&](auto f) {
    MoeConfig c = ok;
    f(c);
    return c;
  };
  EXPECT_NE(message(with([](MoeConfig& c) { c.k = 2, c.experts = 1; }), 0).find("k = 2 is more than num_experts = 1"),
            std::string::npos);
  EXPECT_NE(message(with([](MoeConfig& c) { c.k = 3; }), 0).find("k must be 1 (top-1) or 2"), std::string::npos);
  EXPECT_NE(message(with([](MoeConfig& c) { c.capacity_factor = 0; }), 0).find("capacity_factor must be"),
            std::string::npos);
  EXPECT_NE(message(with([](MoeConfig& c) { c.eval_capacity_factor = -1; }), 0).find("eval_capacity_factor"),
            std::string::npos);
  EXPECT_NE(message(with([](MoeConfig& c) { c.experts = 0; }), 0).find("num_experts must be"), std::string::npos);
  EXPECT_NE(message(with([](MoeConfig& c) { c.min_capacity = -2; }), 0).find("min_capacity must be"),
            std::string::npos);
  EXPECT_NE(message(ok, 3).find("needs at least min_capacity = 4 tokens"), std::string::npos);
  EXPECT_NE(message(with([](MoeConfig& c) { c.hidden = 0; }), 0).find("moe.json: hidden must be"), std::string::npos);
  EXPECT_NE(message(with([](MoeConfig& c) { c.k = 2, c.use_rts = true; }), 0).find("use_rts (random token"),
            std::string::npos);
  EXPECT_NE(message(with([](MoeConfig& c) { c.k = 2, c.noisy_gate_policy = model::MoeNoisyGate::RSample; }), 0)
                .find("RSample routes top-1 only"),
            std::string::npos);
}

// use_rts alone (--moe_use_rts true, the CLI's top-1 default): the routes are the plain top-1's;
// an expert over capacity keeps the `capacity` routes with the largest kernels::moe_rts_key of the
// forward's Gumbel stream (the GPU gate's keys), numbered in token order; in training and in
// evaluation (DeepSpeed applies it in both); another seed keeps another set.
TEST(MoeLayerRef, RandomTokenSelectionKeepsTheLargestKeys) {
  auto rng = test::fresh_rng();
  MoeConfig c;
  c.hidden = 5, c.ffn = 7, c.experts = 3, c.k = 1, c.min_capacity = 1;
  c.capacity_factor = c.eval_capacity_factor = 0.5;  // capacity 7: 21 slots for 37 tokens, routes dropped
  const int T = 37, E = c.experts;
  const auto lay = model::moe_param_layout(c);
  const auto p = normal(lay.total, rng, 0.5);
  const auto x = normal(std::size_t(T) * c.hidden, rng, 1.0);
  MoeConfig cr = c;
  cr.use_rts = true;
  model::MoeReference first(c), rts(cr);
  std::vector<double> y0(x.size()), y1(x.size());
  for (bool train : {true, false}) {
    const std::uint64_t seed = train ? rng() : 0;
    std::fill(y1.begin(), y1.end(), std::nan(""));
    first.forward(p.data(), x.data(), T, train, y0.data(), seed);
    rts.forward(p.data(), x.data(), T, train, y1.data(), seed);
    ASSERT_GT(rts.dropped(), 0) << "capacity " << rts.capacity();
    EXPECT_EQ(rts.expert(), first.expert());
    EXPECT_EQ(rts.kept_counts(), first.kept_counts());
    EXPECT_EQ(rts.dropped(), first.dropped());
    for (int e = 0; e < E; ++e) {
      std::vector<std::uint64_t> kept, dropped;
      int next = 0;
      for (int s = 0; s < T; ++s) {
        if (rts.expert()[s] != e) continue;
        const std::uint64_t key = kernels::moe_rts_key(model::moe_gumbel_seed(seed), s, e, E);
        if (rts.position()[s] >= 0) {
          EXPECT_EQ(rts.position()[s], next++) << "expert " << e << " token " << s;  // in token order
          kept.push_back(key);
        } else {
          dropped.push_back(key);
        }
      }
      EXPECT_EQ(int(kept.size()), rts.kept_counts()[e]);
      if (!dropped.empty())
        EXPECT_GT(*std::min_element(kept.begin(), kept.end()), *std::max_element(dropped.begin(), dropped.end()))
            << "expert " << e;
    }
    // A kept set that is not the first routes (each over-capacity expert's chance of keeping
    // exactly its first ones is below 1 / C(count, capacity)).
    EXPECT_NE(rts.position(), first.position());
    EXPECT_NE(y0, y1);
    for (double v : y1) ASSERT_TRUE(std::isfinite(v));
  }
  std::vector<int> pos = rts.position();
  rts.forward(p.data(), x.data(), T, true, y1.data(), 12345);
  std::vector<int> other = rts.position();
  rts.forward(p.data(), x.data(), T, true, y1.data(), 54321);
  EXPECT_TRUE(other != pos || rts.position() != pos);  // the kept set follows the seed
}
