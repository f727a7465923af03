// CPU tests of the MoE references (tests/reference/moe_ref.h): DeepSpeed's capacity formula,
// hand-worked routings (positions, dropping, ties, top-2's second route after the first), the aux
// loss, the gate backward against finite differences, the permutations' adjoint identities, and
// the grouped GEMM against one dense GEMM per group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/moe_gate.cuh"
#include "runtime/error.h"
#include "tests/reference/gemm_ref.h"
#include "tests/reference/moe_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;

TEST(MoeRef, CapacityFormula) {
  EXPECT_EQ(ref::moe_capacity(8192, 64, 1, 1.0, 4), 128);
  EXPECT_EQ(ref::moe_capacity(8192, 8, 2, 1.25, 4), 2560);  // ceil(1024 · 2.5)
  EXPECT_EQ(ref::moe_capacity(10, 64, 1, 1.0, 4), 4);       // min_capacity wins
  EXPECT_EQ(ref::moe_capacity(7, 3, 2, 1.0, 0), 5);         // ceil(7/3 · 2) = ceil(4.67)
  EXPECT_EQ(ref::moe_capacity(7, 3, 1, 0.5, 0), 2);         // ceil(1.17)
}

// DeepSpeed's _capacity multiplies the Python float tokens / experts by an fp32 tensor of the factor:
// both operands and the product are fp32, and the ceil of that differs from the exact one both ways
// (bench/peers/moe_cpu_check.py's cases show DeepSpeed 0.19.8 giving these values).
TEST(MoeRef, CapacityRoundsAsDeepSpeedsFp32Product) {
  for (auto capacity : {ref::moe_capacity, kernels::moe_capacity}) {
    // 50 · fp32(1.1) = 50 · 1.10000002384 = 55.0000012, which rounds to 55 (fp32 ulp at 55: 3.8e-6);
    // in double 50 · 1.1 = 55.00000000000001, ceil 56.
    EXPECT_EQ(capacity(100, 2, 1, 1.1, 0), 55);
    // fp32(70 / 6) · fp32(1.2) = 11.666667 · 1.20000005 = 14.00000094 -> 14.00000095 in fp32: ceil 15;
    // in double 70 / 6 · 1.2 = 13.999999999999998, ceil 14.
    EXPECT_EQ(capacity(70, 6, 1, 1.2, 0), 15);
    // top-2 doubles the factor first: 12.5 · fp32(2.4) = 30.0000012 -> 30.0000019: 31 (double: 30.0).
    EXPECT_EQ(capacity(50, 4, 2, 1.2, 0), 31);
    // 11.666667 · fp32(0.6) = 7.00000047: 8 (double: 6.999999999999999, 7).
    EXPECT_EQ(capacity(70, 6, 2, 0.3, 0), 8);
    EXPECT_EQ(capacity(70, 6, 2, 0.3, 9), 9);  // min_capacity still wins
  }
}

// Token s's logits put the maximum on `top` (and the second largest on `second`).
std::vector<float> routed_logits(const std::vector<int>& top, const std::vector<int>& second, int E) {
  std::vector<float> l(top.size() * E, 0.f);
  for (std::size_t s = 0; s < top.size(); ++s) {
    l[s * E + top[s]] = 3.f;
    if (!second.empty()) l[s * E + second[s]] = 1.5f;
  }
  return l;
}

TEST(MoeRef, Top1PositionsDroppingAndTies) {
  auto logits = routed_logits({0, 0, 1, 0, 2}, {}, 3);
  logits.insert(logits.end(), {1.f, 1.f, 0.f});  // token 5: a tie between 0 and 1 goes to 0
  const auto g = ref::moe_gate_forward(logits, 6, 3, 1, true, 2);
  EXPECT_EQ(g.expert, (std::vector<std::int32_t>{0, 0, 1, 0, 2, 0}));
  EXPECT_EQ(g.position, (std::vector<std::int32_t>{0, 1, 0, -1, 0, -1}));
  EXPECT_EQ(g.expert_counts, (std::vector<std::int32_t>{4, 1, 1}));
  EXPECT_EQ(g.kept_counts, (std::vector<std::int32_t>{2, 1, 1}));
  EXPECT_EQ(g.offsets, (std::vector<std::int32_t>{0, 2, 3, 4}));
  EXPECT_EQ(g.dropped, 2);
  EXPECT_EQ(g.weight[3], 0.0);
  EXPECT_NEAR(g.weight[0], g.probs[0], 1e-15);  // top-1 weights are the probability, not normalized
  // Without dropping the capacity is the largest count.
  const auto nd = ref::moe_gate_forward(logits, 6, 3, 1, false, 0);
  EXPECT_EQ(nd.capacity, 4);
  EXPECT_EQ(nd.dropped, 0);
  EXPECT_EQ(nd.position, (std::vector<std::int32_t>{0, 1, 0, 2, 0, 3}));
}

TEST(MoeRef, Top2SecondRouteFollowsAllFirstRoutes) {
  // Tokens' (first, second): (0,1) (1,0) (0,2) (0,1)
  const auto logits = routed_logits({0, 1, 0, 0}, {1, 0, 2, 1}, 3);
  const auto g = ref::moe_gate_forward(logits, 4, 3, 2, true, 4);
  // Expert 0: first routes of tokens 0, 2, 3 at 0..2, then token 1's second route at 3.
  // Expert 1: token 1's first route at 0, then second routes of tokens 0 and 3 at 1, 2.
  EXPECT_EQ(g.position, (std::vector<std::int32_t>{0, 1, 0, 3, 1, 0, 2, 2}));
  EXPECT_EQ(g.expert_counts, (std::vector<std::int32_t>{4, 3, 1}));
  const auto d = ref::moe_gate_forward(logits, 4, 3, 2, true, 3);  // capacity 3 drops token 1's second route
  EXPECT_EQ(d.position[3], -1);
  EXPECT_EQ(d.weight[3], 0.0);
  EXPECT_NEAR(d.weight[2], 1.0, 1e-15);  // the one kept route is normalized to 1
  EXPECT_NEAR(g.weight[0] + g.weight[1], 1.0, 1e-15);
  EXPECT_EQ(d.dropped, 1);
}

TEST(MoeRef, AuxLossOfUniformGatesIsOne) {
  // p = 1/E everywhere: l_aux = E · Σ (1/E) · ce = Σ ce = 1, whatever the (tied) routing.
  const auto g = ref::moe_gate_forward(std::vector<float>(7 * 5, 0.25f), 7, 5, 1, true, 7);
  EXPECT_NEAR(g.l_aux, 1.0, 1e-14);
  // Perfect concentration: every token to expert 0 with p → 1 gives l_aux → E.
  const auto c = ref::moe_gate_forward(routed_logits({0, 0, 0}, {}, 4), 3, 4, 1, true, 3);
  EXPECT_GT(c.l_aux, 0.8);
  EXPECT_LT(c.l_aux, 4.0);
}

// loss = Σ c·weight + a·l_aux with the routing held fixed (well-separated logits).
double gate_loss(const std::vector<float>& logits, int T, int E, int k, int cap, const std::vector<double>& c,
                 double a) {
  const auto g = ref::moe_gate_forward(logits, T, E, k, true, cap);
  double l = a * g.l_aux;
  for (std::size_t i = 0; i < c.size(); ++i) l += c[i] * g.weight[i];
  return l;
}

TEST(MoeRef, GateBackwardMatchesFiniteDifferences) {
  auto rng = test::fresh_rng();
  for (int k : {1, 2}) {
    const int T = 9, E = 5, cap = k == 1 ? 2 : 4;  // some routes dropped
    // Distinct logits on a 0.25 grid: h = 1e-3 never reorders them. Redrawn until some route drops.
    std::vector<float> logits(T * E);
    ref::MoeGateRef g;
    for (int tries = 0; tries < 100 && g.dropped == 0; ++tries) {
      for (int s = 0; s < T; ++s) {
        std::vector<int> perm(E);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int e = 0; e < E; ++e) logits[s * E + e] = 0.25f * perm[e];
      }
      g = ref::moe_gate_forward(logits, T, E, k, true, cap);
    }
    ASSERT_GT(g.dropped, 0);
    std::vector<double> c(T * k);
    for (auto& v : c) v = test::random_normal(1, rng)[0];
    const double a = 0.37;
    const auto dl = ref::moe_gate_backward(g, c, a);
    for (int i = 0; i < T * E; ++i) {
      auto lp = logits, lm = logits;
      lp[i] += 1e-3f;
      lm[i] -= 1e-3f;
      const double h = double(lp[i]) - double(lm[i]);
      const double fd = (gate_loss(lp, T, E, k, cap, c, a) - gate_loss(lm, T, E, k, cap, c, a)) / h;
      EXPECT_NEAR(dl[i], fd, 1e-5 + 1e-4 * std::abs(fd)) << "k=" << k << " i=" << i;
    }
  }
}

TEST(MoeRef, PermutationsAreAdjoint) {
  auto rng = test::fresh_rng();
  const int T = 11, E = 4, H = 6;
  for (int k : {1, 2}) {
    const auto logits = test::random_normal(T * E, rng);
    const auto g = ref::moe_gate_forward(logits, T, E, k, true, ref::moe_capacity(T, E, k, 1.0, 1));
    const int R = g.offsets[E];
    const auto x = test::random_normal(T * H, rng), a = test::random_normal(std::size_t(R) * H, rng);
    const auto xp = ref::moe_permute(x, g, H);
    const auto dx = ref::moe_permute_backward(a, g, H);
    double lhs = 0, rhs = 0;
    for (int i = 0; i < R * H; ++i) lhs += xp[i] * a[i];
    for (int i = 0; i < T * H; ++i) rhs += x[i] * dx[i];
    EXPECT_NEAR(lhs, rhs, 1e-9 * (1 + std::abs(lhs)));
    // Un-permute: <unpermute(yp, w), b> is linear in yp (adjoint dyp) and in w (gradient dweight).
    std::vector<float> w(g.weight.begin(), g.weight.end());
    const auto yp = test::random_normal(std::size_t(R) * H, rng), b = test::random_normal(T * H, rng);
    const auto y = ref::moe_unpermute(yp, w, g, H);
    std::vector<double> dyp, dw;
    ref::moe_unpermute_backward(b, yp, w, g, H, dyp, dw);
    double l1 = 0, l2 = 0;
    for (int i = 0; i < T * H; ++i) l1 += y[i] * b[i];
    for (int i = 0; i < R * H; ++i) l2 += yp[i] * dyp[i];
    EXPECT_NEAR(l1, l2, 1e-9 * (1 + std::abs(l1)));
    double l3 = 0;
    for (int i = 0; i < T * k; ++i) l3 += w[i] * dw[i];
    EXPECT_NEAR(l1, l3, 1e-9 * (1 + std::abs(l1)));  // the loss is linear in w too
  }
}

TEST(MoeRef, GroupedGemmIsOneGemmPerGroup) {
  auto rng = test::fresh_rng();
  const std::vector<int> rows = {3, 0, 5, 1};
  const int N = 4, K = 6, R = 9, G = 4;
  const auto x = test::random_normal(R * K, rng), w = test::random_normal(G * N * K, rng);
  const auto dy = test::random_normal(R * N, rng);
  const auto y = ref::grouped_gemm_forward(x, w, rows, N, K);
  const auto dx = ref::grouped_gemm_grad_input(dy, w, rows, N, K);
  const auto dw = ref::grouped_gemm_grad_weight(dy, x, rows, N, K);
  int row = 0;
  for (int g = 0; g < G; ++g) {
    const std::vector<float> wg(w.begin() + g * N * K, w.begin() + (g + 1) * N * K);
    if (rows[g] == 0) {
      for (int i = 0; i < N * K; ++i) EXPECT_EQ(dw[g * N * K + i], 0.0);
      continue;
    }
    const std::vector<float> xg(x.begin() + row * K, x.begin() + (row + rows[g]) * K);
    const std::vector<float> dyg(dy.begin() + row * N, dy.begin() + (row + rows[g]) * N);
    const auto yr = ref::gemm_forward(xg, wg, nullptr, rows[g], N, K);
    const auto dxr = ref::gemm_grad_input(dyg, wg, rows[g], N, K);
    const auto dwr = ref::gemm_grad_weight(dyg, xg, rows[g], N, K);
    for (int i = 0; i < rows[g] * N; ++i) EXPECT_NEAR(y[row * N + i], yr[i], 1e-12);
    for (int i = 0; i < rows[g] * K; ++i) EXPECT_NEAR(dx[row * K + i], dxr[i], 1e-12);
    for (int i = 0; i < N * K; ++i) EXPECT_NEAR(dw[g * N * K + i], dwr[i], 1e-12);
    row += rows[g];
  }
}

// The launcher's host-side capacity equals the reference's, and bad arguments are named.
TEST(MoeArgs, CapacityMatchesReferenceAndNamesBadInput) {
  for (int T : {1, 7, 100, 8192, 10000})
    for (int E : {1, 3, 8, 64})
      for (int k : {1, 2})
        for (double cf : {0.5, 1.0, 1.25, 2.0})
          for (int mc : {0, 4})
            if (k <= E) {
              EXPECT_EQ(kernels::moe_capacity(T, E, k, cf, mc), ref::moe_capacity(T, E, k, cf, mc));
            }
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { kernels::moe_capacity(16, 4, 1, 0.0, 4); }).find("capacity_factor must be"), std::string::npos);
  EXPECT_NE(message([] { kernels::moe_capacity(16, 4, 1, -1.0, 4); }).find("capacity_factor must be"),
            std::string::npos);
  EXPECT_NE(message([] { kernels::moe_capacity(16, 1, 2, 1.0, 4); }).find("need at least k experts"),
            std::string::npos);
  EXPECT_NE(message([] { kernels::moe_capacity(16, 4, 3, 1.0, 4); }).find("must be 1 or 2"), std::string::npos);
  EXPECT_NE(message([] { kernels::moe_capacity(16, 4, 1, 1.0, -1); }).find("min_capacity"), std::string::npos);
  kernels::MoeGateShape sh{16, 4, 1, true, 0};
  EXPECT_NE(message([&] { kernels::moe_gate_forward(nullptr, nullptr, sh, {}, nullptr); }).find("capacity must be > 0"),
            std::string::npos);
  sh.capacity = 4;
  EXPECT_NE(message([&] { kernels::moe_gate_forward(nullptr, nullptr, sh, {}, nullptr); }).find("must be non-null"),
            std::string::npos);
}

TEST(MoeRef, ResidualMixBackwardMatchesFiniteDifferences) {
  auto rng = test::fresh_rng();
  const int T = 5, H = 7;
  const auto ym = test::random_normal(T * H, rng), yr = test::random_normal(T * H, rng);
  const auto b = test::random_normal(T * H, rng);
  auto logits = test::random_normal(T * 2, rng);
  const float bias[2] = {0.25f, -0.5f};
  auto loss = [&](const std::vector<float>& l) {
    std::vector<double> y, c;
    ref::moe_residual_mix_forward(ym, yr, l, bias, T, H, y, c);
    double v = 0;
    for (int i = 0; i < T * H; ++i) v += b[i] * y[i];
    return v;
  };
  std::vector<double> y, c, dm, dr, dl;
  ref::moe_residual_mix_forward(ym, yr, logits, bias, T, H, y, c);
  EXPECT_NEAR(c[0] + c[1], 1.0, 1e-15);
  ref::moe_residual_mix_backward(b, ym, yr, std::vector<float>(c.begin(), c.end()), T, H, dm, dr, dl);
  for (int i = 0; i < T * 2; ++i) {
    auto lp = logits, lm = logits;
    lp[i] += 1e-3f;
    lm[i] -= 1e-3f;
    const double fd = (loss(lp) - loss(lm)) / (double(lp[i]) - double(lm[i]));
    EXPECT_NEAR(dl[i], fd, 1e-5 * (1 + std::abs(fd)));  // float coefficients: ~1e-7 relative
  }
  for (int i = 0; i < T * H; ++i) {
    EXPECT_NEAR(dm[i], c[2 * (i / H)] * b[i], 1e-6);
    EXPECT_NEAR(dr[i], c[2 * (i / H) + 1] * b[i], 1e-6);
  }
}

// Gumbel-max: with RSample, route 0 is a draw from softmax(logits) (the counter-based draws are
// uniform and independent enough for it), while the weights stay the clean probabilities.
TEST(MoeRef, RSampleRoutesByTheGumbelMaxTrick) {
  const int T = 40000, E = 4;
  const float row[E] = {0.f, std::log(2.f), std::log(3.f), std::log(4.f)};  // p = 0.1, 0.2, 0.3, 0.4
  std::vector<float> logits(std::size_t(T) * E);
  for (int s = 0; s < T; ++s)
    for (int e = 0; e < E; ++e) logits[std::size_t(s) * E + e] = row[e];
  const auto g = ref::moe_gate_forward(logits, T, E, 1, false, 0, true, false, 12345);
  for (int e = 0; e < E; ++e) {
    const double p = (e + 1) / 10.0, f = double(g.expert_counts[e]) / T;
    EXPECT_NEAR(f, p, 4 * std::sqrt(p * (1 - p) / T)) << "expert " << e;
  }
  EXPECT_NEAR(g.probs[0], 0.1, 1e-6);
  // Another seed routes differently; the same seed identically.
  const auto h = ref::moe_gate_forward(logits, T, E, 1, false, 0, true, false, 999);
  const auto g2 = ref::moe_gate_forward(logits, T, E, 1, false, 0, true, false, 12345);
  EXPECT_NE(g.expert, h.expert);
  EXPECT_EQ(g.expert, g2.expert);
  // Second-expert sampling under top-2: route 0 stays the argmax, route 1 is sampled among the rest.
  const auto t2 = ref::moe_gate_forward(logits, T, E, 2, false, 0, false, true, 7);
  std::vector<int> second(E, 0);
  for (int s = 0; s < T; ++s) {
    EXPECT_EQ(t2.expert[std::size_t(s) * 2], 3);
    ++second[t2.expert[std::size_t(s) * 2 + 1]];
  }
  EXPECT_EQ(second[3], 0);
  for (int e = 0; e < 3; ++e) {
    const double p = (e + 1) / 6.0, f = double(second[e]) / T;
    EXPECT_NEAR(f, p, 4 * std::sqrt(p * (1 - p) / T)) << "second expert " << e;
  }
}

// Random token selection: an expert over capacity keeps `capacity` tokens chosen by the key (not
// the first ones), numbered in token order; the kept set changes with the seed, the counts do not.
TEST(MoeRef, RandomTokenSelectionKeepsCapacityByKey) {
  const int T = 50, E = 2, cap = 10;
  std::vector<float> logits(T * E, 0.f);
  for (int s = 0; s < T; ++s) logits[s * E + (s % 5 == 0)] = 1.f;  // 40 tokens to expert 0, 10 to 1
  const auto g = ref::moe_gate_forward(logits, T, E, 1, true, cap, false, false, 77, true);
  const auto plain = ref::moe_gate_forward(logits, T, E, 1, true, cap);
  EXPECT_EQ(g.kept_counts, plain.kept_counts);
  EXPECT_EQ(g.dropped, 30);
  std::vector<int> kept;
  std::vector<std::uint64_t> keys_kept, keys_dropped;
  for (int s = 0; s < T; ++s) {
    if (g.expert[s] != 0) {
      EXPECT_EQ(g.position[s], plain.position[s]);  // expert 1 fits: nothing selected
      continue;
    }
    const auto key = kernels::moe_rts_key(77, s, 0, E);
    if (g.position[s] >= 0) kept.push_back(g.position[s]), keys_kept.push_back(key);
    else keys_dropped.push_back(key);
  }
  ASSERT_EQ(kept.size(), std::size_t(cap));
  for (int i = 0; i < cap; ++i) EXPECT_EQ(kept[i], i);  // in token order
  EXPECT_GT(*std::min_element(keys_kept.begin(), keys_kept.end()),
            *std::max_element(keys_dropped.begin(), keys_dropped.end()));
  EXPECT_NE(g.position, plain.position);  // not the first ten (a 1 in C(40,10) chance to be)
  const auto h = ref::moe_gate_forward(logits, T, E, 1, true, cap, false, false, 78, true);
  EXPECT_NE(g.position, h.position);
}
