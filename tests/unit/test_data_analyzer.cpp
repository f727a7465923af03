// CPU tests of the offline data analyzer and its index (data/data_analyzer.h, data/sample_index.h):
// hand-computed rarity values, the sampler's windows, thread-count independence, percentiles,
// the index file's round trip and checks, and the fingerprint that rejects another dataset.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "data/data_analyzer.h"
#include "data/token_shard.h"
#include "runtime/error.h"
#include "tests/support/cpu_test_util.h"

using namespace cutrain;

namespace {

std::string shard(const std::filesystem::path& dir, const std::string& name, const std::vector<int32_t>& tokens) {
  const std::string p = (dir / name).string();
  data::write_shard(p, tokens);
  return p;
}

}  // namespace

TEST(DataAnalyzer, RarityByHand) {
  const auto dir = test::fresh_temp_dir("analyzer", "hand");
  // 8 tokens: 0 x4, 1 x2, 2 x1, 3 x1. seq 2, next-token windows of 3 starting every 2: [0,0,0],
  // [0,0,1], [1,1,2] -> 3 windows (the last token 3 only counts).
  const std::string f = shard(dir, "a.bin", {0, 0, 0, 0, 1, 1, 2, 3});
  data::AnalyzeOptions o;
  o.patterns = {f};
  o.seq_len = 2;
  o.vocab_size = 4;
  o.threads = 2;
  const data::SampleIndex idx = data::analyze_shards(o);
  const double l0 = -std::log(4.0 / 8), l1 = -std::log(2.0 / 8);
  ASSERT_EQ(idx.values.size(), 3u);
  EXPECT_DOUBLE_EQ(idx.values[0], (l0 + l0) / 2);  // inputs [0, 0]
  EXPECT_DOUBLE_EQ(idx.values[1], (l0 + l0) / 2);  // [0, 0]
  EXPECT_DOUBLE_EQ(idx.values[2], (l1 + l1) / 2);  // [1, 1]
  EXPECT_EQ(idx.sorted, (std::vector<uint32_t>{0, 1, 2}));  // ties by sample id
  EXPECT_EQ(idx.window_len, 3);
  // Identity labels: windows of 2, so 4 of them.
  o.labels = data::Labels::kIdentity;
  EXPECT_EQ(data::analyze_shards(o).values.size(), 4u);
  o.metric = "seqlen";
  for (double v : data::analyze_shards(o).values) EXPECT_EQ(v, 2.0);
}

TEST(DataAnalyzer, ThreadCountDoesNotChangeTheIndex) {
  const auto dir = test::fresh_temp_dir("analyzer", "threads");
  std::mt19937 rng(5);
  std::vector<std::string> files;
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> t(1000 + 337 * s);
    for (auto& x : t) x = static_cast<int32_t>(std::min<uint32_t>(rng() % 97, rng() % 97));  // skewed counts
    files.push_back(shard(dir, "s" + std::to_string(s) + ".bin", t));
  }
  data::AnalyzeOptions o;
  o.patterns = {(dir / "s*.bin").string()};
  o.seq_len = 13;
  o.vocab_size = 97;
  o.threads = 1;
  const data::SampleIndex one = data::analyze_shards(o);
  o.threads = 7;
  const data::SampleIndex seven = data::analyze_shards(o);
  EXPECT_EQ(one.values, seven.values);
  EXPECT_EQ(one.sorted, seven.sorted);
  // Each shard's windows, as the batch sampler counts them.
  std::int64_t windows = 0;
  for (int s = 0; s < 3; ++s) windows += data::windows_in_shard(1000 + 337 * s, 13, 14);
  EXPECT_EQ(static_cast<std::int64_t>(one.values.size()), windows);
  for (std::size_t i = 1; i < one.sorted.size(); ++i) EXPECT_LE(one.values[one.sorted[i - 1]], one.values[one.sorted[i]]);
  EXPECT_EQ(one.percentiles.front(), one.values[one.sorted.front()]);
  EXPECT_EQ(one.percentiles.back(), one.values[one.sorted.back()]);
}

TEST(SampleIndex, PercentilesByNearestRank) {
  data::SampleIndex idx;
  idx.values = {40, 10, 30, 20};  // sorted: 10 20 30 40
  data::sort_and_rank(idx);
  EXPECT_EQ(idx.sorted, (std::vector<uint32_t>{1, 3, 2, 0}));
  EXPECT_EQ(idx.percentiles[0], 10);
  EXPECT_EQ(idx.percentiles[25], 10);  // ceil(1) = rank 1
  EXPECT_EQ(idx.percentiles[26], 20);
  EXPECT_EQ(idx.percentiles[50], 20);
  EXPECT_EQ(idx.percentiles[51], 30);
  EXPECT_EQ(idx.percentiles[100], 40);
}

TEST(SampleIndex, RoundTripAndFingerprint) {
  const auto dir = test::fresh_temp_dir("analyzer", "index");
  const std::string a = shard(dir, "a.bin", {1, 2, 3, 4, 5, 6, 7, 8, 9});
  data::AnalyzeOptions o;
  o.patterns = {a};
  o.seq_len = 2;
  o.vocab_size = 16;
  const data::SampleIndex idx = data::analyze_shards(o);
  const std::string path = (dir / "idx.json").string();
  data::write_sample_index(path, idx);
  const data::SampleIndex back = data::read_sample_index(path);
  EXPECT_EQ(back.values, idx.values);
  EXPECT_EQ(back.sorted, idx.sorted);
  EXPECT_EQ(back.percentiles, idx.percentiles);
  ASSERT_EQ(back.shards.size(), 1u);
  EXPECT_EQ(back.shards[0].xxh64, idx.shards[0].xxh64);
  EXPECT_NO_THROW(data::check_index_matches(back, path, {a}, 2));

  // Another dataset: same size, one token changed.
  const std::string b = shard(dir, "b.bin", {1, 2, 3, 4, 5, 6, 7, 8, 10});
  const std::string msg = test::message_of([&] { data::check_index_matches(back, path, {b}, 2); });
  EXPECT_NE(msg.find("is from another dataset: shard 0 '" + b + "' has"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the index's '" + a + "'"), std::string::npos) << msg;
  EXPECT_NE(test::message_of([&] { data::check_index_matches(back, path, {a, b}, 2); }).find("built from 1 shard(s), the data has 2"),
            std::string::npos);
  EXPECT_NE(test::message_of([&] { data::check_index_matches(back, path, {a}, 4); }).find("built for sequence length 2"),
            std::string::npos);

  // A damaged index: named, with the field.
  std::string text;
  {
    std::ifstream in(path);
    std::getline(in, text);
  }
  const auto damaged = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    std::ofstream(dir / "bad.json") << t;
    return test::message_of([&] { data::read_sample_index((dir / "bad.json").string()); });
  };
  EXPECT_NE(damaged("\"index_to_sample\":[", "\"index_to_sample\":[0,").find("do not agree"), std::string::npos);
  EXPECT_NE(damaged("\"format\":\"cutrain-curriculum-index\"", "\"format\":\"other\"").find("expected format cutrain-curriculum-index"),
            std::string::npos);
}

TEST(DataAnalyzer, BadInputIsNamed) {
  const auto dir = test::fresh_temp_dir("analyzer", "bad");
  data::AnalyzeOptions o;
  o.patterns = {(dir / "none*.bin").string()};
  EXPECT_NE(test::message_of([&] { data::analyze_shards(o); }).find("matches no file"), std::string::npos);
  o.patterns = {shard(dir, "small.bin", {1, 2, 3})};
  o.seq_len = 8;
  EXPECT_NE(test::message_of([&] { data::analyze_shards(o); }).find("fewer than one window of 9 tokens"), std::string::npos);
  o.metric = "perplexity";
  EXPECT_NE(test::message_of([&] { data::analyze_shards(o); }).find("--metric: expected one of \"seqlen\", \"vocabularyrarity\""),
            std::string::npos);
  o.metric = "vocabularyrarity";
  o.seq_len = 1;
  o.vocab_size = 2;  // tokens 2 and 3 are out of range: the shard's check names the file
  EXPECT_NE(test::message_of([&] { data::analyze_shards(o); }).find("small.bin"), std::string::npos);
}
