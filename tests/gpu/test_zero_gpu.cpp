// ZeRO stages 0 to 3 at world size 1 with a real (one-rank) NCCL communicator: every collective
// runs (all-reduce / reduce-scatter / fp64 norm all-reduce / all-gather; stage 3's per-unit
// gathers with prefetch, per-unit reduce-scatter and persistent-unit refresh), and the losses,
// gradient norms, eval losses, final params and optimizer state must equal the single-process
// engine's bit for bit, with the CUDA graph on, in every precision layout.
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
  const char* layout;  // baseline | bf16_master_wg | bf16_full | bf16_master_wg_comp | bf16_full_comp
  int stage;
  int accumulation = 1;
  float clip = 0.f;
  bool overlap_comm = false;  // stage 0: bucketed all-reduce; stage 3: reduce-scatter during backward
  bool stochastic_rounding = false;
  long long persistence = -1;  // stage 3: stage3_param_persistence_threshold (-1: the default, 100000)
  bool checkpointing = false;  // activation checkpointing (stage 3: the recompute reads the gathered unit)
  // GPT-2 and BERT: the tied head acquires the embedding unit with the head unit (stage 3: two
  // gathered units live at once when the head is not persistent); BERT's embedding backward
  // acquires it once more.
  model::Arch arch = model::Arch::Simple;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  std::string n = std::string(c.layout) + "_stage" + std::to_string(c.stage) + "_accum" + std::to_string(c.accumulation);
  if (c.clip > 0) n += "_clip";
  if (c.overlap_comm) n += c.stage == 3 ? "_overlap" : "_buckets";
  if (c.stochastic_rounding) n += "_sr";
  if (c.persistence >= 0) n += "_persist" + std::to_string(c.persistence);
  if (c.checkpointing) n += "_ckpt";
  if (c.arch == model::Arch::Gpt2) n += "_gpt2";
  if (c.arch == model::Arch::Bert) n += "_bert";
  return n;
}

// gtest prints the parameter into the discovered ctest names: a stable, readable form.
void PrintTo(const Case& c, std::ostream* os) { *os << case_name({c, 0}); }

using test::small_model;

train::TrainConfig config_for(const Case& c, int stage) {
  std::string bf16 = test::bf16_section(c.layout);
  if (c.stochastic_rounding) bf16 += R"(, "stochastic_rounding": true)";
  // A small reduce bucket so overlap_comm really splits the model's ~0.4M-element buffer.
  std::string zero = R"({"stage": )" + std::to_string(stage) + R"(, "overlap_comm": )" +
                     (c.overlap_comm ? "true" : "false") + R"(, "reduce_bucket_size": 50000)";
  if (c.persistence >= 0) zero += R"(, "stage3_param_persistence_threshold": )" + std::to_string(c.persistence);
  zero += "}";
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" +
                           std::to_string(c.accumulation) + R"(, "gradient_clipping": )" + std::to_string(c.clip) +
                           R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999],
                           "eps": 1e-8, "weight_decay": 0.01}}, "bf16": {)" + bf16 +
                           R"(}, "zero_optimization": )" + zero + "}";
  train::TrainConfig cfg = train::parse_config(text, std::string("test:") + c.layout);
  cfg.resolve_batch(1);
  return cfg;
}

// A one-rank NCCL communicator on device 0 (the rendezvous returns at once for world size 1).
std::shared_ptr<comm::Communicator> one_rank_comm() {
  comm::LaunchEnv env;  // rank 0 of 1
  return std::shared_ptr<comm::Communicator>(comm::Communicator::create(env, /*device=*/0));
}

// Bitwise equality of two float vectors; names the first differing element.
::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  }
  return ::testing::AssertionSuccess();
}

#define CUTRAIN_REQUIRE_NCCL()                                                            \
  do {                                                                                    \
    CUTRAIN_REQUIRE_GPU();                                                                \
    if (!comm::nccl_available()) GTEST_SKIP() << "cutrain was built without NCCL";        \
  } while (0)

train::BackendOptions options_for(const Case& c, std::uint64_t seed) {
  train::BackendOptions o = small_model(seed);
  o.activation_checkpointing = c.checkpointing;
  if (c.arch != model::Arch::Simple) {
    o.dims.arch = c.arch;
    o.dims.padded_vocab = 1024;
  }
  if (c.arch == model::Arch::Bert) {  // test_bert_gpu's model: dropout keyed by the step, a pad token
    o.dims.intermediate = 384;
    o.dims.bert.attn_dropout_ratio = 0.1f;
    o.dims.bert.hidden_dropout_ratio = 0.1f;
    o.dims.bert.initializer_range = 0.05;
    o.dims.bert.mask_id = 998;
    o.dims.bert.pad_id = 999;
  }
  return o;
}

parallel::ZeroMode expected_mode(int stage) {
  return stage == 0 ? parallel::ZeroMode::AllReduce : stage == 3 ? parallel::ZeroMode::Sharded : parallel::ZeroMode::Partitioned;
}

class ZeroWorldOne : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(ZeroWorldOne, MatchesTheSingleProcessEngineBitForBit) {
  CUTRAIN_REQUIRE_NCCL();
  const Case c = GetParam();
  auto rng = test::fresh_rng();
  const train::BackendOptions plain = options_for(c, rng());
  train::BackendOptions zero = plain;
  zero.comm = one_rank_comm();
  train::GpuEngine ref(plain, config_for(c, 0));
  train::GpuEngine eng(zero, config_for(c, c.stage));
  ASSERT_EQ(ref.zero_plan().mode, parallel::ZeroMode::None);
  ASSERT_EQ(eng.zero_plan().mode, expected_mode(c.stage));
  ASSERT_EQ(eng.zero_plan().world, 1);
  if (c.stage == 3) {
    ASSERT_NE(eng.sharded(), nullptr);
    const parallel::ShardLayout& L = eng.sharded()->layout();
    EXPECT_EQ(L.padded_elems, ref.table().flat_size()) << "world 1: nothing padded";
    if (c.persistence < 0 && c.arch != model::Arch::Simple) {
      // The default threshold (100000) keeps the small head (GPT-2: ln_f; BERT: the transform,
      // 18k elements) resident; the embedding unit (139k) and the blocks are gathered.
      EXPECT_TRUE(L.units.back().persistent);
      EXPECT_FALSE(L.units.front().persistent);
    } else if (c.persistence < 0) {
      // The default threshold (100000) keeps none of the small model's units (all > 100000 elements).
      for (const parallel::ShardUnit& u : L.units) EXPECT_FALSE(u.persistent);
    } else if (c.persistence == 0) {
      EXPECT_EQ(L.persistent_elems, 0u) << "threshold 0 gathers every unit (a tied head: two gathered units live)";
    } else {
      EXPECT_GT(L.persistent_elems, 0u) << "the case should keep some unit persistent";
    }
  }
  ASSERT_TRUE(same_bits(ref.download_params(), eng.download_params())) << "initial params";

  const std::size_t per_step = std::size_t(c.accumulation) * plain.batch * plain.seq;
  for (int step = 1; step <= 5; ++step) {
    const auto tokens = test::random_ints(per_step, rng, 0, plain.dims.vocab - 1);
    const auto labels = test::random_ints(per_step, rng, 0, plain.dims.vocab - 1);
    const train::StepStats a = ref.step(tokens.data(), labels.data(), step, 1e-3f);
    const train::StepStats b = eng.step(tokens.data(), labels.data(), step, 1e-3f);
    EXPECT_EQ(a.loss, b.loss) << case_name({c, 0}) << " step " << step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << case_name({c, 0}) << " step " << step;
    EXPECT_EQ(a.skipped, b.skipped) << "step " << step;
    EXPECT_FALSE(b.skipped) << "step " << step;
  }
  if (c.stage == 3) {
    const bool gathers = eng.sharded()->layout().gather_elems > 0;  // 0: every unit persistent
    EXPECT_EQ(eng.sharded()->gathers_issued() > 0, gathers) << "stage 3 gathers the non-persistent units before use";
  }
  {
    // The eval forward (outside the graph; stage 3 gathers it unit by unit too).
    const std::size_t n = std::size_t(plain.batch) * plain.seq;
    const auto tokens = test::random_ints(n, rng, 0, plain.dims.vocab - 1);
    const auto labels = test::random_ints(n, rng, 0, plain.dims.vocab - 1);
    EXPECT_EQ(ref.eval_loss(tokens.data(), labels.data()), eng.eval_loss(tokens.data(), labels.data())) << "eval loss";
  }
  EXPECT_TRUE(ref.graph_active());
  EXPECT_TRUE(eng.graph_active()) << "the step graph (with the NCCL collectives) should be captured and replayed";
  EXPECT_TRUE(same_bits(ref.download_params(), eng.download_params())) << "final params";
  EXPECT_TRUE(same_bits(ref.download_grads(), eng.download_grads())) << "last gradients";
  const train::HostState sa = ref.save_state(), sb = eng.save_state();  // partitioned / sharded: gathered over the ranks
  EXPECT_TRUE(same_bits(sa.params, sb.params)) << "saved params";
  EXPECT_TRUE(same_bits(sa.master, sb.master)) << "fp32 master";
  EXPECT_TRUE(same_bits(sa.exp_avg, sb.exp_avg)) << "exp_avg";
  EXPECT_TRUE(same_bits(sa.exp_avg_sq, sb.exp_avg_sq)) << "exp_avg_sq";
  EXPECT_TRUE(same_bits(sa.compensation, sb.compensation)) << "bf16 master's compensation";
  EXPECT_EQ(sb.compensation.size(), std::string(c.layout).find("_comp") != std::string::npos ? sb.params.size() : 0u);
}

TEST_P(ZeroWorldOne, StateLoadedIntoThePartitionContinuesIdentically) {
  CUTRAIN_REQUIRE_NCCL();
  const Case c = GetParam();
  if (c.stage == 0) GTEST_SKIP() << "stage 0 keeps the whole state: nothing partition-specific to load";
  auto rng = test::fresh_rng();
  const train::BackendOptions plain = options_for(c, rng());
  train::BackendOptions zero = plain;
  zero.comm = one_rank_comm();
  train::GpuEngine src(plain, config_for(c, 0));
  const std::size_t per_step = std::size_t(c.accumulation) * plain.batch * plain.seq;
  int step = 1;
  auto batch = [&] {
    return std::make_pair(test::random_ints(per_step, rng, 0, plain.dims.vocab - 1),
                          test::random_ints(per_step, rng, 0, plain.dims.vocab - 1));
  };
  for (; step <= 2; ++step) {
    const auto b = batch();
    src.step(b.first.data(), b.second.data(), step, 1e-3f);
  }
  const train::HostState s = src.save_state();
  train::GpuEngine ref(plain, config_for(c, 0)), eng(zero, config_for(c, c.stage));
  ref.load_state(s);
  eng.load_state(s);
  for (; step <= 5; ++step) {
    const auto b = batch();
    EXPECT_EQ(ref.step(b.first.data(), b.second.data(), step, 1e-3f).loss,
              eng.step(b.first.data(), b.second.data(), step, 1e-3f).loss)
        << "step " << step;
  }
  EXPECT_TRUE(same_bits(ref.download_params(), eng.download_params()));
}

INSTANTIATE_TEST_SUITE_P(
    Stages, ZeroWorldOne,
    ::testing::Values(Case{"baseline", 0}, Case{"baseline", 1}, Case{"baseline", 2},
                      Case{"bf16_master_wg", 0}, Case{"bf16_master_wg", 1}, Case{"bf16_master_wg", 2},
                      Case{"bf16_full", 0}, Case{"bf16_full", 1}, Case{"bf16_full", 2},
                      // fp32 accumulation buffer (baseline with accumulation) and clipping (the global norm).
                      Case{"baseline", 0, 2, 1.0f}, Case{"baseline", 1, 2, 1.0f}, Case{"baseline", 2, 2, 1.0f},
                      Case{"bf16_master_wg", 2, 2, 0.5f},
                      // stage 0 in reduce_bucket_size buckets; stochastic rounding over a partition.
                      Case{"bf16_master_wg", 0, 1, 1.0f, true}, Case{"bf16_full", 1, 1, 0.f, false, true},
                      Case{"bf16_full", 2, 1, 1.0f, false, true},
                      // Stage 3: every layout; accumulation (the fp32 accumulation buffer in the
                      // baseline) and clipping; stochastic rounding over the shard; persistent units
                      // (embeddings and head kept gathered, blocks gathered per use); checkpointing.
                      Case{"baseline", 3}, Case{"bf16_master_wg", 3}, Case{"bf16_full", 3},
                      Case{"baseline", 3, 2, 1.0f}, Case{"bf16_master_wg", 3, 2, 0.5f},
                      Case{"bf16_full", 3, 1, 1.0f, false, true}, Case{"baseline", 3, 2, 0.f, false, false, 150000},
                      Case{"bf16_master_wg", 3, 2, 1.0f, false, false, -1, true},
                      Case{"bf16_full", 3, 1, 0.f, false, false, 1000000000, true},
                      // Stage 3 with overlap_comm: each unit reduce-scattered during the last backward.
                      Case{"baseline", 3, 2, 1.0f, true}, Case{"bf16_full", 3, 1, 0.f, true, true},
                      Case{"bf16_master_wg", 3, 3, 0.5f, true, false, 150000, true},
                      // The compensated bf16 master: partitioned (1, 2) and sharded (3) like the moments.
                      Case{"bf16_master_wg_comp", 0}, Case{"bf16_full_comp", 1}, Case{"bf16_master_wg_comp", 2, 2, 0.5f},
                      Case{"bf16_full_comp", 3}, Case{"bf16_full_comp", 3, 1, 1.0f, true, true},
                      // Tied heads at stage 3: GPT-2 and BERT, the head resident (the default
                      // threshold) or gathered beside the embedding unit (threshold 0), overlap_comm
                      // (the embedding unit reduced after both its uses' gradients), checkpointing.
                      Case{"baseline", 3, 1, 0.f, false, false, -1, false, model::Arch::Gpt2},
                      Case{"bf16_master_wg", 3, 2, 1.0f, true, false, 0, false, model::Arch::Gpt2},
                      Case{"bf16_full", 3, 1, 0.f, false, true, 0, true, model::Arch::Gpt2},
                      Case{"baseline", 3, 2, 0.5f, false, false, 0, false, model::Arch::Gpt2},
                      Case{"baseline", 3, 1, 0.f, false, false, -1, false, model::Arch::Bert},
                      Case{"bf16_master_wg", 3, 2, 0.5f, true, false, 0, false, model::Arch::Bert},
                      Case{"bf16_full", 3, 1, 1.0f, false, false, 0, true, model::Arch::Bert},
                      Case{"baseline", 3, 2, 1.0f, false, false, 150000, true, model::Arch::Bert}),
    case_name);

TEST(ZeroWorldOneStage3, WithoutACommunicatorRunsAsTheSingleProcessEngine) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions plain = small_model(rng());
  const Case c{"baseline", 3};
  train::GpuEngine ref(plain, config_for(c, 0)), eng(plain, config_for(c, 3));
  EXPECT_EQ(eng.zero_plan().mode, parallel::ZeroMode::None) << "a single process never creates a communicator";
  EXPECT_EQ(eng.sharded(), nullptr);
  for (int step = 1; step <= 3; ++step) {
    const auto t = test::random_ints(std::size_t(plain.batch) * plain.seq, rng, 0, plain.dims.vocab - 1);
    EXPECT_EQ(ref.step(t.data(), t.data(), step, 1e-3f).loss, eng.step(t.data(), t.data(), step, 1e-3f).loss);
  }
  EXPECT_TRUE(same_bits(ref.download_params(), eng.download_params()));
}

// Stage 3's own checkpoint round trip: the state a sharded engine saves (gathered over the
// ranks), loaded into a fresh sharded engine, continues exactly like the engine that saved it.
TEST(ZeroWorldOneStage3, SaveLoadRoundTripContinuesIdentically) {
  CUTRAIN_REQUIRE_NCCL();
  auto rng = test::fresh_rng();
  train::BackendOptions o = small_model(rng());
  o.comm = one_rank_comm();
  const Case c{"baseline", 3, 2, 1.0f};
  train::GpuEngine a(o, config_for(c, 3));
  const std::size_t per_step = std::size_t(c.accumulation) * o.batch * o.seq;
  auto ints = [&] { return test::random_ints(per_step, rng, 0, o.dims.vocab - 1); };
  int step = 1;
  for (; step <= 2; ++step) {
    const auto t = ints(), l = ints();
    a.step(t.data(), l.data(), step, 1e-3f);
  }
  train::BackendOptions ob = o;
  ob.comm = one_rank_comm();  // its own communicator: the two engines' graphs never share one
  train::GpuEngine b(ob, config_for(c, 3));
  b.load_state(a.save_state());
  EXPECT_TRUE(same_bits(a.download_params(), b.download_params()));
  for (; step <= 4; ++step) {
    const auto t = ints(), l = ints();
    const train::StepStats sa = a.step(t.data(), l.data(), step, 1e-3f), sb = b.step(t.data(), l.data(), step, 1e-3f);
    EXPECT_EQ(sa.loss, sb.loss) << "step " << step;
    EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "step " << step;
  }
  const train::HostState x = a.save_state(), y = b.save_state();
  EXPECT_TRUE(same_bits(x.params, y.params));
  EXPECT_TRUE(same_bits(x.master, y.master));
  EXPECT_TRUE(same_bits(x.exp_avg, y.exp_avg));
  EXPECT_TRUE(same_bits(x.exp_avg_sq, y.exp_avg_sq));
}

// offload_states / reload_states move stage 3's shard buffers (and the full gradient buffer):
// after a round trip the sharded engine continues exactly like the plain one.
TEST(ZeroWorldOneStage3, OffloadStatesRoundTripContinuesIdentically) {
  CUTRAIN_REQUIRE_NCCL();
  auto rng = test::fresh_rng();
  const train::BackendOptions plain = small_model(rng());
  train::BackendOptions zero = plain;
  zero.comm = one_rank_comm();
  const Case c{"bf16_master_wg", 3};
  train::GpuEngine ref(plain, config_for(c, 0)), eng(zero, config_for(c, 3));
  for (int step = 1; step <= 4; ++step) {
    if (step == 3) {
      ref.offload_states();
      eng.offload_states();
      ref.reload_states();
      eng.reload_states();
    }
    const auto t = test::random_ints(std::size_t(plain.batch) * plain.seq, rng, 0, plain.dims.vocab - 1);
    EXPECT_EQ(ref.step(t.data(), t.data(), step, 1e-3f).loss, eng.step(t.data(), t.data(), step, 1e-3f).loss)
        << "step " << step;
  }
  EXPECT_TRUE(same_bits(ref.download_params(), eng.download_params()));
}
