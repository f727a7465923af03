// Checkpoints and the bf16 master's compensation, on the CPU: the ".compensation" tensors in
// optimizer.safetensors, and the two mismatches (a checkpoint without them loaded where a
// compensation is kept: zero with a note; one with them loaded where none is kept: dropped with a
// note). The GPU engine keeps the compensation; here a backend that adds one to the CPU backend's
// state stands in for it (tests/gpu/test_compensation_gpu.cpp runs the engine itself).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "runtime/safetensors.h"
#include "tests/support/cpu_test_util.h"
#include "tests/support/test_support.h"
#include "tests/support/tiny_cpu_backend.h"
#include "train/checkpoint.h"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {

// The CPU backend plus a compensation vector in its state (what the engine's save_state /
// load_state carry with bf16.bf16_master_compensation).
class WithCompensation final : public train::TrainBackend {
 public:
  WithCompensation(std::unique_ptr<train::TrainBackend> inner, std::vector<float> comp)
      : inner_(std::move(inner)), comp_(std::move(comp)) {}
  const model::TransformerParams& table() const override { return inner_->table(); }
  train::StepStats step(const std::int32_t* t, const std::int32_t* l, int s, float lr) override {
    return inner_->step(t, l, s, lr);
  }
  double eval_loss(const std::int32_t* t, const std::int32_t* l) override { return inner_->eval_loss(t, l); }
  train::MemoryStats memory() const override { return inner_->memory(); }
  void reset_peak() override { inner_->reset_peak(); }
  train::HostState save_state() const override {
    train::HostState s = inner_->save_state();
    s.compensation = comp_;
    return s;
  }
  void load_state(const train::HostState& s) override {
    // An empty compensation (a checkpoint without one) is zero, as in the engine.
    if (s.compensation.empty()) {
      std::fill(comp_.begin(), comp_.end(), 0.f);
    } else {
      ASSERT_EQ(s.compensation.size(), comp_.size());
      comp_ = s.compensation;
    }
    inner_->load_state(s);
  }
  bool has_compensation() const override { return true; }
  const char* describe() const override { return "cpu + compensation"; }
  const std::vector<float>& comp() const { return comp_; }

 private:
  std::unique_ptr<train::TrainBackend> inner_;
  std::vector<float> comp_;
};

bool has(const std::vector<std::string>& v, const std::string& what) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return s.find(what) != std::string::npos; });
}

}  // namespace

TEST(CheckpointCompensation, SavedAsTensorsAndLoadedBack) {
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::tiny_backend(rng());
  const train::TrainConfig c = test::tiny_adamw_config("comp.json");
  const std::size_t n = train::make_cpu_backend(o, c)->table().flat_size();
  const std::vector<float> comp = test::round_bf16(test::random_normal(n, rng, 0.f, 1e-5f));
  WithCompensation a(train::make_cpu_backend(o, c), comp);
  const fs::path dir = test::fresh_temp_dir("ckcomp");
  train::save_checkpoint(dir / "comp", a, {3, "rng", "bf16_full", false});
  const SafetensorsReader r(dir / "comp" / "global_step3" / "optimizer.safetensors");
  for (const auto& t : a.table().tensors()) {
    ASSERT_TRUE(r.contains(t.name + ".compensation")) << t.name;
    EXPECT_EQ(r.tensor(t.name + ".compensation").dtype, DType::BF16);  // its own dtype
  }
  WithCompensation b(train::make_cpu_backend(test::tiny_backend(o.seed + 1), c), std::vector<float>(n, 1.f));
  const train::CheckpointMeta m = train::load_checkpoint(dir / "comp", b);
  EXPECT_TRUE(m.notes.empty()) << m.notes.front();
  for (const auto& t : a.table().tensors())  // the tensors' elements (the flat buffer's padding is not saved)
    ASSERT_TRUE(std::equal(comp.begin() + t.offset, comp.begin() + t.offset + t.count, b.comp().begin() + t.offset))
        << t.name;

  // Loaded where none is kept: dropped with a note; the rest of the state as saved.
  auto plain = train::make_cpu_backend(test::tiny_backend(o.seed + 2), c);
  const train::CheckpointMeta mp = train::load_checkpoint(dir / "comp", *plain);
  EXPECT_TRUE(has(mp.notes, "bf16_master_compensation off and drops it"));
  EXPECT_TRUE(plain->save_state().params == a.save_state().params);
  fs::remove_all(dir);
}

TEST(CheckpointCompensation, ACheckpointWithoutItStartsTheCompensationAtZero) {
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::tiny_backend(rng());
  const train::TrainConfig c = test::tiny_adamw_config("comp.json");
  auto plain = train::make_cpu_backend(o, c);
  const fs::path dir = test::fresh_temp_dir("ckcomp0");
  train::save_checkpoint(dir, *plain, {2, "rng", "bf16_full", false});
  const std::size_t n = plain->table().flat_size();
  WithCompensation b(train::make_cpu_backend(test::tiny_backend(o.seed + 1), c), std::vector<float>(n, 0.5f));
  const train::CheckpointMeta m = train::load_checkpoint(dir, b);
  EXPECT_EQ(m.step, 2);
  EXPECT_TRUE(has(m.notes, "no compensation tensors")) << (m.notes.empty() ? "no notes" : m.notes.front());
  EXPECT_TRUE(has(m.notes, "starts at zero"));
  EXPECT_TRUE(std::all_of(b.comp().begin(), b.comp().end(), [](float x) { return x == 0.f; }));
  EXPECT_TRUE(b.save_state().params == plain->save_state().params);
  fs::remove_all(dir);
}
