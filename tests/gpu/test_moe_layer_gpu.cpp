// @brief The GPU MoE layer (model/moe_layer.h) against its CPU reference (model/moe_reference.h) on
// small odd shapes: routing statistics exactly, the output and the aux loss, and every gradient
// (input, gate weight, both expert weights; fp32 and bf16 gradients, written and accumulated) by
// relative error. Inputs are fresh, redrawn until no token's chosen logits lie within 1e-3 of the
// next (fp32 and fp64 logits then route alike); outputs poisoned first, and the layer's own buffers
// start as NaN (the allocator's cache poisoned). With token dropping both layouts: the [E, C]
// slots (no host synchronization; the noise's seed from a device word) and the packed rows (the
// seed from the host); the step figures merged on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/moe_config.h"
#include "model/moe_layer.h"
#include "model/moe_reference.h"
#include "runtime/allocator.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using model::MoeConfig;
using test::DeviceArray;

namespace {

constexpr double kOutTol = 2e-2, kGradTol = 3e-2;

std::vector<double> slice(const std::vector<double>& v, std::size_t a, std::size_t n) {
  return {v.begin() + a, v.begin() + a + n};
}
std::vector<float> slice(const std::vector<float>& v, std::size_t a, std::size_t n) {
  return {v.begin() + a, v.begin() + a + n};
}

// Fills the allocator's cache (small and large pools) with NaN: a layer built next starts with
// NaN buffers, so a slot it assumed zero or a row it never wrote shows in its outputs.
void poison_cache(CachingAllocator& alloc) {
  std::vector<Buffer> junk;
  for (int i = 0; i < 16; ++i) junk.emplace_back(alloc, alloc_rules::kSmallSize);
  for (int i = 0; i < 2; ++i) junk.emplace_back(alloc, std::size_t(8) << 20);
  for (const Buffer& b : junk) CUTRAIN_CUDA_CHECK(cudaMemset(b.get(), 0xFF, b.bytes()));
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
}

struct Case {
  int T, H, F, E, k;
  double cf;
  bool drop;
  bool residual = false;
  model::MoeNoisyGate noise = model::MoeNoisyGate::None;
  bool second_sampling = false;
  bool rts = false;
};

}  // namespace

TEST(MoeLayerGpu, MatchesReferenceWithGradients) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::vector<Case> cases = {{50, 32, 48, 4, 1, 1.0, true},  {64, 64, 128, 8, 2, 1.0, true},
                                   {33, 24, 40, 3, 2, 1.0, false}, {40, 20, 36, 5, 1, 0.5, true},
                                   {100, 64, 64, 16, 2, 1.25, true}, {48, 32, 40, 4, 2, 1.0, true, true},
                                   {8, 32, 40, 16, 1, 1.0, true},  // most experts get no token
                                   {37, 20, 24, 3, 1, 1.0, true, true},
                                   {60, 32, 40, 6, 1, 1.0, true, false, model::MoeNoisyGate::RSample, false, true},
                                   {24, 32, 40, 6, 2, 1.0, true, false, model::MoeNoisyGate::Jitter, true}};
  CachingAllocator alloc(make_device_source());
  for (const Case& cs : cases) {
    SCOPED_TRACE("T=" + std::to_string(cs.T) + " H=" + std::to_string(cs.H) + " F=" + std::to_string(cs.F) +
                 " E=" + std::to_string(cs.E) + " k=" + std::to_string(cs.k) + (cs.residual ? " residual" : "") +
                 " noise=" + std::to_string(int(cs.noise)) + (cs.second_sampling ? " 2nd-sampling" : "") + (cs.rts ? " rts" : ""));
    MoeConfig c;
    c.hidden = cs.H, c.ffn = cs.F, c.experts = cs.E, c.k = cs.k, c.capacity_factor = cs.cf, c.drop_tokens = cs.drop;
    c.min_capacity = 4;
    c.use_residual = cs.residual;
    c.noisy_gate_policy = cs.noise;
    c.top2_2nd_expert_sampling = cs.second_sampling;
    c.use_rts = cs.rts;
    const std::uint64_t seed = rng();
    // The GPU rounds the jittered gate input to bf16 (the reference keeps it in fp64): a wider margin.
    const double min_gap = cs.noise == model::MoeNoisyGate::Jitter ? 0.05 : 1e-3;
    const auto lay = model::moe_param_layout(c);
    const std::size_t TH = std::size_t(cs.T) * cs.H;
    model::MoeReference ref(c);
    std::vector<float> p, x;
    std::vector<double> y_ref(TH);
    double l_aux_ref = 0;
    for (int tries = 0;; ++tries) {
      ASSERT_LT(tries, 200) << "no input without a routing near-tie";
      p = test::round_bf16(test::random_normal(lay.total, rng, 0.f, 0.25f));
      x = test::round_bf16(test::random_normal(TH, rng));
      const std::vector<double> pd(p.begin(), p.end()), xd(x.begin(), x.end());
      l_aux_ref = ref.forward(pd.data(), xd.data(), cs.T, true, y_ref.data(), seed);
      if (ref.routing_gap() > min_gap) break;
    }
    // Both layouts where the slots apply (token dropping); the packed one only otherwise.
    for (const bool packed : cs.drop ? std::vector<bool>{false, true} : std::vector<bool>{true}) {
      SCOPED_TRACE(packed ? "packed rows" : "[E, C] slots");
      DeviceArray<bf16> dp(test::to_bf16(p)), dx_in(test::to_bf16(x)), y(TH);
      poison_cache(alloc);
      model::MoeLayerGpu layer(c, cs.T + 7, alloc, nullptr, packed);
      EXPECT_EQ(layer.capturable(), !packed && cs.drop && cs.noise == model::MoeNoisyGate::None && !cs.second_sampling &&
                                        !cs.rts);
      EXPECT_EQ(layer.capturable(/*seed_words=*/true), !packed && cs.drop);
      // The slots read the noise's seed from a device word (the host's value is then ignored: a
      // wrong one here), the packed rows take it from the host.
      const DeviceArray<std::uint64_t> word(std::vector<std::uint64_t>{seed});
      if (packed) layer.forward(nullptr, dp.get(), dx_in.get(), y.get(), cs.T, true, seed);
      else layer.forward(nullptr, dp.get(), dx_in.get(), y.get(), cs.T, true, ~seed, word.get());
      const auto st = layer.last_stats(nullptr);
      layer.merge_step_stats(nullptr, true);
      const model::MoeBlockStats fig = layer.read_step_stats(nullptr);
      EXPECT_EQ(fig.l_aux, double(st.l_aux));
      EXPECT_EQ(fig.capacity, st.capacity);
      EXPECT_EQ(fig.dropped, st.dropped);
      EXPECT_EQ(fig.min_load, st.min_load());
      EXPECT_EQ(fig.max_load, st.max_load());
      EXPECT_EQ(st.capacity, ref.capacity());
      EXPECT_EQ(st.dropped, ref.dropped());
      EXPECT_EQ(st.expert_counts, ref.expert_counts());
      EXPECT_EQ(st.kept_counts, ref.kept_counts());
      // Jitter's bf16 gate input (2^-9 relative) moves the mean probabilities of l_aux by ~1e-4.
      EXPECT_NEAR(st.l_aux, l_aux_ref, (cs.noise == model::MoeNoisyGate::Jitter ? 1e-3 : 1e-4) * l_aux_ref);
      const auto y_got = test::download_float(y);
      EXPECT_EQ(test::count_nan(y_got), 0u);
      EXPECT_LT(test::rel_error(y_got, y_ref), kOutTol);

      const auto dy = test::round_bf16(test::random_normal(TH, rng));
      const float aux_grad = 0.1f;
      std::vector<double> dx_ref(TH), g_ref(lay.total, 0.0);
      const std::vector<double> pd(p.begin(), p.end()), dyd(dy.begin(), dy.end());
      ref.backward(pd.data(), dyd.data(), aux_grad, dx_ref.data(), g_ref.data());
      DeviceArray<bf16> ddy(test::to_bf16(dy)), dx(TH);
      const char* names[7] = {"wg", "w1", "w2", "mlp fc1", "mlp fc2", "coef weight", "coef bias"};
      const std::size_t at[7] = {lay.wg, lay.w1, lay.w2, lay.r1, lay.r2, lay.cw, lay.cb};
      const std::size_t n[7] = {lay.w1 - lay.wg, lay.w2 - lay.w1, lay.r1 - lay.w2, lay.r2 - lay.r1,
                                lay.cw - lay.r2, lay.cb - lay.cw, lay.total - lay.cb};
      const int tensors = cs.residual ? 7 : 3;
      // Each tensor by relative error; the coefficient bias (two sums over tokens of values of both
      // signs, whose total may cancel) against the scale of the coefficient weight's gradient.
      auto check_grads = [&](const std::vector<float>& got, const std::vector<double>& want, const std::string& tag) {
        for (int t = 0; t < tensors; ++t) {
          const auto g = slice(got, at[t], n[t]);
          const auto w = slice(want, at[t], n[t]);
          if (t < 6) {
            EXPECT_LT(test::rel_error(g, w), kGradTol) << names[t] << tag;
            continue;
          }
          double rms = 0;
          for (std::size_t i = 0; i < n[5]; ++i) rms += want[at[5] + i] * want[at[5] + i];
          rms = std::sqrt(rms / double(n[5]));
          for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], w[i], kGradTol * rms) << names[t] << tag;
        }
      };
      {  // fp32 gradients, written then accumulated
        DeviceArray<float> g(lay.total);
        layer.backward(nullptr, dp.get(), dx_in.get(), ddy.get(), aux_grad, dx.get(), g.get(), DType::F32, false);
        const auto dx_got = test::download_float(dx);
        EXPECT_EQ(test::count_nan(dx_got), 0u);
        EXPECT_LT(test::rel_error(dx_got, dx_ref), kGradTol) << "dx";
        const auto g_got = g.download();
        EXPECT_EQ(test::count_nan(g_got), 0u);
        check_grads(g_got, g_ref, "");
        layer.backward(nullptr, dp.get(), dx_in.get(), ddy.get(), aux_grad, dx.get(), g.get(), DType::F32, true);
        auto twice = g_ref;
        for (auto& v : twice) v *= 2;
        const auto g2 = g.download();
        check_grads(g2, twice, " (accumulated)");
      }
      {  // bf16 gradients
        DeviceArray<bf16> g(lay.total);
        layer.backward(nullptr, dp.get(), dx_in.get(), ddy.get(), aux_grad, dx.get(), g.get(), DType::BF16, false);
        const auto g_got = test::download_float(g);
        EXPECT_EQ(test::count_nan(g_got), 0u);
        check_grads(g_got, g_ref, " (bf16)");
      }
    }
  }
}

TEST(MoeLayerGpu, EvalCapacityAndBadCalls) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  MoeConfig c;
  c.hidden = 16, c.ffn = 24, c.experts = 4, c.k = 1, c.capacity_factor = 0.5, c.eval_capacity_factor = 2.0;
  c.min_capacity = 0;
  CachingAllocator alloc(make_device_source());
  model::MoeLayerGpu layer(c, 64, alloc);
  DeviceArray<bf16> p(test::to_bf16(test::random_normal(model::moe_param_layout(c).total, rng, 0.f, 0.3f)));
  DeviceArray<bf16> x(test::to_bf16(test::random_normal(64 * 16, rng))), y(64 * 16);
  layer.forward(nullptr, p.get(), x.get(), y.get(), 64, true);
  EXPECT_EQ(layer.last_stats(nullptr).capacity, 8);  // ceil(16 · 0.5)
  layer.forward(nullptr, p.get(), x.get(), y.get(), 64, false);
  EXPECT_EQ(layer.last_stats(nullptr).capacity, 32);  // eval factor 2
  EXPECT_THROW(layer.forward(nullptr, p.get(), x.get(), y.get(), 65, true), Error);      // over max_tokens
  c.k = 5;
  EXPECT_THROW(model::MoeLayerGpu(c, 64, alloc), Error);
}
