// zero_optimization.offload_optimizer in GpuEngine (device nvme and cpu, pipelined and blocking):
// for every precision layout, several steps with the optimizer state swapped out between steps give
// bit-identical losses, bf16 params, fp32 master and moments to a resident run; the CUDA graph is
// captured once (the swap never forces a re-capture); between steps the swapped state takes no
// device memory (allocated rises by at least its bytes when it is brought back); the NVMe files
// exist between steps and are gone after the engine; the engine's offload_states works on top.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <tuple>

#include "runtime/allocator.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {

struct Variant {
  const char* name;
  const char* device;  // "none" | "cpu" | "nvme"
  bool pipeline_read, pipeline_write, pin_memory;
};

const Variant kResident{"resident", "none", false, false, false};
const Variant kVariants[] = {
    {"nvme_pipelined", "nvme", true, true, true},
    {"nvme_blocking", "nvme", false, false, true},
    {"nvme_read_pipelined_only", "nvme", true, false, true},
    {"cpu_pinned_pipelined", "cpu", true, true, true},
    {"cpu_pageable_blocking", "cpu", false, false, false},
};

using test::small_model;

std::string b(bool v) { return v ? "true" : "false"; }

train::TrainConfig config_for(const std::string& layout, const Variant& v, const std::string& nvme_dir) {
  std::string bf16 = test::bf16_section(layout);
  std::string zero = R"("stage": 2)";
  if (std::string(v.device) != "none")
    zero += R"(, "offload_optimizer": {"device": ")" + std::string(v.device) + R"(", "nvme_path": ")" + nvme_dir +
            R"(", "pin_memory": )" + b(v.pin_memory) + R"(, "buffer_count": 4, "pipeline_read": )" + b(v.pipeline_read) +
            R"(, "pipeline_write": )" + b(v.pipeline_write) + "}";
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
      "weight_decay": 0.01}}, "bf16": {)" + bf16 + "}, \"zero_optimization\": {" + zero + "}}";
  train::TrainConfig c = train::parse_config(text, "test:" + layout + ":" + v.name);
  c.resolve_batch(1);
  return c;
}

fs::path fresh_dir(const std::string& tag) {
  static int n = 0;
  const fs::path d = fs::temp_directory_path() / ("cutrain_optswap_" + tag + "_" + std::to_string(::getpid()) + "_" +
                                                  std::to_string(n++));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<float> params;
  train::HostState state;
  int captures = 0;
};

class OptimizerOffloadGpu : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(OptimizerOffloadGpu, SwappedStateTrainsBitIdenticallyAndLeavesTheDevice) {
  CUTRAIN_REQUIRE_GPU();
  const std::string layout = std::get<0>(GetParam());
  const Variant& var = kVariants[std::get<1>(GetParam())];
  auto rng = test::fresh_rng();
  const train::BackendOptions o = small_model(rng());
  const int steps = 6;
  const auto [tok, lab] = test::random_step_batches(rng, steps, o);
  const fs::path dir = fresh_dir(var.name);

  auto run = [&](const Variant& v) {
    const bool swapped = std::string(v.device) != "none";
    testing::internal::CaptureStdout();
    auto eng = std::make_unique<train::GpuEngine>(o, config_for(layout, v, dir.string()));
    const std::string log = testing::internal::GetCapturedStdout();
    RunResult r;
    train::OptimizerSwap* swap = eng->optimizer_swap();
    EXPECT_EQ(swap != nullptr, swapped);
    if (swapped) {
      // The start-up line says what goes where.
      EXPECT_NE(log.find("offload_optimizer: optim_states.exp_avg, optim_states.exp_avg_sq"), std::string::npos) << log;
      EXPECT_NE(log.find(std::string(v.device) == "nvme" ? "files under " + dir.string() : std::string("host memory")),
                std::string::npos)
          << log;
      EXPECT_EQ(log.find("hp_params") != std::string::npos, eng->plan().has_master) << log;
      EXPECT_EQ(log.find("optim_states.compensation") != std::string::npos, eng->plan().compensation) << log;
      // At least the moments (and the fp32 master, or the bf16 master's compensation, where the
      // layout has it).
      const std::size_t moments = 2 * eng->table().flat_size() * dtype_size(eng->plan().moment);
      const std::size_t master = eng->plan().has_master ? eng->table().flat_size() * 4 : 0;
      const std::size_t comp = eng->plan().compensation ? eng->table().flat_size() * 2 : 0;
      EXPECT_EQ(swap->bytes(), moments + master + comp);
      EXPECT_TRUE(swap->swapped_out()) << "the state must be off the device from the start";
    }
    for (int i = 0; i < steps; ++i) {
      r.losses.push_back(eng->step(tok[i].data(), lab[i].data(), i + 1, 1e-3f).loss);
      if (i == 3) {
        // The engine's offload_states (both runs; its reload re-captures the graph once): with a
        // swap, the swap hands its states over first.
        eng->offload_states({"optim_states"}, OffloadDevice::Cpu, true, true);
      }
      if (!swapped) continue;
      swap->synchronize();  // a pipelined write lands and its device memory goes back
      EXPECT_EQ(swap->swapped_out(), i != 3) << "after step " << i + 1;  // step 4: handed to offload_states
      if (std::string(v.device) == "nvme" && i != 3) {
        EXPECT_TRUE(fs::exists(dir / "optim_states.exp_avg.state")) << "after step " << i + 1;
        EXPECT_EQ(fs::file_size(dir / "optim_states.exp_avg_sq.state"),
                  eng->table().flat_size() * dtype_size(eng->plan().moment));
      }
      if (i == 1) {
        // Between steps the swapped state holds no device memory: bringing it back raises
        // allocated by at least its bytes, sending it out again lowers it by as much.
        const auto off = device_allocator().stats().allocated_bytes.current;
        swap->make_resident();
        const auto res = device_allocator().stats().allocated_bytes.current;
        EXPECT_GE(res - off, std::int64_t(swap->bytes()));
        swap->swap_out(false);
        const auto back = device_allocator().stats().allocated_bytes.current;
        EXPECT_GE(res - back, std::int64_t(swap->bytes()));
      }
    }
    r.params = eng->download_params();
    r.state = eng->save_state();
    if (swapped) {
      EXPECT_TRUE(swap->swapped_out()) << "save_state puts the state back where it lives";
    }
    r.captures = eng->graph_captures();
    eng.reset();
    if (std::string(v.device) == "nvme") {
      EXPECT_TRUE(fs::is_empty(dir)) << "swap files left in " << dir;
    }
    return r;
  };

  const RunResult ref = run(kResident);
  const RunResult got = run(var);
  EXPECT_EQ(got.losses, ref.losses);
  EXPECT_TRUE(got.params == ref.params) << "bf16 params differ";
  EXPECT_TRUE(got.state.master == ref.state.master) << "fp32 master differs";
  EXPECT_TRUE(got.state.exp_avg == ref.state.exp_avg) << "exp_avg differs";
  EXPECT_TRUE(got.state.exp_avg_sq == ref.state.exp_avg_sq) << "exp_avg_sq differs";
  EXPECT_TRUE(got.state.compensation == ref.state.compensation) << "compensation differs";
  EXPECT_EQ(got.state.compensation.size(), ref.params.size() * std::size_t(layout.find("_comp") != std::string::npos));
  // Captures at step 2 and, after offload_states' reload, at step 6; the swap (its own offloader,
  // states the graph does not touch) never forces another.
  EXPECT_EQ(ref.captures, 2);
  EXPECT_EQ(got.captures, 2);
  fs::remove_all(dir);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<const char*, int>>& info) {
  return std::string(std::get<0>(info.param)) + "_" + kVariants[std::get<1>(info.param)].name;
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndVariants, OptimizerOffloadGpu,
                         ::testing::Combine(::testing::Values("baseline", "bf16_master_wg", "bf16_full",
                                                                              "bf16_full_comp"),
                                            ::testing::Range(0, int(std::size(kVariants)))),
                         case_name);

TEST(OptimizerOffloadGpu, MissingNvmeFolderIsAConfigErrorAtEngineStart) {
  CUTRAIN_REQUIRE_GPU();
  const fs::path missing = fs::temp_directory_path() / ("cutrain_no_such_swap_" + std::to_string(::getpid()));
  fs::remove_all(missing);
  try {
    train::GpuEngine eng(small_model(1), config_for("bf16_full", kVariants[0], missing.string()));
    FAIL() << "expected a ConfigError";
  } catch (const train::ConfigError& e) {
    EXPECT_NE(e.message().find("zero_optimization.offload_optimizer.nvme_path"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(missing.string()), std::string::npos) << e.message();
  }
}

}  // namespace
