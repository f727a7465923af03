// CPU tests of random-LTD: the config (every key, the warnings, each error by its JSON path), the
// checks against the model, the schedule (DeepSpeed's fixed_linear), the token selection
// (deterministic, sorted, the same per sequence however the batch is split), and the reference
// model's dropping blocks: equal to the composition of spans with the gather / scatter references,
// and its gradient against finite differences, for the seed model (encoder and causal) and GPT-2.
// Composed with the sequence-length curriculum: the kept count min(schedule, L), the draw at a
// step's rows x L, and a CPU run over lengths whose every step equals a backend built at that shape
// (with that shape's selection) from the same state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "model/reference_model.h"
#include "model/token_drop_plan.h"
#include "tests/reference/token_drop_ref.h"
#include "tests/support/finite_difference.h"
#include "tests/support/test_support.h"
#include "tests/support/cpu_test_util.h"
#include "train/config.h"
#include "train/cpu_backend.h"
#include "train/random_ltd_draw.h"
#include "train/random_ltd_schedule.h"
#include "train/seqlen_curriculum.h"

using namespace cutrain;

namespace {

constexpr const char* kLtd = "data_efficiency.data_routing.random_ltd";

// A config whose random_ltd block is {...`body`} with all three switches on.
std::string with_ltd(const std::string& body) {
  return R"({"train_micro_batch_size_per_gpu": 2, "data_efficiency": {"enabled": true, "seed": 11,
    "data_routing": {"enabled": true, "random_ltd": {"enabled": true, )" + body + "}}}}";
}
std::string schedule(int lo, int hi, int steps, int per, const std::string& type = "fixed_linear") {
  return R"("random_ltd_schedule": {"min_value": )" + std::to_string(lo) + R"(, "max_value": )" + std::to_string(hi) +
         R"(, "schedule_type": ")" + type + R"(", "schedule_config": {"require_steps": )" + std::to_string(steps) +
         R"(, "seq_per_step": )" + std::to_string(per) + "}}";
}
const std::string kGood = R"("total_layer_num": 4, "random_ltd_layer_num": 2, "random_ltd_layer_id": [2, 1],
    "model_mask_name": "attention_mask", "model_type": "decoder", "hidden_state_order": "seq_batch_dim",
    "layer_token_lr_schedule": {"enabled": false, "total_layer_tokens": 100, "warmup_type": "linear",
      "warmup_layer_tokens": 10}, )" + schedule(16, 64, 100, 16);

bool has_warning(const train::TrainConfig& c, const std::string& part) {
  for (const auto& w : c.warnings)
    if (w.find(part) != std::string::npos) return true;
  return false;
}

template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(e.message().find(p), std::string::npos) << "missing '" << p << "' in: " << e.message();
  }
}
void expect_config_error(const std::string& text, std::initializer_list<std::string> parts) {
  expect_error([&] { train::parse_config(text, "ltd.json"); }, parts);
}

}  // namespace

TEST(RandomLtdConfig, EveryKeyReadIntoItsField) {
  const train::TrainConfig c = train::parse_config(with_ltd(kGood), "ltd.json");
  const auto& d = c.data_efficiency;
  EXPECT_TRUE(d.random_ltd_active());
  const auto& r = d.random_ltd;
  EXPECT_EQ(r.total_layer_num, 4);
  EXPECT_EQ(r.layer_num, 2);
  EXPECT_EQ(r.layer_ids, (std::vector<int>{2, 1}));
  EXPECT_EQ(r.model_mask_name, "attention_mask");
  EXPECT_EQ(r.model_type, train::RandomLtdModelType::Decoder);
  EXPECT_EQ(r.hidden_state_order, train::HiddenStateOrder::SeqBatchDim);
  EXPECT_EQ(r.min_value, 16);
  EXPECT_EQ(r.max_value, 64);
  EXPECT_EQ(r.require_steps, 100);
  EXPECT_EQ(r.seq_per_step, 16);
  EXPECT_FALSE(r.layer_token_lr_enabled);
  // Read but not acted on: the mask's name, the framework's layout, the layer-token lr schedule's values.
  for (const char* k : {".model_mask_name", ".hidden_state_order", ".layer_token_lr_schedule.total_layer_tokens",
                        ".layer_token_lr_schedule.warmup_type", ".layer_token_lr_schedule.warmup_layer_tokens"})
    EXPECT_TRUE(has_warning(c, std::string(kLtd) + k + " is read but not acted on")) << k;
  EXPECT_EQ(c.warnings.size(), 5u);
  // batch_seq_dim is cutrain's own layout: no warning.
  std::string good = kGood;
  good.replace(good.find("seq_batch_dim"), 13, "batch_seq_dim");
  EXPECT_FALSE(has_warning(train::parse_config(with_ltd(good), "ltd.json"), "hidden_state_order"));
}

TEST(RandomLtdConfig, OneSwitchOffLeavesItInactive) {
  std::string t = with_ltd(kGood);
  t.replace(t.find(R"("data_routing": {"enabled": true)"), 32, R"("data_routing": {"enabled": false)");
  EXPECT_FALSE(train::parse_config(t, "ltd.json").data_efficiency.random_ltd_active());
  const train::TrainConfig off = train::parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "data_efficiency": {"enabled": true, "data_routing":
         {"enabled": true, "random_ltd": {"enabled": false}}}})", "ltd.json");
  EXPECT_FALSE(off.data_efficiency.random_ltd_active());
  EXPECT_TRUE(off.warnings.empty());
}

TEST(RandomLtdConfig, BadInputNamedByJsonPath) {
  const std::string ids = R"("total_layer_num": 4, "random_ltd_layer_num": 2, "random_ltd_layer_id": [0, 1], )";
  expect_config_error(with_ltd(R"("total_layer_num": 4, "random_ltd_layer_num": 3, "random_ltd_layer_id": [0, 1], )" +
                               schedule(16, 64, 10, 16)),
                      {"ltd.json", std::string(kLtd) + ".random_ltd_layer_num", "length of random_ltd_layer_id (2)",
                       "found 3"});
  expect_config_error(with_ltd(R"("total_layer_num": 4, "random_ltd_layer_num": 2, "random_ltd_layer_id": [1, 4], )" +
                               schedule(16, 64, 10, 16)),
                      {std::string(kLtd) + ".random_ltd_layer_id[1]", "[0, total_layer_num 4)", "found 4"});
  expect_config_error(with_ltd(R"("total_layer_num": 4, "random_ltd_layer_num": 2, "random_ltd_layer_id": [1, 1], )" +
                               schedule(16, 64, 10, 16)),
                      {std::string(kLtd) + ".random_ltd_layer_id[1]", "distinct"});
  expect_config_error(with_ltd(ids + schedule(16, 64, 10, 16, "fixed_root")),
                      {std::string(kLtd) + ".random_ltd_schedule.schedule_type", "fixed_linear", "fixed_root"});
  expect_config_error(with_ltd(ids + schedule(64, 16, 10, 16)),
                      {std::string(kLtd) + ".random_ltd_schedule.max_value", "min_value 64", "found 16"});
  expect_config_error(with_ltd(ids + R"("model_type": "seq2seq", )" + schedule(16, 64, 10, 16)),
                      {std::string(kLtd) + ".model_type", "decoder", "seq2seq"});
  expect_config_error(with_ltd(ids + R"("layer_token_lr_schedule": {"enabled": true}, )" + schedule(16, 64, 10, 16)),
                      {std::string(kLtd) + ".layer_token_lr_schedule.enabled", "not implemented"});
  expect_config_error(with_ltd(ids.substr(0, ids.size() - 2)), {std::string(kLtd) + ".random_ltd_schedule", "found nothing"});
  expect_config_error(with_ltd(ids + R"("random_ltd_schedule": {"min_value": 16, "max_value": 64, "schedule_type":
                               "fixed_linear", "schedule_config": {"require_steps": 10, "seq_per_step": 16,
                               "root_degree": 2}})"),
                      {std::string(kLtd) + ".random_ltd_schedule.schedule_config", "root_degree"});
}

TEST(RandomLtdConfig, CheckedAgainstTheModelAndTheRun) {
  const train::TrainConfig c = train::parse_config(with_ltd(kGood), "ltd.json");
  train::RandomLtdRun run{4, 64, true, {}, 1};
  train::check_random_ltd(c, run);  // fits
  auto fails = [&](train::RandomLtdRun r, std::initializer_list<std::string> parts) {
    expect_error([&] { train::check_random_ltd(c, r); }, parts);
  };
  fails({4, 48, true, {}, 1}, {"ltd.json", std::string(kLtd) + ".random_ltd_schedule.max_value",
                               "at most the sequence length 48", "found 64"});
  fails({6, 64, true, {}, 1}, {std::string(kLtd) + ".total_layer_num", "block count 6", "found 4"});
  fails({4, 64, false, {}, 1}, {std::string(kLtd) + ".model_type", "expected \"encoder\"", "not causal"});
  fails({4, 64, true, {2}, 1}, {std::string(kLtd) + ".random_ltd_layer_id[0]", "MoE block 2"});
  fails({4, 64, true, {}, 2}, {std::string(kLtd) + ".enabled", "pipeline"});
  fails({4, 64, true, {}, 1, 2}, {std::string(kLtd) + ".enabled", "tensor parallelism (degree 2)"});
  std::string enc = kGood;
  enc.replace(enc.find("\"decoder\""), 9, "\"encoder\"");
  expect_error([&] { train::check_random_ltd(train::parse_config(with_ltd(enc), "ltd.json"), run); },
               {std::string(kLtd) + ".model_type", "expected \"decoder\""});
  std::string low = kGood;
  low.replace(low.find("\"min_value\": 16"), 15, "\"min_value\": 8");
  expect_error([&] { train::check_random_ltd(train::parse_config(with_ltd(low), "ltd.json"), run); },
               {std::string(kLtd) + ".random_ltd_schedule.min_value", "seq_per_step 16", "found 8"});
}

TEST(RandomLtdConfig, ShippedConfigsLoad) {
  train::ConfigLoadOptions strict;
  strict.strict = true;
  const auto dir = std::filesystem::path(CUTRAIN_SOURCE_DIR) / "configs";
  const train::TrainConfig a = train::load_config(dir / "random_ltd.json", strict);
  EXPECT_TRUE(a.data_efficiency.random_ltd_active());
  EXPECT_EQ(a.data_efficiency.random_ltd.model_type, train::RandomLtdModelType::Encoder);
  ASSERT_EQ(a.warnings.size(), 1u) << a.warnings.at(0);
  EXPECT_TRUE(has_warning(a, std::string(kLtd) + ".model_mask_name is read but not acted on"));
  train::check_random_ltd(a, {12, 512, false, {}, 1});  // the BF16 example's model, bidirectional
  const train::TrainConfig b = train::load_config(dir / "curriculum_random_ltd.json", strict);
  EXPECT_TRUE(b.data_efficiency.random_ltd_active());
  EXPECT_TRUE(b.data_efficiency.curriculum_active());
  EXPECT_EQ(b.warnings.size(), 3u);
  train::check_random_ltd(b, {12, 512, true, {}, 1});  // --use_real_data: causal
  // GPT-2's sequence-length warm-up composed with random-LTD.
  const train::TrainConfig g = train::load_config(dir / "data_efficiency_composed_gpt.json", strict);
  EXPECT_TRUE(g.data_efficiency.random_ltd_active());
  EXPECT_TRUE(g.data_efficiency.curriculum_active());
  train::check_random_ltd(g, {12, 1024, true, {}, 1});
  const auto cl = train::make_seqlen_curriculum(g, "data_efficiency_composed_gpt.json", 8, 1024);
  ASSERT_TRUE(cl.has_value());
  EXPECT_EQ(cl->seqlen(0), 64);
  EXPECT_EQ(train::random_ltd_kept_at(g.data_efficiency.random_ltd, 0, cl->seqlen(0)), 64) << "128 of 64: no drop";
  EXPECT_EQ(train::random_ltd_kept_at(g.data_efficiency.random_ltd, 1000, cl->seqlen(1000)), 368);
}

TEST(RandomLtdSchedule, FixedLinearAsDeepSpeed) {
  train::RandomLtdConfig c;
  c.min_value = 16, c.max_value = 128, c.require_steps = 100, c.seq_per_step = 16;
  // floor(step/100 * 112 + 16), down to a multiple of 16, at most 128.
  EXPECT_EQ(train::random_ltd_kept(c, 0), 16);
  EXPECT_EQ(train::random_ltd_kept(c, 14), 16);   // 31.68 -> 31 -> 16
  EXPECT_EQ(train::random_ltd_kept(c, 15), 32);   // 32.8 -> 32
  EXPECT_EQ(train::random_ltd_kept(c, 50), 64);   // 72 -> 64
  EXPECT_EQ(train::random_ltd_kept(c, 99), 112);  // 126.88 -> 112
  EXPECT_EQ(train::random_ltd_kept(c, 100), 128);
  EXPECT_EQ(train::random_ltd_kept(c, 1000000000000), 128);
  // A max_value that is no multiple is reached past require_steps; a min_value that is none
  // starts below it (DeepSpeed's order: round, then clamp).
  c.min_value = 10, c.max_value = 50, c.require_steps = 10, c.seq_per_step = 8;
  EXPECT_EQ(train::random_ltd_kept(c, 0), 8);
  EXPECT_EQ(train::random_ltd_kept(c, 10), 48);
  EXPECT_EQ(train::random_ltd_kept(c, 12), 50);
  // Never decreasing, against the plain formula, over a random schedule.
  auto rng = test::fresh_rng();
  c.min_value = 1 + std::int64_t(rng() % 200);
  c.max_value = c.min_value + std::int64_t(rng() % 2000);
  c.require_steps = 1 + std::int64_t(rng() % 5000);
  c.seq_per_step = 1 + std::int64_t(rng() % 32);
  std::int64_t prev = 0;
  for (std::int64_t s = 0; s < 2 * c.require_steps + 100; ++s) {
    const std::int64_t k = train::random_ltd_kept(c, s);
    std::int64_t v = (s * (c.max_value - c.min_value)) / c.require_steps + c.min_value;
    v = std::min(v - v % c.seq_per_step, c.max_value);
    ASSERT_EQ(k, v) << "step " << s;
    ASSERT_GE(k, prev) << "step " << s;
    prev = k;
  }
}

TEST(RandomLtdSchedule, LayerTokens) {
  train::RandomLtdConfig c;
  c.min_value = 16, c.max_value = 64, c.require_steps = 4, c.seq_per_step = 16;
  c.layer_ids = {1, 2};
  // 8 sequences of 64, 4 blocks: 2 of them at kept(step), 2 at 64.
  EXPECT_EQ(train::random_ltd_layer_tokens(c, 0, 8, 4, 64), 8 * (2 * 16 + 2 * 64));
  EXPECT_EQ(train::random_ltd_layer_tokens(c, 2, 8, 4, 64), 8 * (2 * (40 / 16 * 16) + 2 * 64));
  EXPECT_EQ(train::random_ltd_layer_tokens(c, 9, 8, 4, 64), 8 * 4 * 64);
}

TEST(TokenDropPlan, SortedDistinctDeterministicAndSplitInvariant) {
  model::TokenDropPlan a, b, c;
  const int B = 4, S = 37, K = 11;
  model::draw_token_drop(a, 5, 3, 1, 0, B, S, K, {3, 0, 3});
  EXPECT_TRUE(a.active());
  EXPECT_EQ(a.layers, (std::vector<int>{0, 3}));
  EXPECT_EQ(a.slot(3), 1);
  EXPECT_EQ(a.slot(1), -1);
  ASSERT_EQ(a.indices.size(), std::size_t(2 * B * K));
  for (int s = 0; s < 2; ++s)
    for (int q = 0; q < B; ++q) {
      const std::int32_t* p = a.slot_indices(s) + q * K;
      for (int j = 0; j < K; ++j) {
        EXPECT_GE(p[j], 0);
        EXPECT_LT(p[j], S);
        if (j) EXPECT_LT(p[j - 1], p[j]) << "ascending and distinct";
      }
    }
  model::draw_token_drop(b, 5, 3, 1, 0, B, S, K, {0, 3});
  EXPECT_EQ(a.indices, b.indices) << "a pure function of its arguments";
  for (auto other : {std::make_tuple(6ull, 3, 1), std::make_tuple(5ull, 4, 1), std::make_tuple(5ull, 3, 2)}) {
    model::draw_token_drop(c, std::get<0>(other), std::get<1>(other), std::get<2>(other), 0, B, S, K, {0, 3});
    EXPECT_NE(a.indices, c.indices);
  }
  // Rank 1 of 2 (sequences 2, 3 of the global micro-batch) draws what the single process drew for them.
  model::draw_token_drop(c, 5, 3, 1, 2, 2, S, K, {0, 3});
  for (int s = 0; s < 2; ++s)
    EXPECT_TRUE(std::equal(c.slot_indices(s), c.slot_indices(s) + 2 * K, a.slot_indices(s) + 2 * K));
  // Blocks differ from each other, and the layer-token count.
  EXPECT_FALSE(std::equal(a.slot_indices(0), a.slot_indices(0) + B * K, a.slot_indices(1)));
  EXPECT_EQ(a.layer_tokens(5), std::int64_t(B) * (2 * K + 3 * S));
  // Every position is drawn about equally often (uniform subsets).
  std::vector<int> hits(S, 0);
  for (int step = 0; step < 400; ++step) {
    model::draw_token_drop(c, 1, step, 0, 0, 1, S, K, {0});
    for (int j = 0; j < K; ++j) ++hits[std::size_t(c.indices[std::size_t(j)])];
  }
  const double expect = 400.0 * K / S;
  for (int h : hits) EXPECT_NEAR(h, expect, 6 * std::sqrt(expect));
  // K >= S: nothing dropped.
  model::draw_token_drop(c, 1, 0, 0, 0, B, S, S, {0});
  EXPECT_FALSE(c.active());
  EXPECT_EQ(c.slot(0), -1);
  EXPECT_EQ(c.layer_tokens(2), std::int64_t(B) * 2 * S);
}

TEST(TokenDropPlan, TheDrawFollowsTheScheduleAndTheRank) {
  const train::TrainConfig c = train::parse_config(with_ltd(kGood), "ltd.json");
  train::RandomLtdDraw d0(c, 2, 64, 4, 0), d1(c, 2, 64, 4, 1);
  EXPECT_EQ(d0.kept(1), 16);
  EXPECT_EQ(d0.kept(101), 64);
  const model::TokenDropPlan p = d0.draw(51, 1);
  EXPECT_EQ(p.kept, 32);  // kept(step 50) = floor(50/100*48 + 16) = 40 -> 32
  EXPECT_EQ(p.layers, (std::vector<int>{1, 2}));
  model::TokenDropPlan want;
  model::draw_token_drop(want, 11, 50, 1, 2, 2, 64, p.kept, {1, 2});
  EXPECT_EQ(d1.draw(51, 1).indices, want.indices) << "rank 1's sequences are 2, 3; seeded by data_efficiency.seed";
  EXPECT_FALSE(d0.draw(101, 0).active()) << "max_value = S: no drop";
}

// The selection is the set of a partial Fisher-Yates shuffle, in ascending order: the draw's scan
// of flags gives what sorting the shuffled prefix gives (a literal transcription of the shuffle).
TEST(TokenDropPlan, TheSetOfAPartialFisherYatesShuffleAscending) {
  auto mix = [](std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  };
  for (auto [B, S, K] : {std::tuple{3, 37, 11}, std::tuple{2, 64, 63}, std::tuple{1, 1000, 3}, std::tuple{2, 9, 1}}) {
    model::TokenDropPlan plan;
    const std::vector<int> layers = {1, 4};
    model::draw_token_drop(plan, 77, 12, 3, 5, B, S, K, layers);
    for (std::size_t k = 0; k < layers.size(); ++k)
      for (int b = 0; b < B; ++b) {
        std::uint64_t h = mix(77);
        for (std::uint64_t v : {std::uint64_t(12), std::uint64_t(3), std::uint64_t(layers[k]), std::uint64_t(5 + b)})
          h = mix(h ^ v);
        std::mt19937_64 rng(h);
        std::vector<std::int32_t> pos(static_cast<std::size_t>(S));
        std::iota(pos.begin(), pos.end(), 0);
        for (int i = 0; i < K; ++i) std::swap(pos[std::size_t(i)], pos[std::size_t(i + int(rng() % std::uint64_t(S - i)))]);
        std::sort(pos.begin(), pos.begin() + K);
        const std::int32_t* got = plan.slot_indices(int(k)) + std::size_t(b) * K;
        EXPECT_TRUE(std::equal(pos.begin(), pos.begin() + K, got)) << "B" << B << " S" << S << " K" << K << " seq " << b;
      }
  }
}

// DeepSpeed's rule at a curriculum's length L: the schedule's value when below L, else L (no drop).
TEST(RandomLtdSchedule, KeptCountAtTheStepsLength) {
  train::RandomLtdConfig c;
  c.min_value = 16, c.max_value = 64, c.require_steps = 4, c.seq_per_step = 16;
  c.layer_ids = {1, 2};
  EXPECT_EQ(train::random_ltd_kept_at(c, 0, 64), 16);
  EXPECT_EQ(train::random_ltd_kept_at(c, 0, 24), 16);
  EXPECT_EQ(train::random_ltd_kept_at(c, 2, 24), 24) << "schedule 32 reaches L 24: the whole sequence";
  EXPECT_EQ(train::random_ltd_kept_at(c, 9, 40), 40);
  // Layer tokens at the real length: 8 sequences of 24, 2 of 4 blocks at min(kept, 24).
  EXPECT_EQ(train::random_ltd_layer_tokens(c, 0, 8, 4, 24), 8 * (2 * 16 + 2 * 24));
  EXPECT_EQ(train::random_ltd_layer_tokens(c, 2, 8, 4, 24), 8 * 4 * 24);
}

// The draw at a step's rows x L: that shape's sequences (rank r's are r*rows ..), K = min(kept, L),
// inactive once the schedule reaches L; a pure function of (step, micro-batch, shape), so a resumed
// run draws the same.
TEST(TokenDropPlan, TheDrawAtACurriculumShape) {
  const train::TrainConfig c = train::parse_config(with_ltd(kGood), "ltd.json");
  train::RandomLtdDraw d0(c, 2, 64, 4, 0), d1(c, 2, 64, 4, 1);
  EXPECT_EQ(d0.kept(51, 24), 24);
  EXPECT_EQ(d0.kept(51, 40), 32);
  const model::TokenDropPlan p = d1.draw(51, 1, 5, 40);  // 5 rows of 40 (a reshape's rows)
  EXPECT_EQ(p.batch, 5);
  EXPECT_EQ(p.seq, 40);
  EXPECT_EQ(p.kept, 32);
  model::TokenDropPlan want;
  model::draw_token_drop(want, 11, 50, 1, 5, 5, 40, 32, {1, 2});
  EXPECT_EQ(p.indices, want.indices) << "rank 1's rows are 5 .. 9 of the global micro-batch";
  const model::TokenDropPlan off = d0.draw(51, 0, 3, 24);
  EXPECT_FALSE(off.active()) << "schedule 32 >= L 24: no drop";
  EXPECT_EQ(off.layer_tokens(4), 3 * 4 * 24);
  // Resume: a fresh draw of step 51 after other steps and shapes is the same.
  train::RandomLtdDraw again(c, 2, 64, 4, 1);
  again.draw(7, 0, 2, 64);
  again.draw(50, 1, 5, 40);
  EXPECT_EQ(again.draw(51, 1, 5, 40).indices, p.indices);
  EXPECT_NE(test::message_of([&] { d0.draw(1, 0, 2, 65); }).find("outside the run's sequence length 64"),
            std::string::npos);
}

TEST(TokenDropRef, GatherThenScatterRestoresAndLeavesTheRest) {
  auto rng = test::fresh_rng();
  const int B = 3, S = 13, K = 5, h = 7;
  const std::vector<float> xf = test::random_normal(std::size_t(B) * S * h, rng);
  const std::vector<double> x(xf.begin(), xf.end());
  model::TokenDropPlan p;
  model::draw_token_drop(p, rng(), 0, 0, 0, B, S, K, {0});
  const std::vector<double> kept = ref::token_gather(x, p.indices, B, S, K, h);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < K; ++j)
      for (int c = 0; c < h; ++c)
        EXPECT_EQ(kept[(std::size_t(b) * K + j) * h + c], x[(std::size_t(b) * S + p.indices[std::size_t(b * K + j)]) * h + c]);
  std::vector<double> out(x.size(), -7.0), add(kept.size(), 0.5);
  ref::token_scatter(kept, &add, p.indices, out, B, S, K, h);
  std::set<std::pair<int, int>> kept_rows;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < K; ++j) kept_rows.insert({b, p.indices[std::size_t(b * K + j)]});
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S; ++s)
      for (int c = 0; c < h; ++c) {
        const double o = out[(std::size_t(b) * S + s) * h + c];
        if (kept_rows.count({b, s})) EXPECT_EQ(o, x[(std::size_t(b) * S + s) * h + c] + 0.5);
        else EXPECT_EQ(o, -7.0) << "a dropped row is not touched";
      }
}

namespace {

struct ArchCase {
  const char* name;
  model::Arch arch;
  bool causal;
};

model::ModelDims dims_for(const ArchCase& a, int layers) {
  model::ModelDims d{16, layers, 2, 23, 12};
  d.arch = a.arch;
  return d;
}

class ReferenceLtd : public ::testing::TestWithParam<ArchCase> {};

}  // namespace

// The dropping model equals the spans composed by hand: blocks [0, 1), then block 1 alone on the
// gathered kept tokens (B x K) scattered back, then blocks [2, 3) and the head; gradients too.
TEST_P(ReferenceLtd, EqualsTheComposedSpans) {
  const ArchCase ac = GetParam();
  auto rng = test::fresh_rng();
  const model::ModelDims d = dims_for(ac, 3);
  const model::TransformerParams table(d);
  std::vector<float> pf(table.flat_size());
  table.init(pf.data(), rng());
  std::vector<double> P(pf.begin(), pf.end());
  const int B = 2, S = 11, K = 6, h = d.hidden;
  const auto tok = test::random_ints(std::size_t(B) * S, rng, 0, d.vocab - 1);
  const auto lab = test::random_ints(std::size_t(B) * S, rng, 0, d.vocab - 1);
  model::TokenDropPlan plan;
  model::draw_token_drop(plan, rng(), 2, 0, 0, B, S, K, {1});

  model::ReferenceModel<double> whole(table, ac.causal);
  whole.set_token_drop(&plan);
  const double loss = whole.forward(P.data(), tok.data(), lab.data(), B, S);
  std::vector<double> g(table.flat_size(), 0.0);
  whole.backward(P.data(), g.data());

  model::ReferenceModel<double> a(table, ac.causal), mid(table, ac.causal), c(table, ac.causal);
  std::vector<double> x1, yk, x3, dx2;
  a.forward_span(P.data(), {true, 0, 1, false}, tok.data(), nullptr, nullptr, B, S, &x1);
  const std::vector<double> xk = ref::token_gather(x1, plan.indices, B, S, K, h);
  mid.forward_span(P.data(), {false, 1, 2, false}, nullptr, nullptr, xk.data(), B, K, &yk);
  std::vector<double> x2 = x1;
  ref::token_scatter(yk, nullptr, plan.indices, x2, B, S, K, h);
  const double want = c.forward_span(P.data(), {false, 2, 3, true}, nullptr, lab.data(), x2.data(), B, S, nullptr);
  EXPECT_NEAR(loss, want, 1e-12 * std::abs(want));
  std::vector<double> gw(table.flat_size(), 0.0), dxk, dx1;
  c.backward_span(P.data(), gw.data(), nullptr, 1.0, &dx2);
  const std::vector<double> dyk = ref::token_gather(dx2, plan.indices, B, S, K, h);
  mid.backward_span(P.data(), gw.data(), dyk.data(), 1.0, &dxk);
  dx1 = dx2;  // the dropped tokens' gradient passes the block unchanged
  ref::token_scatter(dxk, nullptr, plan.indices, dx1, B, S, K, h);
  a.backward_span(P.data(), gw.data(), dx1.data(), 1.0, nullptr);
  std::vector<float> gf(g.begin(), g.end());
  EXPECT_LE(test::rel_error(gf, gw), 1e-6) << ac.name;
  for (const auto& t : table.tensors()) {
    std::vector<float> o(g.begin() + t.offset, g.begin() + t.offset + t.count);
    std::vector<double> w(gw.begin() + t.offset, gw.begin() + t.offset + t.count);
    EXPECT_LE(test::rel_error(o, w), 1e-6) << ac.name << ": " << t.name;
  }
  // Dropping changes the loss (the plan is on), and an inactive plan is the plain model.
  model::ReferenceModel<double> plain(table, ac.causal);
  EXPECT_NE(plain.forward(P.data(), tok.data(), lab.data(), B, S), loss);
}

TEST_P(ReferenceLtd, GradientMatchesFiniteDifferences) {
  const ArchCase ac = GetParam();
  auto rng = test::fresh_rng();
  const model::ModelDims d = dims_for(ac, 2);
  const model::TransformerParams table(d);
  std::vector<float> pf(table.flat_size());
  table.init(pf.data(), rng());
  std::vector<double> P(pf.begin(), pf.end());
  const int B = 2, S = 7, K = 4;
  const auto tok = test::random_ints(std::size_t(B) * S, rng, 0, d.vocab - 1);
  const auto lab = test::random_ints(std::size_t(B) * S, rng, 0, d.vocab - 1);
  model::TokenDropPlan plan;
  model::draw_token_drop(plan, rng(), 0, 0, 0, B, S, K, {0, 1});  // every block drops
  model::ReferenceModel<double> m(table, ac.causal);
  m.set_token_drop(&plan);
  test::check_gradients(m, table, P, tok, lab, B, S, [&](const model::ParamTensor& t, const std::vector<float>& fd,
                                                         const std::vector<double>& an) {
    EXPECT_LE(test::rel_error(fd, an), 1e-5) << ac.name << ": " << t.name;
  });
}

INSTANTIATE_TEST_SUITE_P(Archs, ReferenceLtd,
                         ::testing::Values(ArchCase{"encoder", model::Arch::Simple, false},
                                           ArchCase{"causal", model::Arch::Simple, true},
                                           ArchCase{"gpt2", model::Arch::Gpt2, true}),
                         [](const auto& i) { return std::string(i.param.name); });

// random-LTD composed with the sequence-length curriculum on the CPU backend: a run over lengths
// (each step set to its rows x L) whose every step equals a backend built at that shape, given
// the run's state before the step: its own draw (the shape's sequences, min(kept, L)) is the
// run's, so the loss, norm, params and layer tokens are equal. A step that drops differs from a
// backend without random-LTD.
TEST(RandomLtdComposed, CpuRunOverLengthsEqualsBackendsBuiltAtEachShape) {
  for (auto metric : {train::CurriculumMetric::SeqlenTruncate, train::CurriculumMetric::SeqlenReshape})
    for (bool gpt2 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << name(metric) << (gpt2 ? " gpt2" : " simple causal"));
      const int B = 2, S = 16, accum = 2, layers = 2;
      const std::string opt = R"("train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}})";
      // kept 4, 4, 8, 8, then 12 from the 1-based step 5 on.
      train::TrainConfig cfg = train::parse_config("{" + opt + R"(, "data_efficiency": {"enabled": true, "seed": 3,
        "data_routing": {"enabled": true, "random_ltd": {"enabled": true, "total_layer_num": 2, "random_ltd_layer_num": 2,
        "random_ltd_layer_id": [0, 1], "model_type": "decoder", "random_ltd_schedule": {"min_value": 4, "max_value": 12,
        "schedule_type": "fixed_linear", "schedule_config": {"require_steps": 4, "seq_per_step": 4}}}}}})", "ltd.json");
      cfg.resolve_batch(1);
      train::TrainConfig plain_cfg = train::parse_config("{" + opt + "}", "plain.json");
      plain_cfg.resolve_batch(1);
      train::BackendOptions bo;
      bo.dims = model::ModelDims{32, layers, 2, 61, S};
      bo.dims.arch = gpt2 ? model::Arch::Gpt2 : model::Arch::Simple;
      bo.causal = true;
      bo.batch = B;
      bo.seq = S;
      bo.seed = 9;
      train::PacingConfig pc;
      pc.min_difficulty = 3;
      pc.max_difficulty = S;
      pc.total_curriculum_step = 10;
      const train::SeqlenCurriculum cl(metric, pc, B, S, "test");
      bo.max_tokens = cl.max_tokens();
      auto run = train::make_cpu_backend(bo, cfg);
      train::RandomLtdDraw draw(cfg, B, S, layers, 0);
      std::mt19937 rng(4);
      std::vector<std::int32_t> t(std::size_t(accum) * B * S), l(t.size()), ct, cll;
      // kept per step: 4 of 6, 4 of 8, 8 of 12, 8 of 10, 12 of 16, none at 12 (12 reaches L), none at 8.
      const std::vector<int> lengths = {6, 8, 12, 10, 16, 12, 8}, want_kept = {4, 4, 8, 8, 12, 0, 0};
      for (std::size_t i = 0; i < lengths.size(); ++i) {
        const int L = lengths[i], step = int(i) + 1;
        for (auto& x : t) x = std::int32_t(rng() % 61);
        for (auto& x : l) x = std::int32_t(rng() % 61);
        const train::SeqShape sh = cl.shape(L);
        cl.apply(L, accum, t.data(), l.data(), ct, cll);
        train::BackendOptions fo = bo;
        fo.batch = sh.rows;
        fo.seq = sh.seq;
        fo.max_tokens = 0;
        auto fixed = train::make_cpu_backend(fo, cfg);
        auto plain = train::make_cpu_backend(fo, plain_cfg);
        fixed->load_state(run->save_state());
        plain->load_state(run->save_state());
        run->set_seq_shape(sh.rows, sh.seq);
        const train::StepStats a = run->step(ct.data(), cll.data(), step, 1e-2f);
        const train::StepStats b = fixed->step(ct.data(), cll.data(), step, 1e-2f);
        const train::StepStats c = plain->step(ct.data(), cll.data(), step, 1e-2f);
        SCOPED_TRACE(::testing::Message() << "step " << step << " L=" << L << " rows=" << sh.rows);
        const model::TokenDropPlan& plan = draw.draw(step, 0, sh.rows, sh.seq);
        EXPECT_EQ(plan.active() ? plan.kept : 0, want_kept[i]);
        EXPECT_TRUE(std::isfinite(a.loss));
        EXPECT_EQ(a.loss, b.loss);
        EXPECT_EQ(a.grad_norm, b.grad_norm);
        EXPECT_EQ(run->save_state().params, fixed->save_state().params);
        const int kept = want_kept[i] ? want_kept[i] : L;
        EXPECT_EQ(a.layer_tokens, std::int64_t(accum) * sh.rows * layers * kept) << "layer tokens at the real length";
        EXPECT_EQ(a.layer_tokens, b.layer_tokens);
        if (want_kept[i]) EXPECT_NE(a.loss, c.loss) << "the drop is in effect";
        else EXPECT_EQ(a.loss, c.loss) << "no drop where the schedule reaches L";
      }
    }
}
