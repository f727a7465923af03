// The compensated bf16 master in the engine: exactly 2 more bytes per parameter of state by the
// allocator's figures, the compensation offloaded with the optimizer state, and a checkpoint saved
// without it resumed with it (compensation from zero, with a warning) and the other way round.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "runtime/allocator.h"
#include "tests/support/small_model.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/engine.h"

using namespace cutrain;

namespace {

using test::small_model;

train::TrainConfig config_for(const std::string& layout) {
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
      "weight_decay": 0.01}}, "bf16": {)" + test::bf16_section(layout) + "}}";
  train::TrainConfig c = train::parse_config(text, "test:" + layout);
  c.resolve_batch(1);
  return c;
}

bool has(const std::vector<std::string>& v, const std::string& what) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return s.find(what) != std::string::npos; });
}

}  // namespace

TEST(CompensationGpu, AddsExactlyTwoBytesPerParameterOfState) {
  CUTRAIN_REQUIRE_GPU();
  const train::BackendOptions o = small_model(3);
  for (const char* plain : {"bf16_master_wg", "bf16_full"}) {
    SCOPED_TRACE(plain);
    std::size_t plain_bytes = 0, n = 0;
    {
      train::GpuEngine a(o, config_for(plain));
      plain_bytes = a.state_requested_bytes();
      n = a.table().flat_size();
    }
    train::GpuEngine b(o, config_for(std::string(plain) + "_comp"));
    EXPECT_TRUE(b.plan().compensation);
    // The allocator's requested figure: exactly n x 2 bytes more, nothing else changed.
    EXPECT_EQ(b.state_requested_bytes(), plain_bytes + 2 * n);
    EXPECT_EQ(b.state_requested_bytes(), n * b.plan().bytes_per_param());
    EXPECT_EQ(b.plan().bytes_per_param(), std::string(plain) == "bf16_full" ? 10u : 14u);
  }
}

TEST(CompensationGpu, OffloadStatesMovesTheCompensationWithTheOptimizerState) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = small_model(rng());
  const auto [tok, lab] = test::random_step_batches(rng, 4, o);
  train::GpuEngine eng(o, config_for("bf16_full_comp"));
  for (int i = 0; i < 2; ++i) eng.step(tok[i].data(), lab[i].data(), i + 1, 1e-3f);
  EXPECT_TRUE(has(eng.offloader().names(), "optim_states.compensation"));
  const auto before = device_allocator().stats().allocated_bytes.current;
  eng.offload_states({"optim_states"}, OffloadDevice::Cpu, true, false);
  const auto after = device_allocator().stats().allocated_bytes.current;
  // Moments (2 x 2 bytes) and compensation (2 bytes) per parameter left the device (the moments
  // alone are 4 bytes, plus at most the allocator's rounding).
  EXPECT_GE(before - after, std::int64_t(6 * eng.table().flat_size()));
  eng.reload_states(false);
  for (int i = 2; i < 4; ++i) EXPECT_TRUE(std::isfinite(eng.step(tok[i].data(), lab[i].data(), i + 1, 1e-3f).loss));
}

TEST(CompensationGpu, CheckpointWithoutCompensationResumesFromZeroWithAWarning) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = small_model(rng());
  const auto [tok, lab] = test::random_step_batches(rng, 3, o);
  const auto dir = std::filesystem::temp_directory_path() / ("cutrain_gpu_comp_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::vector<float> saved_params;
  {
    train::GpuEngine a(o, config_for("bf16_full"));
    for (int i = 0; i < 3; ++i) a.step(tok[i].data(), lab[i].data(), i + 1, 1e-3f);
    saved_params = a.download_params();
    train::save_checkpoint(dir / "plain", a, train::CheckpointMeta{3, "", "bf16_full", false});
  }
  train::GpuEngine b(o, config_for("bf16_full_comp"));
  for (int i = 0; i < 2; ++i) b.step(tok[i].data(), lab[i].data(), i + 1, 1e-3f);  // a non-zero compensation
  const std::vector<float> before = b.save_state().compensation;
  ASSERT_TRUE(std::any_of(before.begin(), before.end(), [](float c) { return c != 0.f; }))
      << "two steps leave some rounding residual";
  const train::CheckpointMeta m = train::load_checkpoint(dir / "plain", b);
  EXPECT_TRUE(has(m.notes, "starts at zero")) << (m.notes.empty() ? "no notes" : m.notes[0]);
  const train::HostState s = b.save_state();
  EXPECT_TRUE(s.params == saved_params);
  ASSERT_EQ(s.compensation.size(), saved_params.size());
  EXPECT_TRUE(std::all_of(s.compensation.begin(), s.compensation.end(), [](float c) { return c == 0.f; }));

  // Saved with the compensation: ".compensation" tensors; a plain run drops them with a warning.
  train::save_checkpoint(dir / "comp", b, train::CheckpointMeta{3, "", "bf16_full", false});
  train::GpuEngine c(o, config_for("bf16_full"));
  EXPECT_TRUE(has(train::load_checkpoint(dir / "comp", c).notes, "drops it"));
  EXPECT_TRUE(c.download_params() == saved_params);
  std::filesystem::remove_all(dir);
}
