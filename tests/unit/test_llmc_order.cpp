// llm.c's DataLoader order (data/llmc_order.h) and the batch sampler's DataOrder::Llmc: the
// generator against the published MT19937 values, llm.c's permutation, samples per shard, epochs
// (every sample once, the shard order permuted in place, the first epoch shuffled), the
// validation loader's file order, random access against sequential draws, ranks, the batches'
// B x T + 1 runs, bad input, the background loader, and the plain-Python reference
// (tests/scripts/llmc_order_reference.py) batch for batch over several epochs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "data/data_loader.h"
#include "data/llmc_order.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"
#include "tests/unit/data_test_util.h"

namespace cutrain::data {
namespace {

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// Published values: the C++ standard's ([rand.predef]: the 10000th output of a default-constructed
// mt19937 is 4123659995), MT19937's first output for its default seed 5489, and the five outputs
// llm.c's rand.h documents for manual_seed(137) (equal to PyTorch's torch.manual_seed(137)).
TEST(LlmcOrder, GeneratorIsTheStandardMt19937LlmcSeeds) {
  std::mt19937 a(5489);
  EXPECT_EQ(a(), 3499211612u);
  std::mt19937 b;
  b.discard(9999);
  EXPECT_EQ(b(), 4123659995u);
  std::mt19937 c(137);
  for (std::uint32_t want : {4053805790u, 2173880614u, 380293709u, 1237255315u, 2986595568u}) EXPECT_EQ(c(), want);
}

TEST(LlmcOrder, PermutationIsFisherYatesFromTheTopWithAModulo) {
  auto rng = test::fresh_rng();
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(2), std::size_t(7), std::size_t(1000)}) {
    const auto seed = static_cast<std::uint32_t>(rng());
    std::mt19937 g(seed), draws(seed);
    std::vector<int32_t> v(n);
    std::iota(v.begin(), v.end(), 100);
    std::vector<int32_t> want = v;
    // The same walk from its definition: position i (n-1 down to 1) swaps with next() % (i + 1).
    for (std::size_t i = n; i-- > 1;) std::swap(want[i], want[draws() % (i + 1)]);
    llmc_permute(v, g);
    EXPECT_EQ(v, want) << "n " << n;
    EXPECT_EQ(g, draws) << "n " << n << ": n - 1 numbers drawn, no more";
    std::vector<int32_t> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(sorted[i], int32_t(100 + i));
  }
  // A modulo, not a rejection draw: for i + 1 = 3 the first output 3499211612 (seed 5489) picks
  // 3499211612 % 3 = 2 (no swap at the top), then the second output % 2.
  std::mt19937 g(5489), h(5489);
  h();
  const std::uint32_t second = h();
  std::vector<int32_t> v{0, 1, 2};
  llmc_permute(v, g);
  std::vector<int32_t> want{0, 1, 2};
  std::swap(want[1], want[second % 2]);
  EXPECT_EQ(v, want);
}

TEST(LlmcOrder, SamplesPerShardKeepOneTokenBack) {
  EXPECT_EQ(llmc_samples_in_shard(4 * 2 * 3 * 5, 3, 5, 2), 3);  // exactly 4 pieces: the last has no last target
  EXPECT_EQ(llmc_samples_in_shard(4 * 2 * 3 * 5 + 1, 3, 5, 2), 4);
  EXPECT_EQ(llmc_samples_in_shard(16, 16, 1, 1), 0);
  EXPECT_EQ(llmc_samples_in_shard(17, 16, 1, 1), 1);
}

LlmcOrderOptions order_options(std::vector<int64_t> tokens, int64_t B, int64_t T, int rank, int world, bool shuffle) {
  LlmcOrderOptions o;
  o.shard_tokens = std::move(tokens);
  o.batch_size = B;
  o.seq_len = T;
  o.rank = rank;
  o.world_size = world;
  o.shuffle = shuffle;
  return o;
}

// Each epoch reads every sample of every shard once, one shard after another (a shard's samples
// together), each at the rank's slice; the shard order and the samples' order change between
// epochs and the first epoch is not file order.
TEST(LlmcOrder, EveryEpochReadsEverySampleOnceShardByShard) {
  auto rng = test::fresh_rng();
  const int64_t B = 1 + rng() % 3, T = 2 + rng() % 5;
  const int world = 3, rank = int(rng() % 3);
  const int64_t piece = world * B * T;
  const std::vector<int64_t> tokens{piece * 9 + 1, piece * 4 + int64_t(rng() % piece) + 1, piece * 7 + 1, piece * 11};
  LlmcOrder order(order_options(tokens, B, T, rank, world, true));
  ASSERT_EQ(order.batches_per_epoch(), 9 + 4 + 7 + 10);
  std::vector<std::vector<std::pair<std::size_t, int64_t>>> epochs;
  for (int e = 0; e < 4; ++e) {
    std::vector<std::pair<std::size_t, int64_t>> reads;
    for (int64_t k = 0; k < order.batches_per_epoch(); ++k) {
      const LlmcRead r = order.at(e * order.batches_per_epoch() + k);
      reads.push_back({r.shard, r.first_token});
      ASSERT_EQ((r.first_token / (B * T)) % world, rank) << "the rank's slice of its sample";
      ASSERT_EQ(r.first_token % (B * T), 0);
      ASSERT_LE(r.first_token + B * T + 1, tokens[r.shard]) << "the read stays inside its shard";
    }
    std::set<std::pair<std::size_t, int64_t>> seen(reads.begin(), reads.end());
    EXPECT_EQ(seen.size(), reads.size()) << "epoch " << e << ": a sample read twice";
    std::vector<std::size_t> shard_runs;  // the shard of each run of equal shards
    for (const auto& [s, t] : reads)
      if (shard_runs.empty() || shard_runs.back() != s) shard_runs.push_back(s);
    ASSERT_EQ(shard_runs.size(), tokens.size()) << "epoch " << e << ": a shard's samples are not together";
    for (std::size_t s = 0; s < tokens.size(); ++s) EXPECT_EQ(std::count(shard_runs.begin(), shard_runs.end(), s), 1);
    epochs.push_back(reads);
  }
  std::vector<std::pair<std::size_t, int64_t>> file_order;
  for (std::size_t s = 0; s < tokens.size(); ++s)
    for (int64_t i = 0; i < order.samples_in_shard(s); ++i) file_order.push_back({s, (i * world + rank) * B * T});
  EXPECT_NE(epochs[0], file_order) << "the first epoch is shuffled";
  for (int e = 1; e < 4; ++e) EXPECT_NE(epochs[e], epochs[e - 1]) << "epoch " << e << " repeats the one before";
}

// The shard order of epoch e + 1 is epoch e's order permuted again (llm.c never goes back to the
// identity): replayed here with the generator alone, from the draws the epochs take.
TEST(LlmcOrder, ShardOrderIsPermutedInPlaceEveryEpoch) {
  const int64_t B = 2, T = 3;
  const std::vector<int64_t> tokens{B * T * 3 + 1, B * T * 2 + 1, B * T * 5 + 1, B * T * 1 + 1, B * T * 4 + 1};
  LlmcOrderOptions o = order_options(tokens, B, T, 0, 1, true);
  o.seed = 7;
  LlmcOrder order(o);
  std::mt19937 g(7);
  std::vector<int32_t> shards(tokens.size());
  std::iota(shards.begin(), shards.end(), 0);
  int64_t batch = 0;
  for (int e = 0; e < 5; ++e) {
    llmc_permute(shards, g);
    for (int32_t s : shards) {
      std::vector<int32_t> samples(std::size_t(llmc_samples_in_shard(tokens[std::size_t(s)], B, T, 1)));
      std::iota(samples.begin(), samples.end(), 0);
      llmc_permute(samples, g);
      for (int32_t i : samples) {
        const LlmcRead r = order.at(batch++);
        ASSERT_EQ(r.shard, std::size_t(s)) << "epoch " << e << " batch " << batch - 1;
        ASSERT_EQ(r.first_token, i * B * T) << "epoch " << e << " batch " << batch - 1;
      }
    }
  }
}

TEST(LlmcOrder, UnshuffledIsFileOrderAndWraps) {
  const int64_t B = 2, T = 4, world = 2;
  const std::vector<int64_t> tokens{world * B * T * 3 + 5, world * B * T * 2 + 1};
  for (int rank : {0, 1}) {
    LlmcOrder order(order_options(tokens, B, T, rank, int(world), false));
    const std::vector<std::pair<std::size_t, int64_t>> want{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}};
    for (int64_t k = 0; k < 12; ++k) {
      const LlmcRead r = order.at(k);
      const auto& [s, i] = want[std::size_t(k % 5)];
      EXPECT_EQ(r.shard, s) << "batch " << k;
      EXPECT_EQ(r.first_token, (i * world + rank) * B * T) << "batch " << k;
    }
  }
}

TEST(LlmcOrder, RandomAccessEqualsTheSequentialDraws) {
  auto rng = test::fresh_rng();
  const int64_t B = 1 + rng() % 2, T = 3;
  const std::vector<int64_t> tokens{B * T * 5 + 1, B * T * 1 + 1, B * T * 8 + 2};
  LlmcOrderOptions o = order_options(tokens, B, T, 0, 1, true);
  o.seed = rng() % 1000;
  LlmcOrder seq(o);
  std::vector<LlmcRead> want;
  for (int64_t k = 0; k < 60; ++k) want.push_back(seq.at(k));
  LlmcOrder jumps(o);
  std::vector<int64_t> steps(60);
  std::iota(steps.begin(), steps.end(), 0);
  std::shuffle(steps.begin(), steps.end(), rng);
  for (int64_t k : steps) {
    const LlmcRead r = jumps.at(k);
    EXPECT_EQ(r.shard, want[std::size_t(k)].shard) << "batch " << k;
    EXPECT_EQ(r.first_token, want[std::size_t(k)].first_token) << "batch " << k;
  }
  EXPECT_EQ(LlmcOrder(o).at(59).first_token, want[59].first_token) << "a fresh order skipping straight to a batch";
}

TEST(LlmcOrder, BadInputIsReported) {
  expect_error(
      [] {
        LlmcOrder(order_options({100, 48}, 4, 12, 0, 1, true));
      },
      "shard 1 holds 48 tokens; llm.c needs at least world x B x T + 1 = 49");
  expect_error([] { LlmcOrder(order_options({}, 4, 12, 0, 1, true)); }, "expected at least one shard");
  expect_error([] { LlmcOrder(order_options({100}, 0, 12, 0, 1, true)); }, "must be positive, found B=0");
  expect_error([] { LlmcOrder(order_options({100}, 1, 2, 2, 2, true)); }, "rank 2 is outside world size 2");
  LlmcOrderOptions o = order_options({100}, 1, 2, 1, 2, true);
  o.seed = UINT32_MAX;
  expect_error([&] { LlmcOrder{o}; }, "expected seed + rank < 2^32, found seed 4294967295 + rank 1");
  o.seed = UINT64_MAX;  // no wrap-around past 2^64
  expect_error([&] { LlmcOrder{o}; }, "expected seed + rank < 2^32");
  o.seed = UINT32_MAX;
  o.rank = 0;
  EXPECT_NO_THROW(LlmcOrder{o});
  expect_error([&] { LlmcOrder(o).at(-1); }, "batch -1 is negative");
}

// ---- the batch sampler with DataOrder::Llmc ----

// Shards of distinct tokens (1, 2, 3, ... across the set), so a read is traced to its shard and offset.
// The files go in `dir` (a folder of the test's TempDir: one test may hold several sets).
struct Shards {
  std::filesystem::path dir;
  std::vector<std::vector<int32_t>> tokens;
  Shards(const std::vector<int64_t>& sizes, std::filesystem::path folder) : dir(std::move(folder)) {
    std::filesystem::create_directories(dir);
    int32_t next = 1;
    for (std::size_t s = 0; s < sizes.size(); ++s) {
      std::vector<int32_t> t(static_cast<std::size_t>(sizes[s]));
      for (auto& x : t) x = next++;
      char name[48];
      std::snprintf(name, sizeof(name), "l_train_%06zu.bin", s);
      write_shard((dir / name).string(), t);
      tokens.push_back(std::move(t));
    }
  }
  std::string pattern() const { return (dir / "l_train_*.bin").string(); }
};

SamplerOptions sampler_options(const Shards& set, int64_t B, int64_t T) {
  SamplerOptions o;
  o.patterns = {set.pattern()};
  o.batch_size = B;
  o.seq_len = T;
  o.vocab_size = 65536;
  o.order = DataOrder::Llmc;
  o.seed = 42;
  return o;
}

TEST(BatchSamplerLlmc, EachBatchIsTheOrdersRunOfBTPlusOneTokens) {
  auto rng = test::fresh_rng();
  const int64_t B = 1 + rng() % 4, T = 2 + rng() % 6;
  const int world = 2;
  test::TempDir tmp;
  // A tail shorter than one more sample (world x B x T tokens): 5 samples in the first shard.
  Shards set({world * B * T * 5 + 1 + int64_t(rng() % std::uint64_t(std::min<int64_t>(7, world * B * T))),
              world * B * T * 3 + 1},
             tmp.path);
  for (int rank = 0; rank < world; ++rank)
    for (bool shuffle : {true, false}) {
      SamplerOptions o = sampler_options(set, B, T);
      o.rank = rank;
      o.world_size = world;
      o.shuffle = shuffle;
      BatchSampler s(o);
      LlmcOrder order(
          order_options({int64_t(set.tokens[0].size()), int64_t(set.tokens[1].size())}, B, T, rank, world, shuffle));
      ASSERT_EQ(s.batches_per_epoch(), 5 + 3);
      std::vector<int32_t> in(B * T, -1), tg(B * T, -1);
      for (int64_t k = 0; k < 3 * s.batches_per_epoch(); ++k) {
        s.fill(k, in.data(), tg.data());
        const LlmcRead r = order.at(k);
        const auto& src = set.tokens[r.shard];
        for (int64_t i = 0; i < B * T; ++i) {
          ASSERT_EQ(in[i], src[std::size_t(r.first_token + i)]) << "batch " << k << " token " << i;
          ASSERT_EQ(tg[i], src[std::size_t(r.first_token + i + 1)]) << "batch " << k << " token " << i;
        }
      }
    }
}

TEST(BatchSamplerLlmc, BadInputIsReported) {
  test::TempDir tmp;
  Shards set({200, 30}, tmp.path);
  SamplerOptions o = sampler_options(set, 2, 16);
  expect_error([&] { BatchSampler{o}; },
               "l_train_000001.bin holds 30 tokens; llm.c's data order needs at least "
               "world_size x B x T + 1 = 33 in every shard");
  o.batch_size = 1;
  o.labels = Labels::kIdentity;
  expect_error([&] { BatchSampler{o}; }, "expected next-token labels, found labels = input ids");
  o.labels = Labels::kNextToken;
  o.curriculum = std::make_shared<CurriculumDraw>();
  expect_error([&] { BatchSampler{o}; }, "expected one of them, found both");
  o.curriculum = nullptr;
  o.seed = std::uint64_t(1) << 32;
  expect_error([&] { BatchSampler{o}; }, "expected seed + rank < 2^32");
}

TEST(BatchSamplerLlmc, BackgroundLoaderHandsOutTheSamplersBatches) {
  const int64_t B = 3, T = 4;
  test::TempDir tmp;
  Shards set({B * T * 6 + 1, B * T * 2 + 9, B * T * 3 + 1}, tmp.path);
  SamplerOptions o = sampler_options(set, B, T);
  std::vector<int32_t> slots[4];
  for (auto& v : slots) v.assign(B * T, -1);
  HostBatchBuffers buf;
  buf.inputs[0] = slots[0].data();
  buf.targets[0] = slots[1].data();
  buf.inputs[1] = slots[2].data();
  buf.targets[1] = slots[3].data();
  const int64_t first = 5;  // a resumed run starts inside the first epoch
  DataLoader loader(o, buf, first);
  BatchSampler ref(o);
  ASSERT_EQ(loader.batches_per_epoch(), 11);
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t k = first; k < first + 30; ++k) {
      const Batch b = loader.next();
      ASSERT_EQ(b.step, k);
      ASSERT_EQ(b.epoch, k / 11);
      ref.fill(k, in.data(), tg.data());
      ASSERT_EQ(std::vector<int32_t>(b.inputs, b.inputs + B * T), in) << "batch " << k;
      ASSERT_EQ(std::vector<int32_t>(b.targets, b.targets + B * T), tg) << "batch " << k;
    }
    loader.reset(first);
  }
}

// The plain-Python reference simulates llm.c's loader (its own MT19937, reset / advance /
// next_batch) on the same files and must agree with every batch, over several epochs, for
// several B, T, shard counts, ranks and seeds, shuffled and not; some batches asked out of order.
TEST(BatchSamplerLlmc, PythonReferenceAgrees) {
  if (std::system("python3 -c 'import sys' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found: skipped";
  auto rng = test::fresh_rng();
  test::TempDir out;
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::unique_ptr<Shards>> sets;
  struct Case {
    int64_t B, T;
    int world, rank;
    std::vector<int64_t> pieces;  // world x B x T pieces per shard (+ a remainder drawn below)
    bool shuffle;
  };
  for (const Case& c : {Case{2, 3, 1, 0, {5, 3, 8}, true}, Case{1, 7, 1, 0, {4}, true},
                        Case{3, 2, 2, 1, {3, 6, 2, 4}, true}, Case{4, 5, 3, 2, {2, 5}, true},
                        Case{1, 1, 1, 0, {40, 1, 9, 17, 3, 2}, true}, Case{2, 3, 2, 0, {3, 4, 2}, false}}) {
    std::vector<int64_t> sizes;
    for (int64_t p : c.pieces) sizes.push_back(p * c.world * c.B * c.T + 1 + int64_t(rng() % (c.world * c.B * c.T)));
    sets.push_back(std::make_unique<Shards>(sizes, out.path / ("set" + std::to_string(sets.size()))));
    SamplerOptions o = sampler_options(*sets.back(), c.B, c.T);
    o.world_size = c.world;
    o.rank = c.rank;
    o.shuffle = c.shuffle;
    o.seed = rng() % 100000;
    BatchSampler s(o);
    std::vector<int64_t> steps(std::size_t(3 * s.batches_per_epoch() + 2));
    std::iota(steps.begin(), steps.end(), 0);
    for (int extra = 0; extra < 4; ++extra) steps.push_back(int64_t(rng() % steps.size()));  // back in time
    nlohmann::json batches = nlohmann::json::array();
    std::vector<int32_t> in(c.B * c.T), tg(c.B * c.T);
    for (int64_t k : steps) {
      s.fill(k, in.data(), tg.data());
      batches.push_back({{"step", k}, {"inputs", in}, {"targets", tg}});
    }
    cases.push_back({{"shards", expand_shard_patterns(o.patterns)},
                     {"batch_size", c.B},
                     {"seq_len", c.T},
                     {"rank", c.rank},
                     {"world_size", c.world},
                     {"seed", o.seed},
                     {"shuffle", c.shuffle},
                     {"batches", batches}});
  }
  const std::string dump = out / "llmc_order_cpp.json";
  std::ofstream(dump) << cases.dump();
  const std::string cmd =
      "python3 " + std::string(CUTRAIN_SOURCE_DIR) + "/tests/scripts/llmc_order_reference.py " + dump;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace cutrain::data
