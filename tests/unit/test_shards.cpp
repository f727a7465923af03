// Token shards: the llm.c .bin layout byte for byte, round trips, atomic writes, and an error that
// names file, offset and problem for each kind of bad input.
#include <gtest/gtest.h>

#include <cstring>

#include "data/token_shard.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"
#include "tests/unit/data_test_util.h"

namespace cutrain::data {
namespace {

// A shard built by hand from the format's description (not by write_shard): what llm.c writes.
std::string llmc_shard_bytes(const std::vector<uint16_t>& tokens, int32_t magic = kShardMagic, int32_t version = 1,
                             int64_t count = -1) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count >= 0 ? count : int64_t(tokens.size()));
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

// The message of the Error `f` throws ("" if none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenShard, WritesTheLlmcLayoutExactly) {
  test::TempDir dir;
  auto rng = test::fresh_rng();
  const std::size_t n = 1 + rng() % 5000;
  const auto ids = test::random_ints(n, rng, 0, 65535);
  std::vector<uint16_t> u16(ids.begin(), ids.end());
  write_shard(dir / "a.bin", ids);
  EXPECT_EQ(test::slurp(dir / "a.bin"), llmc_shard_bytes(u16));
  for (const auto& e : std::filesystem::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename(), "a.bin") << "temp file left behind";
}

TEST(TokenShard, OpensLlmcShardsAndRoundTrips) {
  test::TempDir dir;
  auto rng = test::fresh_rng();
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(1 + rng() % 100000)}) {
    const auto ids = test::random_ints(n, rng, 0, kGpt2VocabSize - 1);
    std::vector<uint16_t> u16(ids.begin(), ids.end());
    test::write_bytes(dir / "llmc.bin", llmc_shard_bytes(u16));
    const TokenShard s = TokenShard::open(dir / "llmc.bin", kGpt2VocabSize);
    ASSERT_EQ(s.size(), n);
    EXPECT_TRUE(n == 0 || std::memcmp(s.tokens(), u16.data(), n * 2) == 0);
    write_shard(dir / "ours.bin", ids);  // overwrites an existing file in place
    write_shard(dir / "ours.bin", ids);
    TokenShard t = TokenShard::open(dir / "ours.bin", kGpt2VocabSize);
    TokenShard moved = std::move(t);
    ASSERT_EQ(moved.size(), n);
    EXPECT_TRUE(n == 0 || std::memcmp(moved.tokens(), u16.data(), n * 2) == 0);
    EXPECT_EQ(moved.path(), dir / "ours.bin");
  }
}

TEST(TokenShard, BadInputErrorsNameFileOffsetAndProblem) {
  test::TempDir dir;
  auto rng = test::fresh_rng();
  const auto ids = test::random_ints(100, rng, 0, 50000);
  std::vector<uint16_t> u16(ids.begin(), ids.end());

  const std::string missing = dir / "missing.bin";
  std::string msg = error_of([&] { TokenShard::open(missing, kGpt2VocabSize); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;

  test::write_bytes(dir / "magic.bin", llmc_shard_bytes(u16, 20240801));
  msg = error_of([&] { TokenShard::open(dir / "magic.bin", kGpt2VocabSize); });
  EXPECT_NE(msg.find(dir / "magic.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at offset 0: magic is 20240801, expected 20240520"), std::string::npos) << msg;

  test::write_bytes(dir / "version.bin", llmc_shard_bytes(u16, kShardMagic, 2));
  msg = error_of([&] { TokenShard::open(dir / "version.bin", kGpt2VocabSize); });
  EXPECT_NE(msg.find("at offset 4: version is 2"), std::string::npos) << msg;

  std::string cut = llmc_shard_bytes(u16);
  cut.resize(1024 + 2 * 60 + 1);
  test::write_bytes(dir / "truncated.bin", cut);
  msg = error_of([&] { TokenShard::open(dir / "truncated.bin", kGpt2VocabSize); });
  EXPECT_NE(msg.find(dir / "truncated.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at offset 1145: truncated: the header says 100 tokens (1224 bytes)"), std::string::npos) << msg;

  test::write_bytes(dir / "short_header.bin", cut.substr(0, 500));
  msg = error_of([&] { TokenShard::open(dir / "short_header.bin", kGpt2VocabSize); });
  EXPECT_NE(msg.find("at offset 500: truncated header"), std::string::npos) << msg;

  test::write_bytes(dir / "trailing.bin", llmc_shard_bytes(u16) + "xy");
  msg = error_of([&] { TokenShard::open(dir / "trailing.bin", kGpt2VocabSize); });
  EXPECT_NE(msg.find("at offset 1224: 2 trailing bytes"), std::string::npos) << msg;

  const std::size_t bad = rng() % u16.size();
  auto with_bad = u16;
  with_bad[bad] = static_cast<uint16_t>(kGpt2VocabSize + rng() % 1000);
  test::write_bytes(dir / "vocab.bin", llmc_shard_bytes(with_bad));
  msg = error_of([&] { TokenShard::open(dir / "vocab.bin", kGpt2VocabSize); });
  EXPECT_NE(msg.find(dir / "vocab.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at offset " + std::to_string(1024 + 2 * bad) + " (token " + std::to_string(bad) +
                     "): token id " + std::to_string(with_bad[bad]) + " >= vocab size 50257"),
            std::string::npos)
      << msg;
  EXPECT_NO_THROW(TokenShard::open(dir / "vocab.bin", 65536));  // fine for a larger vocabulary

  std::vector<int32_t> too_big = ids;
  too_big[3] = 70000;
  msg = error_of([&] { write_shard(dir / "big.bin", too_big); });
  EXPECT_NE(msg.find("token 3 is 70000, expected 0..65535"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir / "big.bin"));
  msg = error_of([&] { write_shard(dir / "no_such_dir/x.bin", ids); });
  EXPECT_NE(msg.find("cannot create"), std::string::npos) << msg;
}

}  // namespace
}  // namespace cutrain::data
