// The GPU engine's pipeline and tensor-parallel code paths on one GPU against the plain engine:
// the step through the pipeline's 1F1B program at degree 1 (train/gpu_pipeline.h), every stage
// of a 2-4 stage pipeline in this one process (virtual stages: activations handed between the
// stages' models as device copies), and tensor parallelism of degree 1 (the blocks' all-reduces
// over a one-rank NCCL communicator), alone and together. The same kernels run on the same inputs
// in the same order per stage, each stage's backwards in micro-batch order, so losses, gradient
// norms, eval losses and final params must equal the plain engine's bit for bit, with the CUDA
// graph captured and replayed. The pipeline over ranks (one stage per GPU over NCCL) at world
// size 1, its one stage through the multi-rank code path, against the plain engine bit for bit.
// Also the refusals of what is not built (stages over ranks without NCCL or with ZeRO 1-3,
// tensor parallelism above one rank in one process, a partial stage of GPT-2).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <ostream>
#include <string>

#include "runtime/comm/communicator.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"

using namespace cutrain;

namespace {

struct Case {
  const char* layout;           // baseline | bf16_full
  int accumulation = 4;
  int stages = 1;               // 1: the pipeline at degree 1; > 1: that many stages in this process
  bool pipeline = true;         // run the step through the pipeline
  bool tensor_parallel = false; // degree 1 over a one-rank NCCL communicator
  bool checkpointing = false;
  model::Arch arch = model::Arch::Simple;
  float clip = 0.f;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  std::string n = std::string(c.layout) + "_accum" + std::to_string(c.accumulation);
  if (c.pipeline) n += c.stages == 1 ? "_pp1" : "_virtual" + std::to_string(c.stages);
  if (c.tensor_parallel) n += "_tp1";
  if (c.checkpointing) n += "_ckpt";
  if (c.arch == model::Arch::Gpt2) n += "_gpt2";
  if (c.clip > 0) n += "_clip";
  return n;
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name({c, 0}); }

train::TrainConfig config_for(const Case& c) {
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" +
                           std::to_string(c.accumulation) + R"(, "gradient_clipping": )" + std::to_string(c.clip) +
                           R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999],
                           "eps": 1e-8, "weight_decay": 0.01}}, "bf16": {)" + test::bf16_section(c.layout) + "}}";
  train::TrainConfig cfg = train::parse_config(text, std::string("test:") + c.layout);
  cfg.resolve_batch(1);
  return cfg;
}

train::BackendOptions plain_options(const Case& c, std::uint64_t seed) {
  train::BackendOptions o = test::small_model(seed);
  o.dims.layers = 4;  // 6 pipeline layers: up to 4 stages of more than one layer
  o.dims.arch = c.arch;
  o.activation_checkpointing = c.checkpointing;
  return o;
}

std::shared_ptr<comm::Communicator> one_rank_comm() {
  comm::LaunchEnv env;  // rank 0 of 1
  return std::shared_ptr<comm::Communicator>(comm::Communicator::create(env, /*device=*/0));
}

::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

class PipelineGpu : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(PipelineGpu, EqualsThePlainEngineBitForBit) {
  CUTRAIN_REQUIRE_GPU();
  const Case c = GetParam();
  if (c.tensor_parallel && !comm::nccl_available()) GTEST_SKIP() << "cutrain was built without NCCL";
  auto rng = test::fresh_rng();
  const train::BackendOptions plain = plain_options(c, rng());
  train::BackendOptions opt = plain;
  opt.pipeline_engine = c.pipeline;
  opt.stages_in_process = c.stages;
  opt.partition_method = "uniform";
  opt.tensor_parallel_engine = c.tensor_parallel;
  if (c.tensor_parallel) opt.tp_comm = one_rank_comm();
  train::GpuEngine ref(plain, config_for(c));
  train::GpuEngine eng(opt, config_for(c));
  ASSERT_EQ(ref.pipeline(), nullptr);
  if (c.pipeline) {
    ASSERT_NE(eng.pipeline(), nullptr);
    EXPECT_EQ(eng.pipeline()->stages(), c.stages);
    EXPECT_EQ(eng.pipeline()->program().size(), std::size_t(2 * c.stages * c.accumulation));
  }
  EXPECT_EQ(eng.tensor_parallel_group() != nullptr, c.tensor_parallel);
  ASSERT_TRUE(same_bits(ref.download_params(), eng.download_params())) << "initial params";
  const std::size_t per_step = std::size_t(c.accumulation) * plain.batch * plain.seq;
  for (int step = 1; step <= 5; ++step) {
    const auto tokens = test::random_ints(per_step, rng, 0, plain.dims.vocab - 1);
    const auto labels = test::random_ints(per_step, rng, 0, plain.dims.vocab - 1);
    const train::StepStats a = ref.step(tokens.data(), labels.data(), step, 1e-3f);
    const train::StepStats b = eng.step(tokens.data(), labels.data(), step, 1e-3f);
    EXPECT_EQ(a.loss, b.loss) << case_name({c, 0}) << " step " << step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << case_name({c, 0}) << " step " << step;
    EXPECT_FALSE(b.skipped) << "step " << step;
  }
  {
    const std::size_t n = std::size_t(plain.batch) * plain.seq;
    const auto tokens = test::random_ints(n, rng, 0, plain.dims.vocab - 1);
    const auto labels = test::random_ints(n, rng, 0, plain.dims.vocab - 1);
    EXPECT_EQ(ref.eval_loss(tokens.data(), labels.data()), eng.eval_loss(tokens.data(), labels.data())) << "eval loss";
  }
  EXPECT_TRUE(ref.graph_active());
  EXPECT_TRUE(eng.graph_active()) << "the pipeline's step (hand-over copies, NCCL all-reduces) should be captured";
  EXPECT_TRUE(same_bits(ref.download_params(), eng.download_params())) << "final params";
  EXPECT_TRUE(same_bits(ref.download_grads(), eng.download_grads())) << "last gradients";
  // The test helper's forward_backward goes through the same program.
  const auto tokens = test::random_ints(per_step, rng, 0, plain.dims.vocab - 1);
  const auto labels = test::random_ints(per_step, rng, 0, plain.dims.vocab - 1);
  EXPECT_EQ(ref.forward_backward(tokens.data(), labels.data()), eng.forward_backward(tokens.data(), labels.data()));
  EXPECT_TRUE(same_bits(ref.download_grads(), eng.download_grads())) << "forward_backward's gradients";
}

INSTANTIATE_TEST_SUITE_P(
    Paths, PipelineGpu,
    ::testing::Values(Case{"baseline", 1}, Case{"baseline", 4}, Case{"bf16_full", 4}, Case{"bf16_full", 4, 1, true, false, true},
                      Case{"baseline", 4, 1, true, false, false, model::Arch::Gpt2},
                      Case{"baseline", 4, 2}, Case{"baseline", 1, 2}, Case{"bf16_full", 4, 3}, Case{"baseline", 7, 4},
                      Case{"bf16_full", 4, 4, true, false, true}, Case{"baseline", 4, 2, true, false, false, model::Arch::Simple, 0.05f},
                      Case{"baseline", 4, 1, false, true}, Case{"bf16_full", 4, 1, false, true, true},
                      Case{"baseline", 4, 1, false, true, false, model::Arch::Gpt2},
                      Case{"baseline", 4, 1, true, true}, Case{"baseline", 4, 3, true, true}),
    case_name);

namespace {
class PipelineGpuOverRanks : public ::testing::TestWithParam<Case> {};
}  // namespace

// The pipeline over ranks (train/gpu_pipeline.h's one stage per rank) at world size 1: the grid's
// groups (the world itself), the stage's program with its NCCL loss broadcast and status sum, the
// stage range's data-parallel all-reduce, the norm's sum of squares summed over the pipeline group,
// the optimizer over the stage's range, the checkpoint summed over the pipeline group and the eval
// through the pipeline: every one a real NCCL call on a one-rank communicator, each the identity,
// so the plain engine's bits. (Two or more stages need as many GPUs: docs/distributed.md.)
TEST_P(PipelineGpuOverRanks, WorldOneEqualsThePlainEngineBitForBit) {
  CUTRAIN_REQUIRE_GPU();
  if (!comm::nccl_available()) GTEST_SKIP() << "cutrain was built without NCCL";
  const Case c = GetParam();
  auto rng = test::fresh_rng();
  const train::BackendOptions plain = plain_options(c, rng());
  train::BackendOptions opt = plain;
  opt.pipeline_engine = true;
  opt.pipeline_over_ranks = true;
  opt.partition_method = "uniform";
  opt.comm = one_rank_comm();
  train::GpuEngine ref(plain, config_for(c));
  train::GpuEngine eng(opt, config_for(c));
  ASSERT_NE(eng.pipeline(), nullptr);
  ASSERT_NE(eng.pipeline()->link(), nullptr) << "the pipeline over ranks";
  EXPECT_EQ(eng.pipeline()->rank_stage(), 0);
  EXPECT_EQ(eng.pipeline()->stages(), 1);
  EXPECT_TRUE(eng.pipeline()->exchanges().empty()) << "one stage sends nothing";
  ASSERT_NE(eng.pipeline_group(), nullptr);
  EXPECT_EQ(eng.pipeline_group()->world_size(), 1);
  ASSERT_NE(eng.stage_dp_group(), nullptr);
  EXPECT_EQ(eng.stage_dp_group()->world_size(), 1);
  EXPECT_EQ(eng.stage_range().begin, std::size_t(0));
  EXPECT_EQ(eng.stage_range().end, eng.table().flat_size());
  const std::size_t per_step = std::size_t(c.accumulation) * plain.batch * plain.seq;
  for (int step = 1; step <= 5; ++step) {
    const auto tokens = test::random_ints(per_step, rng, 0, plain.dims.vocab - 1);
    const auto labels = test::random_ints(per_step, rng, 0, plain.dims.vocab - 1);
    const train::StepStats a = ref.step(tokens.data(), labels.data(), step, 1e-3f);
    const train::StepStats b = eng.step(tokens.data(), labels.data(), step, 1e-3f);
    EXPECT_EQ(a.loss, b.loss) << case_name({c, 0}) << " step " << step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << case_name({c, 0}) << " step " << step;
    EXPECT_FALSE(b.skipped) << "step " << step;
  }
  {
    const std::size_t n = std::size_t(plain.batch) * plain.seq;
    const auto tokens = test::random_ints(n, rng, 0, plain.dims.vocab - 1);
    const auto labels = test::random_ints(n, rng, 0, plain.dims.vocab - 1);
    EXPECT_EQ(ref.eval_loss(tokens.data(), labels.data()), eng.eval_loss(tokens.data(), labels.data())) << "eval loss";
  }
  EXPECT_TRUE(eng.graph_active()) << "the pipeline's NCCL calls should be captured with the step";
  EXPECT_TRUE(same_bits(ref.download_params(), eng.download_params())) << "final params";
  EXPECT_TRUE(same_bits(ref.download_grads(), eng.download_grads())) << "last gradients";
  // The checkpoint: the stages' ranges summed over the pipeline group.
  const train::HostState a = ref.save_state(), b = eng.save_state();
  EXPECT_TRUE(same_bits(a.params, b.params)) << "saved params";
  EXPECT_TRUE(same_bits(a.master, b.master)) << "saved master";
  EXPECT_TRUE(same_bits(a.exp_avg, b.exp_avg)) << "saved exp_avg";
  EXPECT_TRUE(same_bits(a.exp_avg_sq, b.exp_avg_sq)) << "saved exp_avg_sq";
  // A bad label, found on the last stage, reaches every stage's rank through the status sum.
  auto tokens = test::random_ints(per_step, rng, 0, plain.dims.vocab - 1);
  auto labels = test::random_ints(per_step, rng, 0, plain.dims.vocab - 1);
  labels[3] = plain.dims.vocab + 5;
  EXPECT_NE(test::error_of([&] { eng.forward_backward(tokens.data(), labels.data()); }).find("label at micro-batch 0"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Paths, PipelineGpuOverRanks,
                         ::testing::Values(Case{"baseline", 4}, Case{"baseline", 1}, Case{"bf16_full", 4},
                                           Case{"bf16_master_wg", 3, 1, true, false, true},
                                           Case{"baseline", 4, 1, true, false, false, model::Arch::Simple, 0.05f}),
                         case_name);

TEST(PipelineGpuRefused, WhatIsNotBuiltIsNamed) {
  CUTRAIN_REQUIRE_GPU();
  const Case c{"baseline", 4};
  train::BackendOptions o = plain_options(c, 1);
  o.pipeline_stages = 2;
  o.pipeline_engine = true;
  EXPECT_NE(test::error_of([&] { train::GpuEngine e(o, config_for(c)); })
                .find("--pipeline_parallel_size 2 on the GPU engine sends activations between stage ranks over NCCL: "
                      "expected an NCCL communicator"),
            std::string::npos);
  if (comm::nccl_available()) {
    // Two stages on a world of one rank; ZeRO stage 1 inside the GPU pipeline.
    o.comm = one_rank_comm();
    EXPECT_NE(test::error_of([&] { train::GpuEngine e(o, config_for(c)); })
                  .find("--pipeline_parallel_size 2 with tensor parallel 1 does not divide the world size 1"),
              std::string::npos);
    o.pipeline_stages = 1;
    o.pipeline_over_ranks = true;
    train::TrainConfig z1 = config_for(c);
    z1.zero_optimization.stage = 1;
    EXPECT_NE(test::error_of([&] { train::GpuEngine e(o, z1); })
                  .find("zero_optimization.stage 1 with --pipeline_parallel_size 1 on the GPU engine"),
              std::string::npos);
  }
  o = plain_options(c, 1);
  o.tensor_parallel = 2;
  o.tensor_parallel_engine = true;
  EXPECT_NE(test::error_of([&] { train::GpuEngine e(o, config_for(c)); }).find("each tensor-parallel rank is a process on its own GPU"),
            std::string::npos);
  Case g = c;
  g.arch = model::Arch::Gpt2;
  o = plain_options(g, 1);
  o.stages_in_process = 2;
  EXPECT_NE(test::error_of([&] { train::GpuEngine e(o, config_for(c)); })
                .find("a pipeline stage of part of the model (layers [0, "),
            std::string::npos);
  o = plain_options(c, 1);
  o.stages_in_process = 7;  // 6 layers
  EXPECT_NE(test::error_of([&] { train::GpuEngine e(o, config_for(c)); }).find("pipeline: 7 stages for a model of 6"),
            std::string::npos);
}
