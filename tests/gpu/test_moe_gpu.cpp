// @brief GPU tests of the MoE kernels against tests/reference/moe_ref.h: the gate (routing,
// positions, counts, dropping compared exactly, ties included; probabilities, weights, aux loss
// and the backward by relative error), the permutations (vector and scalar paths, fully dropped
// tokens, accumulation; the [E, C] slot layout with its empty slots zeroed, experts of 0 rows and
// at full capacity), the grouped GEMM (empty groups, more groups than one grouped call takes, bf16
// and fp32 weight gradients), the strided-batched GEMMs the slot layout runs, and the step figures'
// device merge. Fresh random inputs, outputs poisoned with NaN first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/gemm.cuh"
#include "kernels/moe_gate.cuh"
#include "kernels/moe_grouped_gemm.cuh"
#include "kernels/moe_jitter.cuh"
#include "kernels/moe_permute.cuh"
#include "kernels/moe_residual.cuh"
#include "tests/reference/moe_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using test::DeviceArray;

namespace {

constexpr double kBf16Tol = 1e-2;
constexpr double kF32Tol = 1e-5;

// Logits on a 1/8 grid, distinct within a row except for planted ties (every 5th row repeats its
// largest value at another expert, every 7th its second largest), so fp32 on the GPU and fp64 in
// the reference order them identically.
std::vector<float> grid_logits(int T, int E, std::mt19937_64& rng) {
  std::vector<float> l(std::size_t(T) * E);
  std::vector<int> perm(E);
  for (int s = 0; s < T; ++s) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    float* row = &l[std::size_t(s) * E];
    for (int e = 0; e < E; ++e) row[e] = 0.125f * perm[e] - 0.0625f * E;
    if (E >= 3 && s % 5 == 0) {
      const int top = int(std::max_element(row, row + E) - row);
      row[(top + 1 + s % (E - 1)) % E] = row[top];
    } else if (E >= 3 && s % 7 == 0) {
      std::vector<int> idx(E);
      std::iota(idx.begin(), idx.end(), 0);
      std::sort(idx.begin(), idx.end(), [&](int a, int b) { return row[a] > row[b]; });
      row[idx[2]] = row[idx[1]];
    }
  }
  return l;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

struct GpuGate {
  DeviceArray<float> probs, weight, ce, l_aux;
  DeviceArray<std::int32_t> expert, position, counts, kept, offsets, stats;
  DeviceArray<char> ws;
  GpuGate(int T, int E, int k)
      : probs(std::size_t(T) * E), weight(std::size_t(T) * k), ce(E), l_aux(1), expert(std::size_t(T) * k),
        position(std::size_t(T) * k), counts(E), kept(E), offsets(E + 1), stats(2),
        ws(kernels::moe_gate_workspace_bytes(T, E, k)) {}
  kernels::MoeGateOutputs outputs() const {
    return {probs.get(), expert.get(), position.get(), weight.get(), counts.get(), kept.get(), offsets.get(),
            ce.get(), l_aux.get(), stats.get()};
  }
};

struct GateCase {
  int T, E, k;
  bool drop;
  double cf;
  int min_capacity;
};
std::string str(const GateCase& c) {
  return "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) +
         (c.drop ? " drop cf=" + std::to_string(c.cf) : " no-drop");
}

const std::vector<GateCase> kGateCases = {
    {1, 1, 1, true, 1.0, 0},    {7, 3, 1, true, 1.0, 0},      {65, 5, 2, true, 1.0, 1},
    {200, 8, 2, true, 0.5, 4},  {333, 64, 1, true, 1.0, 4},   {1000, 64, 2, true, 1.25, 4},
    {130, 17, 2, false, 1, 0},  {513, 33, 1, false, 1, 0},    {4096, 128, 2, true, 1.0, 4},
    {8192, 8, 1, true, 1.0, 4}, {3000, 1024, 2, true, 2.0, 0}};

TEST(MoeGateGpu, ForwardAndBackwardMatchReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const GateCase& c : kGateCases) {
    SCOPED_TRACE(str(c));
    const int cap = c.drop ? kernels::moe_capacity(c.T, c.E, c.k, c.cf, c.min_capacity) : 0;
    const auto logits = grid_logits(c.T, c.E, rng);
    const auto ref = ref::moe_gate_forward(logits, c.T, c.E, c.k, c.drop, cap);
    DeviceArray<float> dlogits_in(logits);
    GpuGate g(c.T, c.E, c.k);
    kernels::moe_gate_forward(nullptr, dlogits_in.get(), {c.T, c.E, c.k, c.drop, cap}, g.outputs(), g.ws.get());
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(g.expert.download(), ref.expert);
    EXPECT_EQ(g.position.download(), ref.position);
    EXPECT_EQ(g.counts.download(), ref.expert_counts);
    EXPECT_EQ(g.kept.download(), ref.kept_counts);
    EXPECT_EQ(g.offsets.download(), ref.offsets);
    EXPECT_EQ(g.stats.download(), (std::vector<std::int32_t>{ref.capacity, ref.dropped}));
    EXPECT_LT(test::rel_error(g.probs.download(), ref.probs), kF32Tol);
    EXPECT_LT(test::rel_error(g.weight.download(), ref.weight), kF32Tol);
    EXPECT_LT(test::rel_error(g.ce.download(), ref.ce), kF32Tol);
    EXPECT_NEAR(g.l_aux.download()[0], ref.l_aux, 1e-5 * ref.l_aux);

    for (float aux_grad : {0.f, 0.01f, 1.f}) {
      const auto dw = test::random_normal(std::size_t(c.T) * c.k, rng);
      DeviceArray<float> ddw(dw);
      DeviceArray<bf16> dl(std::size_t(c.T) * c.E);
      kernels::moe_gate_backward(nullptr, g.probs.get(), g.expert.get(), g.position.get(), ddw.get(), g.ce.get(),
                                 aux_grad, c.T, c.E, c.k, dl.get());
      const auto want = ref::moe_gate_backward(ref, to_double(dw), aux_grad);
      const auto got = test::download_float(dl);
      EXPECT_EQ(test::count_nan(got), 0u);
      EXPECT_LT(test::rel_error(got, want), kBf16Tol) << "aux_grad " << aux_grad;
    }
  }
}

// RSample and random token selection (top-1), second-expert sampling (top-2).
TEST(MoeGateGpu, NoiseMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const GateCase& c : {GateCase{65, 5, 1, true, 1.0, 1}, GateCase{333, 64, 1, true, 1.0, 4},
                            GateCase{8192, 8, 1, true, 0.75, 4}, GateCase{5000, 64, 1, true, 0.5, 0},
                            GateCase{200, 8, 2, true, 1.0, 4}, GateCase{1000, 64, 2, false, 1, 0}}) {
    SCOPED_TRACE(str(c));
    const std::uint64_t seed = rng();
    const bool rsample = c.k == 1, second = c.k == 2, rts = c.k == 1;
    const int cap = c.drop ? kernels::moe_capacity(c.T, c.E, c.k, c.cf, c.min_capacity) : 0;
    const auto logits = grid_logits(c.T, c.E, rng);
    const auto ref = ref::moe_gate_forward(logits, c.T, c.E, c.k, c.drop, cap, rsample, second, seed, rts);
    DeviceArray<float> dl(logits);
    GpuGate g(c.T, c.E, c.k);
    kernels::MoeGateShape sh{c.T, c.E, c.k, c.drop, cap};
    sh.noise = {rsample, second, rts, seed};
    kernels::moe_gate_forward(nullptr, dl.get(), sh, g.outputs(), g.ws.get());
    EXPECT_EQ(g.expert.download(), ref.expert);
    EXPECT_EQ(g.position.download(), ref.position);
    EXPECT_LT(test::rel_error(g.weight.download(), ref.weight), kF32Tol);
    // The seed from a device word (XOR-ed with the host's value): the same draws.
    const DeviceArray<std::uint64_t> word(std::vector<std::uint64_t>{seed ^ 0x5bd1e995ULL});
    GpuGate gw(c.T, c.E, c.k);
    sh.noise.seed = 0x5bd1e995ULL;
    sh.noise.seed_word = word.get();
    kernels::moe_gate_forward(nullptr, dl.get(), sh, gw.outputs(), gw.ws.get());
    EXPECT_EQ(gw.expert.download(), ref.expert) << "seed word";
    EXPECT_EQ(gw.position.download(), ref.position) << "seed word";
  }
}

TEST(MoeGateGpu, DeterministicAcrossRuns) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const int T = 4000, E = 64, k = 2;
  DeviceArray<float> logits(test::random_normal(std::size_t(T) * E, rng));
  GpuGate a(T, E, k), b(T, E, k);
  const kernels::MoeGateShape sh{T, E, k, true, kernels::moe_capacity(T, E, k, 1.0, 4)};
  kernels::moe_gate_forward(nullptr, logits.get(), sh, a.outputs(), a.ws.get());
  kernels::moe_gate_forward(nullptr, logits.get(), sh, b.outputs(), b.ws.get());
  EXPECT_EQ(a.position.download(), b.position.download());
  EXPECT_EQ(a.l_aux.download(), b.l_aux.download());
  EXPECT_EQ(a.weight.download(), b.weight.download());
}

// The routing of a reference gate on the device.
struct DeviceRouting {
  DeviceArray<std::int32_t> expert, position, offsets;
  explicit DeviceRouting(const ref::MoeGateRef& g) : expert(g.expert), position(g.position), offsets(g.offsets) {}
  kernels::MoeRouting view(const ref::MoeGateRef& g) const {
    return {expert.get(), position.get(), offsets.get(), g.tokens, g.k};
  }
};

TEST(MoePermuteGpu, AllFourMatchReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  struct Case { int T, E, k, H; double cf; int shift; };  // shift: elements off 16-byte alignment
  const std::vector<Case> cases = {{1, 1, 1, 1, 1.0, 0},    {13, 3, 1, 7, 0.5, 0},   {64, 8, 2, 8, 1.0, 0},
                                   {100, 8, 2, 64, 0.6, 1}, {257, 16, 1, 1000, 1.0, 0}, {512, 64, 2, 1024, 1.0, 0},
                                   {300, 5, 2, 1024, 1.0, 3}};
  for (const Case& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) +
                 " H=" + std::to_string(c.H) + " shift=" + std::to_string(c.shift));
    const auto g = ref::moe_gate_forward(test::random_normal(std::size_t(c.T) * c.E, rng), c.T, c.E, c.k, true,
                                         ref::moe_capacity(c.T, c.E, c.k, c.cf, 0));
    const DeviceRouting dr(g);
    const auto rt = dr.view(g);
    const std::size_t R = g.offsets[c.E], TH = std::size_t(c.T) * c.H, RH = R * c.H, sh = c.shift;
    auto x = test::round_bf16(test::random_normal(TH, rng));
    DeviceArray<bf16> dx_in(TH + sh), xp(RH + sh + 1);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(dx_in.get() + sh, test::to_bf16(x).data(), TH * 2, cudaMemcpyHostToDevice));
    kernels::moe_permute(nullptr, dx_in.get() + sh, rt, xp.get() + sh, c.H);
    auto xp_h = test::download_float(xp);
    std::vector<float> xp_got(xp_h.begin() + sh, xp_h.begin() + sh + RH);
    EXPECT_EQ(test::count_nan(xp_got), 0u);
    EXPECT_EQ(test::rel_error(xp_got, ref::moe_permute(x, g, c.H)), 0.0);  // a copy

    // permute backward, written and accumulated
    const auto a = test::round_bf16(test::random_normal(RH, rng));
    DeviceArray<bf16> da(test::to_bf16(a)), dxb(TH);
    kernels::moe_permute_backward(nullptr, da.get(), rt, dxb.get(), c.H, false);
    const auto want_dx = ref::moe_permute_backward(a, g, c.H);
    const auto got_dx = test::download_float(dxb);
    EXPECT_EQ(test::count_nan(got_dx), 0u);
    EXPECT_LT(test::rel_error(got_dx, want_dx), kBf16Tol);
    kernels::moe_permute_backward(nullptr, da.get(), rt, dxb.get(), c.H, true);
    auto want2 = want_dx;
    for (std::size_t i = 0; i < TH; ++i) want2[i] += got_dx[i];
    EXPECT_LT(test::rel_error(test::download_float(dxb), want2), kBf16Tol);

    // un-permute and its backward
    std::vector<float> w(g.weight.begin(), g.weight.end());
    DeviceArray<float> dw_in(w);
    const auto yp = test::round_bf16(test::random_normal(RH, rng));
    DeviceArray<bf16> dyp_in(test::to_bf16(yp)), y(TH);
    kernels::moe_unpermute(nullptr, dyp_in.get(), dw_in.get(), rt, y.get(), c.H);
    const auto got_y = test::download_float(y);
    EXPECT_EQ(test::count_nan(got_y), 0u);
    EXPECT_LT(test::rel_error(got_y, ref::moe_unpermute(yp, w, g, c.H)), kBf16Tol);
    const auto dy = test::round_bf16(test::random_normal(TH, rng));
    DeviceArray<bf16> ddy(test::to_bf16(dy)), dyp(RH);
    DeviceArray<float> dweight(std::size_t(c.T) * c.k);
    kernels::moe_unpermute_backward(nullptr, ddy.get(), dyp_in.get(), dw_in.get(), rt, dyp.get(), dweight.get(), c.H);
    std::vector<double> want_dyp, want_dw;
    ref::moe_unpermute_backward(dy, yp, w, g, c.H, want_dyp, want_dw);
    const auto got_dyp = test::download_float(dyp);
    EXPECT_EQ(test::count_nan(got_dyp), 0u);
    if (RH) {
      EXPECT_LT(test::rel_error(got_dyp, want_dyp), kBf16Tol);
    }
    EXPECT_LT(test::rel_error(dweight.download(), want_dw), 1e-4);
  }
}

// The slot layout: route (s, r) at expert · C + position of an [E, C] buffer, the unowned slots
// zeroed by moe_zero_empty_slots; every kernel against the references on the slot view of the
// routing. Cases with experts no token reached and experts at full capacity.
TEST(MoeSlotsGpu, PermutationsAndEmptySlotsMatchReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  struct Case { int T, E, k, H; double cf; int min_capacity, shift; };  // shift: elements off 16-byte alignment
  const std::vector<Case> cases = {{1, 1, 1, 1, 1.0, 0, 0},    {5, 16, 1, 24, 1.0, 4, 0},  {13, 3, 1, 7, 0.5, 0, 0},
                                   {64, 8, 2, 8, 1.0, 4, 0},   {100, 8, 2, 64, 0.6, 0, 1}, {257, 16, 1, 1000, 1.0, 4, 0},
                                   {300, 5, 2, 1024, 2.0, 0, 3}, {512, 64, 2, 1024, 1.0, 4, 0}};
  bool saw_empty = false, saw_full = false;
  for (const Case& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) +
                 " H=" + std::to_string(c.H) + " cf=" + std::to_string(c.cf) + " shift=" + std::to_string(c.shift));
    const int C = ref::moe_capacity(c.T, c.E, c.k, c.cf, c.min_capacity);
    const auto g = ref::moe_gate_forward(test::random_normal(std::size_t(c.T) * c.E, rng), c.T, c.E, c.k, true, C);
    const auto gs = ref::moe_slot_layout(g, C);
    for (int e = 0; e < c.E; ++e) {
      saw_empty |= g.kept_counts[std::size_t(e)] == 0;
      saw_full |= g.kept_counts[std::size_t(e)] == C;
    }
    DeviceArray<std::int32_t> expert(g.expert), position(g.position), kept(g.kept_counts);
    const kernels::MoeRouting rt{expert.get(), position.get(), nullptr, c.T, c.k, C};
    const std::size_t TH = std::size_t(c.T) * c.H, RH = std::size_t(c.E) * C * c.H, sh = c.shift;

    // permute + the empty slots: a copy, every row written (the buffer starts as NaN)
    const auto x = test::round_bf16(test::random_normal(TH, rng));
    DeviceArray<bf16> dx_in(TH + sh), xp(RH + sh + 1);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(dx_in.get() + sh, test::to_bf16(x).data(), TH * 2, cudaMemcpyHostToDevice));
    kernels::moe_permute(nullptr, dx_in.get() + sh, rt, xp.get() + sh, c.H);
    kernels::moe_zero_empty_slots(nullptr, xp.get() + sh, kept.get(), c.E, C, c.H);
    const auto xp_h = test::download_float(xp);
    const std::vector<float> xp_got(xp_h.begin() + sh, xp_h.begin() + sh + RH);
    EXPECT_EQ(test::count_nan(xp_got), 0u);
    EXPECT_EQ(test::rel_error(xp_got, ref::moe_zero_empty_slots(ref::moe_permute(x, gs, c.H), g.kept_counts, C, c.H)),
              0.0);
    EXPECT_TRUE(std::isnan(xp_h[RH + sh])) << "a write past the [E, C] slots";

    // permute backward over the slots (written, then accumulated)
    const auto a = test::round_bf16(test::random_normal(RH, rng));
    DeviceArray<bf16> da(test::to_bf16(a)), dxb(TH);
    kernels::moe_permute_backward(nullptr, da.get(), rt, dxb.get(), c.H, false);
    const auto want_dx = ref::moe_permute_backward(a, gs, c.H);
    const auto got_dx = test::download_float(dxb);
    EXPECT_EQ(test::count_nan(got_dx), 0u);
    EXPECT_LT(test::rel_error(got_dx, want_dx), kBf16Tol);
    kernels::moe_permute_backward(nullptr, da.get(), rt, dxb.get(), c.H, true);
    auto want2 = want_dx;
    for (std::size_t i = 0; i < TH; ++i) want2[i] += got_dx[i];
    EXPECT_LT(test::rel_error(test::download_float(dxb), want2), kBf16Tol);

    // un-permute from the slots and its backward into them (the empty slots zeroed after it)
    const std::vector<float> w(g.weight.begin(), g.weight.end());
    DeviceArray<float> dw_in(w);
    const auto yp = test::round_bf16(test::random_normal(RH, rng));
    DeviceArray<bf16> dyp_in(test::to_bf16(yp)), y(TH);
    kernels::moe_unpermute(nullptr, dyp_in.get(), dw_in.get(), rt, y.get(), c.H);
    const auto got_y = test::download_float(y);
    EXPECT_EQ(test::count_nan(got_y), 0u);
    EXPECT_LT(test::rel_error(got_y, ref::moe_unpermute(yp, w, gs, c.H)), kBf16Tol);
    const auto dy = test::round_bf16(test::random_normal(TH, rng));
    DeviceArray<bf16> ddy(test::to_bf16(dy)), dyp(RH);
    DeviceArray<float> dweight(std::size_t(c.T) * c.k);
    kernels::moe_unpermute_backward(nullptr, ddy.get(), dyp_in.get(), dw_in.get(), rt, dyp.get(), dweight.get(), c.H);
    kernels::moe_zero_empty_slots(nullptr, dyp.get(), kept.get(), c.E, C, c.H);
    std::vector<double> want_dyp, want_dw;
    ref::moe_unpermute_backward(dy, yp, w, gs, c.H, want_dyp, want_dw);
    const auto got_dyp = test::download_float(dyp);
    EXPECT_EQ(test::count_nan(got_dyp), 0u);
    EXPECT_LT(test::rel_error(got_dyp, ref::moe_zero_empty_slots(want_dyp, g.kept_counts, C, c.H)), kBf16Tol);
    EXPECT_LT(test::rel_error(dweight.download(), want_dw), 1e-4);
  }
  EXPECT_TRUE(saw_empty) << "no case had an expert with 0 rows";
  EXPECT_TRUE(saw_full) << "no case had an expert at full capacity";
}

TEST(MoeSlotsGpu, ZeroEmptySlotsNamesBadArguments) {
  CUTRAIN_REQUIRE_GPU();
  DeviceArray<bf16> buf(64);
  DeviceArray<std::int32_t> kept(std::vector<std::int32_t>{0, 0});
  EXPECT_THROW(kernels::moe_zero_empty_slots(nullptr, buf.get(), kept.get(), 0, 4, 8), Error);
  EXPECT_THROW(kernels::moe_zero_empty_slots(nullptr, buf.get(), kept.get(), 2, 0, 8), Error);
  EXPECT_THROW(kernels::moe_zero_empty_slots(nullptr, nullptr, kept.get(), 2, 4, 8), Error);
  const kernels::MoeRouting no_offsets{kept.get(), kept.get(), nullptr, 2, 1, 0};  // packed needs offsets
  EXPECT_THROW(kernels::moe_permute(nullptr, buf.get(), no_offsets, buf.get(), 8), Error);
}

// The strided-batched GEMMs of the slot layout (kernels/gemm.cuh's *_batched): every batch of M
// rows is one group of the grouped reference, weights [B, N, K]; odd shapes (2-byte aligned batch
// starts), bf16 and fp32 weight gradients, written and accumulated.
TEST(MoeSlotsGpu, BatchedGemmMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  struct Case { int B, M, N, K; };
  const std::vector<Case> cases = {{1, 1, 1, 1}, {3, 5, 13, 7}, {5, 17, 33, 9}, {8, 64, 96, 40}, {64, 16, 128, 64},
                                   {2, 130, 72, 24}};
  kernels::Gemm gemm;
  for (const Case& c : cases) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
                 " K=" + std::to_string(c.K));
    const std::vector<int> rows(std::size_t(c.B), c.M);
    const std::size_t R = std::size_t(c.B) * c.M;
    const auto x = test::round_bf16(test::random_normal(R * c.K, rng));
    const auto w = test::round_bf16(test::random_normal(std::size_t(c.B) * c.N * c.K, rng, 0.f, 0.2f));
    const auto dy = test::round_bf16(test::random_normal(R * c.N, rng));
    DeviceArray<bf16> dx_(test::to_bf16(x)), dw_(test::to_bf16(w)), ddy(test::to_bf16(dy)), y(R * c.N + 1);
    gemm.forward_batched(nullptr, dx_.get(), dw_.get(), y.get(), c.B, c.M, c.N, c.K);
    auto got_y = test::download_float(y);
    EXPECT_TRUE(std::isnan(got_y.back())) << "a write past the last batch";
    got_y.pop_back();
    EXPECT_EQ(test::count_nan(got_y), 0u);
    EXPECT_LT(test::rel_error(got_y, ref::grouped_gemm_forward(x, w, rows, c.N, c.K)), kBf16Tol);

    DeviceArray<bf16> dx(R * c.K);
    gemm.grad_input_batched(nullptr, ddy.get(), dw_.get(), dx.get(), c.B, c.M, c.N, c.K);
    const auto got_dx = test::download_float(dx);
    EXPECT_EQ(test::count_nan(got_dx), 0u);
    EXPECT_LT(test::rel_error(got_dx, ref::grouped_gemm_grad_input(dy, w, rows, c.N, c.K)), kBf16Tol);

    const auto want_dw = ref::grouped_gemm_grad_weight(dy, x, rows, c.N, c.K);
    DeviceArray<bf16> dwb(std::size_t(c.B) * c.N * c.K);
    gemm.grad_weight_batched(nullptr, ddy.get(), dx_.get(), dwb.get(), DType::BF16, c.B, c.M, c.N, c.K, false);
    const auto got_dwb = test::download_float(dwb);
    EXPECT_EQ(test::count_nan(got_dwb), 0u);
    EXPECT_LT(test::rel_error(got_dwb, want_dw), kBf16Tol);
    DeviceArray<float> dwf(std::size_t(c.B) * c.N * c.K);
    gemm.grad_weight_batched(nullptr, ddy.get(), dx_.get(), dwf.get(), DType::F32, c.B, c.M, c.N, c.K, false);
    const auto got_dwf = dwf.download();
    EXPECT_EQ(test::count_nan(got_dwf), 0u);
    EXPECT_LT(test::rel_error(got_dwf, want_dw), 1e-4);
    gemm.grad_weight_batched(nullptr, ddy.get(), dx_.get(), dwf.get(), DType::F32, c.B, c.M, c.N, c.K, true);
    EXPECT_LT(test::rel_error(dwf.download(), ref::grouped_gemm_grad_weight(dy, x, rows, c.N, c.K, &got_dwf)), 1e-4);
  }
  DeviceArray<bf16> a(64), b(64), o(64);
  EXPECT_THROW(gemm.forward_batched(nullptr, a.get(), b.get(), o.get(), 0, 2, 2, 2), Error);
  EXPECT_THROW(gemm.grad_input_batched(nullptr, a.get(), b.get(), o.get(), 2, 0, 2, 2), Error);
  EXPECT_THROW(gemm.grad_weight_batched(nullptr, a.get(), b.get(), o.get(), DType::I32, 2, 2, 2, 2, false), Error);
}

// The step figures merged on the device over forwards against the same merge on the host.
TEST(MoeStepFiguresGpu, MergeMatchesTheHost) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (int E : {1, 5, 33, 1024}) {
    SCOPED_TRACE("E=" + std::to_string(E));
    DeviceArray<kernels::MoeStepFigures> acc(1);
    float l_sum = 0;
    int dropped = 0, lo = 0, hi = 0, cap = 0;
    for (int f = 0; f < 3; ++f) {
      const auto kept = test::random_ints(std::size_t(E), rng, 0, 50);
      const std::vector<std::int32_t> stats{40 + f, int(test::random_ints(1, rng, 0, 100)[0])};
      const float l_aux = test::random_normal(1, rng, 1.f, 0.1f)[0];
      DeviceArray<std::int32_t> dk(kept), ds(stats);
      DeviceArray<float> dl(std::vector<float>{l_aux});
      kernels::moe_step_figures_merge(nullptr, dk.get(), ds.get(), dl.get(), E, acc.get(), f == 0);
      const auto [mn, mx] = std::minmax_element(kept.begin(), kept.end());
      lo = f == 0 ? *mn : std::min(lo, *mn);
      hi = f == 0 ? *mx : std::max(hi, *mx);
      l_sum = f == 0 ? l_aux : l_sum + l_aux;
      dropped = f == 0 ? stats[1] : dropped + stats[1];
      cap = stats[0];
      const kernels::MoeStepFigures got = acc.download()[0];
      EXPECT_EQ(got.forwards, f + 1);
      EXPECT_EQ(got.capacity, cap);
      EXPECT_EQ(got.dropped, dropped);
      EXPECT_EQ(got.min_load, lo);
      EXPECT_EQ(got.max_load, hi);
      EXPECT_EQ(got.l_aux_sum, l_sum);
    }
  }
  DeviceArray<kernels::MoeStepFigures> acc(1);
  DeviceArray<std::int32_t> k(4);
  EXPECT_THROW(kernels::moe_step_figures_merge(nullptr, k.get(), k.get(), nullptr, 4, acc.get(), true), Error);
  EXPECT_THROW(kernels::moe_step_figures_merge(nullptr, k.get(), k.get(), reinterpret_cast<float*>(k.get()), 0,
                                               acc.get(), true), Error);
}

TEST(MoeGroupedGemmGpu, MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  struct Case { std::vector<int> rows; int N, K; };
  std::vector<Case> cases = {{{3, 0, 5, 1}, 13, 7},
                             {{1}, 1, 1},
                             {{64, 0, 64, 17, 200, 1, 0, 31}, 256, 128},
                             {{}, 96, 40}};
  for (int g = 0; g < 130; ++g) cases.back().rows.push_back(test::random_ints(1, rng, 0, 6)[0]);  // two grouped calls
  kernels::GroupedGemm gg(256);
  for (const Case& c : cases) {
    const int G = int(c.rows.size());
    SCOPED_TRACE("G=" + std::to_string(G) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K));
    const std::size_t R = std::accumulate(c.rows.begin(), c.rows.end(), std::size_t(0));
    const auto x = test::round_bf16(test::random_normal(R * c.K, rng));
    const auto w = test::round_bf16(test::random_normal(std::size_t(G) * c.N * c.K, rng, 0.f, 0.2f));
    const auto dy = test::round_bf16(test::random_normal(R * c.N, rng));
    DeviceArray<bf16> dx_(test::to_bf16(x)), dw_(test::to_bf16(w)), ddy(test::to_bf16(dy)), y(R * c.N);
    gg.forward(nullptr, dx_.get(), dw_.get(), y.get(), c.rows.data(), G, c.N, c.K);
    const auto got_y = test::download_float(y);
    EXPECT_EQ(test::count_nan(got_y), 0u);
    EXPECT_LT(test::rel_error(got_y, ref::grouped_gemm_forward(x, w, c.rows, c.N, c.K)), kBf16Tol);

    DeviceArray<bf16> dx(R * c.K);
    gg.grad_input(nullptr, ddy.get(), dw_.get(), dx.get(), c.rows.data(), G, c.N, c.K);
    const auto got_dx = test::download_float(dx);
    EXPECT_EQ(test::count_nan(got_dx), 0u);
    EXPECT_LT(test::rel_error(got_dx, ref::grouped_gemm_grad_input(dy, w, c.rows, c.N, c.K)), kBf16Tol);
    gg.grad_input(nullptr, ddy.get(), dw_.get(), dx.get(), c.rows.data(), G, c.N, c.K, 1.f);
    EXPECT_LT(test::rel_error(test::download_float(dx), ref::grouped_gemm_grad_input(dy, w, c.rows, c.N, c.K, 1.0,
                                                                                     &got_dx)),
              kBf16Tol);

    DeviceArray<bf16> dwb(std::size_t(G) * c.N * c.K);
    gg.grad_weight(nullptr, ddy.get(), dx_.get(), dwb.get(), DType::BF16, c.rows.data(), G, c.N, c.K, false);
    const auto want_dw = ref::grouped_gemm_grad_weight(dy, x, c.rows, c.N, c.K);
    const auto got_dwb = test::download_float(dwb);
    EXPECT_EQ(test::count_nan(got_dwb), 0u);  // empty groups zeroed
    EXPECT_LT(test::rel_error(got_dwb, want_dw), kBf16Tol);
    DeviceArray<float> dwf(std::size_t(G) * c.N * c.K);
    gg.grad_weight(nullptr, ddy.get(), dx_.get(), dwf.get(), DType::F32, c.rows.data(), G, c.N, c.K, false);
    const auto got_dwf = dwf.download();
    EXPECT_EQ(test::count_nan(got_dwf), 0u);
    EXPECT_LT(test::rel_error(got_dwf, want_dw), 1e-4);
    gg.grad_weight(nullptr, ddy.get(), dx_.get(), dwf.get(), DType::F32, c.rows.data(), G, c.N, c.K, true);
    EXPECT_LT(test::rel_error(dwf.download(), ref::grouped_gemm_grad_weight(dy, x, c.rows, c.N, c.K, &got_dwf)),
              1e-4);
  }
  // Which calls ran as the per-group cuBLASLt loop (an fp32 dW the grouped call may refuse).
  std::cout << "GroupedGemm fallback calls: " << gg.fallback_count() << "\n";
  RecordProperty("grouped_gemm_fallbacks", int(gg.fallback_count()));
}

TEST(MoeResidualGpu, MixMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (auto [T, H] : {std::pair{1, 1}, {7, 13}, {64, 64}, {300, 1024}, {33, 1000}}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " H=" + std::to_string(H));
    const std::size_t TH = std::size_t(T) * H;
    const auto ym = test::round_bf16(test::random_normal(TH, rng)), yr = test::round_bf16(test::random_normal(TH, rng));
    const auto logits = test::random_normal(std::size_t(T) * 2, rng, 0.f, 2.f);
    const float bias[2] = {test::round_bf16({0.3f})[0], test::round_bf16({-0.7f})[0]};
    DeviceArray<bf16> dym_in(test::to_bf16(ym)), dyr_in(test::to_bf16(yr)), db(test::to_bf16({bias[0], bias[1]}));
    DeviceArray<float> dl(logits), coef(std::size_t(T) * 2);
    DeviceArray<bf16> y(TH);
    kernels::moe_residual_mix_forward(nullptr, dym_in.get(), dyr_in.get(), dl.get(), db.get(), y.get(), coef.get(), T,
                                      H);
    std::vector<double> want_y, want_c;
    ref::moe_residual_mix_forward(ym, yr, logits, bias, T, H, want_y, want_c);
    const auto got_y = test::download_float(y);
    EXPECT_EQ(test::count_nan(got_y), 0u);
    EXPECT_LT(test::rel_error(got_y, want_y), kBf16Tol);
    const auto got_c = coef.download();
    EXPECT_LT(test::rel_error(got_c, want_c), kF32Tol);

    const auto dy = test::round_bf16(test::random_normal(TH, rng));
    DeviceArray<bf16> ddy(test::to_bf16(dy)), dm(TH), dr(TH), dlog(std::size_t(T) * 2);
    kernels::moe_residual_mix_backward(nullptr, ddy.get(), dym_in.get(), dyr_in.get(), coef.get(), dm.get(), dr.get(),
                                       dlog.get(), T, H);
    std::vector<double> want_dm, want_dr, want_dl;
    ref::moe_residual_mix_backward(dy, ym, yr, got_c, T, H, want_dm, want_dr, want_dl);
    EXPECT_LT(test::rel_error(test::download_float(dm), want_dm), kBf16Tol);
    EXPECT_LT(test::rel_error(test::download_float(dr), want_dr), kBf16Tol);
    const auto got_dl = test::download_float(dlog);
    EXPECT_EQ(test::count_nan(got_dl), 0u);
    EXPECT_LT(test::rel_error(got_dl, want_dl), kBf16Tol);
  }
}

TEST(MoeJitterGpu, MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (std::size_t n : {std::size_t(1), std::size_t(1000), std::size_t(8192) * 64 + 3}) {
    const std::uint64_t seed = rng();
    const float eps = 0.5f;  // large enough that a wrong draw cannot hide under bf16 rounding
    const auto x = test::round_bf16(test::random_normal(n, rng)), g = test::round_bf16(test::random_normal(n, rng));
    const auto d0 = test::round_bf16(test::random_normal(n, rng));
    DeviceArray<bf16> dx_(test::to_bf16(x)), xj(n), dg(test::to_bf16(g)), dd(test::to_bf16(d0));
    // The forward's seed from a device word XOR-ed with the host's value, the backward's from the host.
    const DeviceArray<std::uint64_t> word(std::vector<std::uint64_t>{seed ^ 0xc2b2ae35ULL});
    kernels::moe_jitter_forward(nullptr, dx_.get(), xj.get(), n, eps, 0xc2b2ae35ULL, word.get());
    kernels::moe_jitter_backward(nullptr, dg.get(), dd.get(), n, eps, seed);
    std::vector<double> want_xj(n), want_dx(n);
    double lo = 2, hi = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double u = ref::moe_jitter_factor(eps, seed, i);
      lo = std::min(lo, u), hi = std::max(hi, u);
      want_xj[i] = x[i] * u;
      want_dx[i] = d0[i] + g[i] * u;
    }
    EXPECT_GE(lo, 1 - eps);
    EXPECT_LE(hi, 1 + eps);
    const auto got = test::download_float(xj);
    EXPECT_EQ(test::count_nan(got), 0u);
    EXPECT_LT(test::rel_error(got, want_xj), kBf16Tol);
    EXPECT_LT(test::rel_error(test::download_float(dd), want_dx), kBf16Tol);
  }
}

TEST(MoeGroupedGemmGpu, NamesBadArguments) {
  CUTRAIN_REQUIRE_GPU();
  kernels::GroupedGemm gg(4);
  DeviceArray<bf16> a(64), b(64), c(64);
  const int rows[5] = {1, 1, 1, 1, 1};
  EXPECT_THROW(gg.forward(nullptr, a.get(), b.get(), c.get(), rows, 5, 2, 2), Error);
  const int neg[2] = {1, -1};
  EXPECT_THROW(gg.forward(nullptr, a.get(), b.get(), c.get(), neg, 2, 2, 2), Error);
}

}  // namespace
