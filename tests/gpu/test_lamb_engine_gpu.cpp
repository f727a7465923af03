// @brief optimizer.type Lamb in the GPU engine: 20 steps follow the CPU reference model trained by
// the host LAMB (train/lamb_optimizer.h) for every precision layout (and the compensated bf16
// master), the run differs from AdamW's, a checkpoint resumes bit-identically and records the
// optimizer, and the engine refuses ZeRO partitioning.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "model/reference_model.h"
#include "tests/support/cpu_test_util.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/engine.h"
#include "train/lamb_optimizer.h"

using namespace cutrain;

namespace {

train::TrainConfig lamb_config(const std::string& layout, const char* type = "Lamb") {
  const std::string lamb = std::string(type) == "Lamb" ? R"(, "max_coeff": 10, "min_coeff": 0.01)" : "";
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0, "optimizer": {"type": ")" +
                           std::string(type) + R"(", "params": {"lr": 1e-2, "weight_decay": 0.01)" + lamb +
                           R"(}}, "bf16": {)" + test::bf16_section(layout) + "}}";
  train::TrainConfig c = train::parse_config(text, "test:" + layout);
  c.resolve_batch(1);
  return c;
}

class LambEngineGpu : public ::testing::TestWithParam<const char*> {};

TEST_P(LambEngineGpu, TwentyStepsFollowTheReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::small_model(rng());
  const train::TrainConfig cfg = lamb_config(GetParam());
  train::GpuEngine eng(o, cfg);
  std::vector<float> p = eng.download_params(), g(p.size()), m(p.size(), 0.f), v(p.size(), 0.f);
  model::ReferenceModel<float> ref(eng.table());
  const auto tensors = train::lamb_tensors(eng.table());
  const std::size_t n = std::size_t(o.batch) * o.seq;
  for (int step = 1; step <= 20; ++step) {
    const auto tokens = test::random_ints(n, rng, 0, o.dims.vocab - 1), labels = test::random_ints(n, rng, 0, o.dims.vocab - 1);
    const train::StepStats st = eng.step(tokens.data(), labels.data(), step, 1e-3f);
    const double ref_loss = ref.forward(p.data(), tokens.data(), labels.data(), o.batch, o.seq);
    std::fill(g.begin(), g.end(), 0.f);
    ref.backward(p.data(), g.data());
    double sq = 0;
    for (float x : g) sq += double(x) * x;
    const double clip = std::min(1.0, 1.0 / (std::sqrt(sq) + 1e-6));
    train::host_lamb_step(train::lamb_params(cfg.optimizer, 1e-3f, step), clip, tensors, p.data(), g.data(), m.data(),
                          v.data());
    EXPECT_FALSE(st.skipped);
    EXPECT_NEAR(st.loss, ref_loss, 0.02 * ref_loss) << GetParam() << " step " << step;
  }
}

// The same steps under AdamW give other losses (the optimizer type is acted on).
TEST_P(LambEngineGpu, DiffersFromAdamW) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::small_model(rng());
  train::GpuEngine lamb(o, lamb_config(GetParam())), adamw(o, lamb_config(GetParam(), "AdamW"));
  const std::size_t n = std::size_t(o.batch) * o.seq;
  const auto tokens = test::random_ints(n, rng, 0, o.dims.vocab - 1), labels = test::random_ints(n, rng, 0, o.dims.vocab - 1);
  for (int step = 1; step <= 2; ++step) {
    lamb.step(tokens.data(), labels.data(), step, 1e-2f);
    adamw.step(tokens.data(), labels.data(), step, 1e-2f);
  }
  EXPECT_GT(test::rel_error(lamb.download_params(), adamw.download_params()), 1e-4);
}

TEST_P(LambEngineGpu, ResumeFromACheckpointIsBitIdentical) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::small_model(rng());
  const train::TrainConfig cfg = lamb_config(GetParam());
  const std::size_t n = std::size_t(o.batch) * o.seq;
  std::vector<std::vector<std::int32_t>> tok, lab;
  for (int s = 0; s < 6; ++s) {
    tok.push_back(test::random_ints(n, rng, 0, o.dims.vocab - 1));
    lab.push_back(test::random_ints(n, rng, 0, o.dims.vocab - 1));
  }
  std::vector<double> full;
  {
    train::GpuEngine a(o, cfg);
    for (int s = 0; s < 6; ++s) full.push_back(a.step(tok[s].data(), lab[s].data(), s + 1, 1e-2f).loss);
  }
  const auto dir = std::filesystem::temp_directory_path() /
                   ("cutrain_lamb_ckpt_" + std::string(GetParam()) + "_" + std::to_string(::getpid()));
  {
    train::GpuEngine b(o, cfg);
    for (int s = 0; s < 3; ++s) b.step(tok[s].data(), lab[s].data(), s + 1, 1e-2f);
    train::save_checkpoint(dir, b, train::CheckpointMeta{3, "", GetParam(), false, {}, "Lamb"});
  }
  const train::OpenedCheckpoint opened = train::open_checkpoint(dir);
  EXPECT_EQ(opened.manifest.config["optimizer"], "Lamb");
  EXPECT_THROW(train::check_checkpoint_optimizer(opened.manifest.config, train::OptimizerType::AdamW, "c"),
               train::OptimizerMismatchError);
  train::GpuEngine c(o, cfg);
  EXPECT_EQ(train::load_checkpoint(opened, c).step, 3);
  for (int s = 3; s < 6; ++s) EXPECT_EQ(c.step(tok[s].data(), lab[s].data(), s + 1, 1e-2f).loss, full[s]) << "step " << s;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, LambEngineGpu,
                         ::testing::Values("baseline", "bf16_master_wg", "bf16_full", "bf16_full_comp"));

}  // namespace
