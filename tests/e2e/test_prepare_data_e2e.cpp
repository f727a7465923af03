// `cutrain prepare-data` end to end on WikiText-2 valid: the shards it writes load, hold
// [EOT] + document for every document in order, decode back to the text, and bad flags fail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "data/documents.h"
#include "data/encode_documents.h"
#include "data/token_shard.h"
#include "tests/unit/data_test_util.h"

namespace cutrain::data {
namespace {

using test::gpt2;

int run(const std::string& args, const std::string& log) {
  const std::string cmd = std::string(CUTRAIN_BIN) + " " + args + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::vector<int32_t> read_tokens(const std::string& path) {
  const TokenShard s = TokenShard::open(path, kGpt2VocabSize);
  return std::vector<int32_t>(s.tokens(), s.tokens() + s.size());
}

TEST(PrepareDataE2E, WikiText2ValidToShards) {
  CUTRAIN_REQUIRE_GPT2_DATA();
  const std::string input = test::wikitext_path("valid");
  if (!std::filesystem::exists(input)) GTEST_SKIP() << "WikiText-2 valid not found under " << test::data_dir();
  test::TempDir dir;
  const std::string prefix = dir / "out/wt2";
  const std::string log = dir / "log.txt";
  ASSERT_EQ(run("prepare-data --input " + input + " --vocab " + test::vocab_path() + " --merges " +
                    test::merges_path() + " --output " + prefix + " --val_fraction 0.1 --shard_size 100000 --threads 2",
                log),
            0)
      << test::slurp(log);
  const std::string report = test::slurp(log);
  EXPECT_NE(report.find("MB/s per thread"), std::string::npos) << report;

  const std::string text = test::slurp(input);
  const auto docs = split_documents(text, SplitMode::kAuto);
  const std::size_t n_val = static_cast<std::size_t>(std::llround(0.1 * double(docs.size())));
  const auto want_val = encode_documents(gpt2(), {docs.begin(), docs.begin() + n_val}, {});
  const auto want_train = encode_documents(gpt2(), {docs.begin() + n_val, docs.end()}, {});

  EXPECT_EQ(read_tokens(prefix + "_val_000000.bin"), want_val);
  EXPECT_FALSE(std::filesystem::exists(prefix + "_val_000001.bin"));
  std::vector<int32_t> train;
  std::size_t shards = 0;
  for (;; ++shards) {
    char name[48];
    std::snprintf(name, sizeof(name), "_train_%06zu.bin", shards);
    if (!std::filesystem::exists(prefix + name)) break;
    const auto t = read_tokens(prefix + name);
    train.insert(train.end(), t.begin(), t.end());
  }
  EXPECT_EQ(shards, (want_train.size() + 99999) / 100000);
  EXPECT_EQ(train, want_train);

  std::string expect_text;
  for (auto d : docs) (expect_text += "<|endoftext|>") += d;
  EXPECT_EQ(gpt2().decode(want_val) + gpt2().decode(train), expect_text);
  for (const auto& e : std::filesystem::directory_iterator(dir.path / "out"))
    EXPECT_EQ(e.path().extension(), ".bin") << "left behind: " << e.path();
}

TEST(PrepareDataE2E, BadInputFailsWithAMessage) {
  CUTRAIN_REQUIRE_GPT2_DATA();
  test::TempDir dir;
  const std::string log = dir / "log.txt";
  test::write_bytes(dir / "in.txt", "one document\n\nanother one\n");
  EXPECT_NE(run("prepare-data --input " + (dir / "in.txt") + " --vocab " + (dir / "nope.json") + " --merges " +
                    test::merges_path() + " --output " + (dir / "x"),
                log),
            0);
  EXPECT_NE(test::slurp(log).find("nope.json"), std::string::npos) << test::slurp(log);
  EXPECT_NE(run("prepare-data --input " + (dir / "in.txt") + " --vocab " + test::vocab_path() + " --merges " +
                    test::merges_path() + " --output " + (dir / "x") + " --val_fraction 1.5",
                log),
            0);
  EXPECT_NE(test::slurp(log).find("--val_fraction"), std::string::npos) << test::slurp(log);
  // A small paragraph file works: 2 documents, no val split.
  ASSERT_EQ(run("prepare-data --input " + (dir / "in.txt") + " --vocab " + test::vocab_path() + " --merges " +
                    test::merges_path() + " --output " + (dir / "x"),
                log),
            0)
      << test::slurp(log);
  EXPECT_EQ(gpt2().decode(read_tokens(dir / "x_train_000000.bin")), "<|endoftext|>one document\n<|endoftext|>another one\n");
  EXPECT_FALSE(std::filesystem::exists(dir / "x_val_000000.bin"));
}

}  // namespace
}  // namespace cutrain::data
