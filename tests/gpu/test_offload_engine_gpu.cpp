// GpuEngine::offload_states / reload_states: training continues with exactly the losses and the
// parameters it would have had without the round trip (each precision layout, CUDA graph on, so
// the graph captured before the reload must be rebuilt), and allocated device memory falls by the
// offloaded states' bytes.
#include <gtest/gtest.h>

#include "runtime/allocator.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"

using namespace cutrain;

namespace {

using test::small_model;

train::TrainConfig config_for(const std::string& layout) {
  std::string bf16 = test::bf16_section(layout);
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
      "weight_decay": 0.01}}, "bf16": {)" + bf16 + "}}";
  train::TrainConfig c = train::parse_config(text, "test:" + layout);
  c.resolve_batch(1);
  return c;
}

class OffloadEngineGpu : public ::testing::TestWithParam<const char*> {};

TEST_P(OffloadEngineGpu, ContinuationAfterRoundTripsIsBitExact) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = small_model(rng());
  const int steps = 6;
  const auto [tok, lab] = test::random_step_batches(rng, steps, o);
  auto run = [&](bool offload) {
    train::GpuEngine eng(o, config_for(GetParam()));
    std::vector<double> losses;
    for (int i = 0; i < steps; ++i) {
      losses.push_back(eng.step(tok[i].data(), lab[i].data(), i + 1, 1e-3f).loss);
      if (!offload) continue;
      if (i == 1) {  // blocking, pinned, everything
        const auto before = device_allocator().stats().allocated_bytes.current;
        eng.offload_states({}, OffloadDevice::Cpu, true, false);
        const auto after = device_allocator().stats().allocated_bytes.current;
        EXPECT_GE(before - after, std::int64_t(eng.state_requested_bytes())) << "allocated memory must fall by the states";
        eng.reload_states(false);
        // (block sizes may differ from the first allocation's by the allocator's split rules)
        EXPECT_GE(device_allocator().stats().allocated_bytes.current - after, std::int64_t(eng.state_requested_bytes()));
      } else if (i == 3) {  // non-blocking, pageable, a subset; the next step waits by itself
        eng.offload_states({"optim_states", "lp_params"}, OffloadDevice::Cpu, false, true);
        eng.reload_states(true);
      } else if (i == 4) {  // offloaded and not reloaded: the next step reloads
        eng.offload_states({"optim_states", "lp_grads"}, OffloadDevice::Cpu, true, true);
      }
    }
    return std::make_pair(losses, eng.download_params());
  };
  auto [l0, p0] = run(false);
  auto [l1, p1] = run(true);
  EXPECT_EQ(l1, l0);
  EXPECT_TRUE(p1 == p0);
}

TEST(OffloadEngineGpu, UnknownStateNamesTheValidOnes) {
  CUTRAIN_REQUIRE_GPU();
  train::GpuEngine eng(small_model(1), config_for("bf16_master_wg"));
  try {
    eng.offload_states({"hp_params"}, OffloadDevice::Cpu, true, false);  // no fp32 master in this layout
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("hp_params"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("optim_states"), std::string::npos) << e.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, OffloadEngineGpu,
                         ::testing::Values("baseline", "bf16_master_wg", "bf16_full", "bf16_master_wg_comp",
                                           "bf16_full_comp"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
