// @brief The GPU MoE layer's and engine's expert-parallel path (model/moe_layer.h,
// train/engine.h) on the one lent GPU: ep_size 1 over a world-1 NCCL communicator, where the
// token all-to-all sends every row to this rank itself. The layer through the exchange against
// the same layer without it in the packed layout (routing figures exactly; output, input gradient
// and every parameter gradient, fp32 written and accumulated and bf16, to 1e-6 relative: the same
// GEMMs on the same rows in the same order), over top-1 / top-2, dropping or not, PR-MoE and the
// Jitter gate; the engine with the exchange (a world-1 NCCL communicator it makes itself, ZeRO
// stages 0 and 1) against the plain MoE engine without token dropping (where both run the packed
// rows' grouped GEMMs; with dropping the plain engine's slots run other GEMM kernels):
// losses, norms and routing figures of three steps; the bad input named. ep_size 2 over two GPUs is tests/e2e/moe_ep_cuda_cli.sh's (skipped with fewer).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/moe_config.h"
#include "model/moe_layer.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"

using namespace cutrain;
using test::DeviceArray;

namespace {

#define CUTRAIN_REQUIRE_NCCL()                                                     \
  do {                                                                             \
    CUTRAIN_REQUIRE_GPU();                                                         \
    if (!comm::nccl_available()) GTEST_SKIP() << "cutrain was built without NCCL"; \
  } while (0)

constexpr double kSame = 1e-6;  // the same kernels on the same rows: equal in practice

struct LayerCase {
  int T, H, F, E, k;
  bool drop = true, residual = false;
  model::MoeNoisyGate noise = model::MoeNoisyGate::None;
};

}  // namespace

TEST(MoeExpertParallelGpu, LayerThroughTheExchangeEqualsTheLocalLayer) {
  CUTRAIN_REQUIRE_NCCL();
  comm::LaunchEnv env;  // rank 0 of 1: the rendezvous returns at once
  std::unique_ptr<comm::Communicator> group = comm::Communicator::create(env, /*device=*/0);
  auto rng = test::fresh_rng();
  CachingAllocator alloc(make_device_source());
  const std::vector<LayerCase> cases = {{50, 32, 48, 4, 1},        {64, 64, 128, 8, 2},
                                        {33, 24, 40, 3, 2, false}, {48, 32, 40, 4, 2, true, true},
                                        {40, 32, 40, 6, 1, true, false, model::MoeNoisyGate::Jitter}};
  for (const LayerCase& cs : cases) {
    SCOPED_TRACE("T=" + std::to_string(cs.T) + " H=" + std::to_string(cs.H) + " E=" + std::to_string(cs.E) +
                 " k=" + std::to_string(cs.k) + (cs.drop ? "" : " no-drop") + (cs.residual ? " residual" : "") +
                 (cs.noise == model::MoeNoisyGate::Jitter ? " jitter" : ""));
    model::MoeConfig c;
    c.hidden = cs.H, c.ffn = cs.F, c.experts = cs.E, c.k = cs.k, c.drop_tokens = cs.drop, c.min_capacity = 4;
    c.use_residual = cs.residual;
    c.noisy_gate_policy = cs.noise;
    const auto lay = model::moe_param_layout(c);
    const std::size_t TH = std::size_t(cs.T) * cs.H;
    const std::uint64_t seed = rng();
    const auto p = test::round_bf16(test::random_normal(lay.total, rng, 0.f, 0.25f));
    const auto x = test::round_bf16(test::random_normal(TH, rng));
    const auto dy = test::round_bf16(test::random_normal(TH, rng));
    DeviceArray<bf16> dp(test::to_bf16(p)), dx_in(test::to_bf16(x)), ddy(test::to_bf16(dy));
    model::MoeLayerGpu local(c, cs.T + 5, alloc, nullptr, /*packed=*/true), ep(c, cs.T + 5, alloc, group.get());
    EXPECT_FALSE(ep.capturable());
    DeviceArray<bf16> y_local(TH), y_ep(TH);
    local.forward(nullptr, dp.get(), dx_in.get(), y_local.get(), cs.T, true, seed);
    ep.forward(nullptr, dp.get(), dx_in.get(), y_ep.get(), cs.T, true, seed);
    const auto sl = local.last_stats(nullptr), se = ep.last_stats(nullptr);
    EXPECT_EQ(se.capacity, sl.capacity);
    EXPECT_EQ(se.dropped, sl.dropped);
    EXPECT_EQ(se.expert_counts, sl.expert_counts);
    EXPECT_EQ(se.kept_counts, sl.kept_counts);
    EXPECT_EQ(se.l_aux, sl.l_aux);
    const auto yl = test::download_float(y_local), ye = test::download_float(y_ep);
    ASSERT_EQ(test::count_nan(ye), 0u);
    EXPECT_LE(test::rel_error(ye, yl), kSame) << "output";
    const float aux_grad = 0.1f;
    for (DType gt : {DType::F32, DType::BF16}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(gt)) + (accumulate ? " accumulated" : " written"));
        // Accumulating: both start from the same written gradients of a first backward.
        DeviceArray<float> gl32(lay.total), ge32(lay.total);
        DeviceArray<bf16> gl16(lay.total), ge16(lay.total);
        void* gl = gt == DType::F32 ? static_cast<void*>(gl32.get()) : static_cast<void*>(gl16.get());
        void* ge = gt == DType::F32 ? static_cast<void*>(ge32.get()) : static_cast<void*>(ge16.get());
        DeviceArray<bf16> dxl(TH), dxe(TH);
        if (accumulate) {
          local.backward(nullptr, dp.get(), dx_in.get(), ddy.get(), aux_grad, dxl.get(), gl, gt, false);
          ep.backward(nullptr, dp.get(), dx_in.get(), ddy.get(), aux_grad, dxe.get(), ge, gt, false);
        }
        local.backward(nullptr, dp.get(), dx_in.get(), ddy.get(), aux_grad, dxl.get(), gl, gt, accumulate);
        ep.backward(nullptr, dp.get(), dx_in.get(), ddy.get(), aux_grad, dxe.get(), ge, gt, accumulate);
        const auto a = test::download_float(dxl), b = test::download_float(dxe);
        ASSERT_EQ(test::count_nan(b), 0u);
        EXPECT_LE(test::rel_error(b, a), kSame) << "dx";
        const std::vector<float> g_local = gt == DType::F32 ? gl32.download() : test::download_float(gl16);
        const std::vector<float> g_ep = gt == DType::F32 ? ge32.download() : test::download_float(ge16);
        ASSERT_EQ(test::count_nan(g_ep), 0u);  // every gradient written, the experts' included
        EXPECT_LE(test::rel_error(g_ep, g_local), kSame) << "parameter gradients";
      }
    }
  }
}

namespace {

train::TrainConfig config(int stage) {
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
      "weight_decay": 0.01}}, "bf16": {)" + test::bf16_section("bf16_master_wg") +
                           R"(}, "zero_optimization": {"stage": )" + std::to_string(stage) + "}}";
  train::TrainConfig c = train::parse_config(text, "test:ep");
  c.resolve_batch(1);
  return c;
}

train::BackendOptions moe_options(std::uint64_t seed) {
  train::BackendOptions o = test::small_model(seed);
  o.dims.moe.experts = {4, 4};
  o.dims.moe.k = 2;
  o.dims.moe.use_residual = false;
  o.dims.moe.loss_coeff = 0.01;
  o.dims.moe.drop_tokens = false;  // both engines on the packed rows (the plain one eager too)
  return o;
}

}  // namespace

TEST(MoeExpertParallelGpu, EngineAtEpOneEqualsThePlainMoeRun) {
  CUTRAIN_REQUIRE_NCCL();
  auto rng = test::fresh_rng();
  for (int stage : {0, 1}) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(stage));
    const train::BackendOptions plain = moe_options(rng());
    train::BackendOptions ep = plain;
    ep.moe_exchange = true;  // --moe_expert_parallel_size 1 on cuda: the exchange's path
    const train::TrainConfig cfg = config(stage);
    train::GpuEngine a(plain, cfg), b(ep, cfg);
    EXPECT_NE(std::string(b.describe()).find("expert parallel: ep_size 1 of world 1 (token all-to-all over nccl)"),
              std::string::npos)
        << b.describe();
    const std::size_t n = 2 * std::size_t(plain.batch) * plain.seq;
    for (int step = 1; step <= 3; ++step) {
      const auto tok = test::random_ints(n, rng, 0, plain.dims.vocab - 1);
      const auto lab = test::random_ints(n, rng, 0, plain.dims.vocab - 1);
      const train::StepStats sa = a.step(tok.data(), lab.data(), step, 1e-3f);
      const train::StepStats sb = b.step(tok.data(), lab.data(), step, 1e-3f);
      EXPECT_NEAR(sb.loss, sa.loss, kSame * std::abs(sa.loss)) << "step " << step;
      EXPECT_NEAR(sb.grad_norm, sa.grad_norm, kSame * std::abs(sa.grad_norm)) << "step " << step;
      ASSERT_EQ(sb.moe.size(), sa.moe.size());
      for (std::size_t i = 0; i < sa.moe.size(); ++i) {
        EXPECT_EQ(sb.moe[i].dropped, sa.moe[i].dropped);
        EXPECT_EQ(sb.moe[i].min_load, sa.moe[i].min_load);
        EXPECT_EQ(sb.moe[i].max_load, sa.moe[i].max_load);
      }
    }
    EXPECT_LE(test::rel_error(b.download_params(), a.download_params()), kSame) << "params after 3 steps";
  }
}

TEST(MoeExpertParallelGpu, BadInputNamed) {
  CUTRAIN_REQUIRE_NCCL();
  auto rng = test::fresh_rng();
  train::BackendOptions o = moe_options(rng());
  o.moe_exchange = true;
  EXPECT_NE(test::error_of([&] { train::GpuEngine e(o, config(3)); })
                .find("zero_optimization.stage 3 with --moe_expert_parallel_size 1"),
            std::string::npos);
  o.expert_parallel = 2;  // one process: world 1
  EXPECT_NE(test::error_of([&] { train::GpuEngine e(o, config(0)); })
                .find("--moe_expert_parallel_size 2 does not divide the data-parallel world size 1"),
            std::string::npos);
  o.expert_parallel = 3;
  EXPECT_NE(test::error_of([&] { train::GpuEngine e(o, config(0)); })
                .find("--moe_expert_parallel_size 3 does not divide a MoE block's 4 experts"),
            std::string::npos);
}
