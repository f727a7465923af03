// BERT's masked-LM data: the counter generator, the masking rule (counts, 80/10/10, labels only at
// chosen positions, never on padding), the document pieces of a shard, the sampler's batches
// (contiguous runs of one document, determinism, resume, padding to the longest or to S, synthetic
// lengths), bad input, and the plain-Python reference (tests/scripts/mlm_reference.py) equal to
// the C++ output sample for sample.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "data/batch_sampler.h"
#include "data/mlm_sampler.h"
#include "runtime/error.h"
#include "tests/unit/data_test_util.h"

namespace cutrain::data {
namespace {

constexpr int32_t kMask = 50257, kPad = 50258, kEot = 50256;

MlmRule rule(int max_pred) {
  MlmRule r;
  r.max_predictions = max_pred;
  r.mask_id = kMask;
  r.pad_id = kPad;
  r.random_tokens = 50256;
  return r;
}

TEST(MlmRng, KeysAndDrawsAreDeterministicAndDistinct) {
  CounterRng a(CounterRng::key(7, kStreamMask, 3)), b(CounterRng::key(7, kStreamMask, 3));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(a.next(), b.next());
  std::set<uint64_t> keys;
  for (uint64_t seed : {0, 1, 7})
    for (uint64_t stream : {1, 2, 3})
      for (uint64_t n = 0; n < 50; ++n) keys.insert(CounterRng::key(seed, stream, n));
  EXPECT_EQ(keys.size(), 3u * 3u * 50u);
  CounterRng r(CounterRng::key(1, 1, 1));
  std::vector<int> hist(7);
  for (int i = 0; i < 70000; ++i) {
    const uint64_t x = r.below(7);
    ASSERT_LT(x, 7u);
    ++hist[x];
  }
  for (int h : hist) EXPECT_NEAR(h, 10000, 500);
}

TEST(MlmRule, NumberOfPredictions) {
  const MlmRule r = rule(20);
  EXPECT_EQ(mlm_num_predictions(r, 1), 1);    // at least one
  EXPECT_EQ(mlm_num_predictions(r, 3), 1);    // 0.45 -> 0 -> 1
  EXPECT_EQ(mlm_num_predictions(r, 10), 2);   // 1.5 rounds half up
  EXPECT_EQ(mlm_num_predictions(r, 64), 10);  // 9.6
  EXPECT_EQ(mlm_num_predictions(r, 128), 19);
  EXPECT_EQ(mlm_num_predictions(r, 512), 20);  // the cap
  EXPECT_EQ(mlm_num_predictions(rule(80), 512), 77);
}

TEST(MlmRule, LabelsOnlyAtChosenPositionsAndPaddingIgnored) {
  const MlmRule r = rule(20);
  const int len = 40, row = 64;
  std::vector<int32_t> orig(len), tok(row, -7), lab(row, -7), scratch(row);
  for (int i = 0; i < len; ++i) orig[i] = 1000 + i;
  std::copy(orig.begin(), orig.end(), tok.begin());
  const int n = mask_sample(r, 5, 11, tok.data(), lab.data(), len, row, scratch.data());
  EXPECT_EQ(n, 6);
  int labelled = 0;
  for (int i = 0; i < row; ++i) {
    if (i >= len) {
      EXPECT_EQ(tok[i], kPad) << i;
      EXPECT_EQ(lab[i], kIgnoreLabel) << "a label on padding at " << i;
      continue;
    }
    if (lab[i] == kIgnoreLabel) {
      EXPECT_EQ(tok[i], orig[i]) << "an unchosen token changed at " << i;
    } else {
      ++labelled;
      EXPECT_EQ(lab[i], orig[i]);
      EXPECT_TRUE(tok[i] == kMask || tok[i] == orig[i] || (tok[i] >= 0 && tok[i] < 50256)) << tok[i];
    }
  }
  EXPECT_EQ(labelled, n);
  // The same (seed, sample): the same result; another sample number: other positions.
  std::vector<int32_t> tok2(row), lab2(row);
  std::copy(orig.begin(), orig.end(), tok2.begin());
  mask_sample(r, 5, 11, tok2.data(), lab2.data(), len, row, scratch.data());
  EXPECT_EQ(tok, tok2);
  EXPECT_EQ(lab, lab2);
  std::copy(orig.begin(), orig.end(), tok2.begin());
  mask_sample(r, 5, 12, tok2.data(), lab2.data(), len, row, scratch.data());
  EXPECT_NE(lab, lab2);
}

TEST(MlmRule, FifteenPercentAndTheEightyTenTenSplit) {
  const MlmRule r = rule(1000);
  const int len = 100;
  std::vector<int32_t> tok(len), lab(len), scratch(len);
  std::int64_t chosen = 0, masked = 0, kept = 0, replaced = 0, total = 0;
  std::vector<std::int64_t> per_position(len);
  for (uint64_t s = 0; s < 20000; ++s) {
    for (int i = 0; i < len; ++i) tok[i] = 2 * i + 1;  // odd tokens: a random replacement is rarely the original
    mask_sample(r, 99, s, tok.data(), lab.data(), len, len, scratch.data());
    total += len;
    for (int i = 0; i < len; ++i) {
      if (lab[i] == kIgnoreLabel) continue;
      ++chosen;
      ++per_position[i];
      if (tok[i] == kMask) ++masked;
      else if (tok[i] == lab[i]) ++kept;
      else ++replaced;
    }
  }
  EXPECT_EQ(chosen, 20000 * 15);  // exactly round(0.15 x 100) per sample
  EXPECT_NEAR(double(masked) / chosen, 0.8, 0.01);
  EXPECT_NEAR(double(replaced) / chosen, 0.1, 0.01);
  EXPECT_NEAR(double(kept) / chosen, 0.1, 0.01);
  for (int i = 0; i < len; ++i) EXPECT_NEAR(double(per_position[i]) / 20000, 0.15, 0.015) << "position " << i;
}

TEST(MlmPieces, DocumentsSplitAtEotAndIntoPiecesOfS) {
  // docs: [1 2 3 4 5] EOT EOT [6] EOT [7 8 9 10 11 12 13 14 15] (no EOT at the end)
  std::vector<uint16_t> t = {1, 2, 3, 4, 5, uint16_t(kEot), uint16_t(kEot), 6, uint16_t(kEot), 7, 8, 9, 10, 11, 12, 13, 14, 15};
  int64_t docs = 0;
  const std::vector<MlmPiece> p = mlm_pieces(t.data(), t.size(), 2, 4, kEot, &docs);
  EXPECT_EQ(docs, 3);
  const std::vector<std::pair<uint64_t, uint32_t>> want = {{0, 4}, {4, 1}, {7, 1}, {9, 4}, {13, 4}, {17, 1}};
  ASSERT_EQ(p.size(), want.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].start, want[i].first) << i;
    EXPECT_EQ(p[i].len, want[i].second) << i;
    EXPECT_EQ(p[i].shard, 2u);
  }
}

// Shards of documents whose tokens say where they are: document d of shard s holds tokens
// 1000 * (s + 1) + 10 * d + i... kept unique by giving each document its own range.
struct DocShards {
  test::TempDir dir;
  std::map<int32_t, std::pair<int, int>> where;  // token -> (document id, index in it)
  std::vector<std::vector<int32_t>> docs;
  DocShards(int shards, int docs_per_shard, uint64_t seed) {
    CounterRng rng(seed);
    int32_t next = 0;
    for (int s = 0; s < shards; ++s) {
      std::vector<int32_t> t;
      for (int d = 0; d < docs_per_shard; ++d) {
        const int len = 1 + int(rng.below(40));
        std::vector<int32_t> doc;
        for (int i = 0; i < len; ++i) {
          doc.push_back(next);
          where[next] = {int(docs.size()), i};
          ++next;
        }
        t.insert(t.end(), doc.begin(), doc.end());
        t.push_back(kEot);
        docs.push_back(doc);
      }
      char name[48];
      std::snprintf(name, sizeof(name), "mlm_%03d.bin", s);
      write_shard(dir / name, t);
    }
  }
  std::string pattern() const { return dir / "mlm_*.bin"; }
};

MlmOptions options(const std::string& pattern, int B, int S, uint64_t seed) {
  MlmOptions o;
  if (!pattern.empty()) o.patterns = {pattern};
  o.batch_size = B;
  o.seq_len = S;
  o.seed = seed;
  o.rule = rule(S);
  return o;
}

TEST(MlmSampler, SamplesAreContiguousRunsOfOneDocument) {
  DocShards set(2, 30, 3);
  MlmSampler s(options(set.pattern(), 4, 16, 1));
  EXPECT_EQ(s.num_documents(), 60);
  std::vector<int32_t> raw(16);
  std::set<std::pair<int, int>> seen;  // (document, first index)
  for (int64_t k = 0; k < s.num_samples(); ++k) {
    const int len = s.raw_sample(k, raw.data());
    ASSERT_GE(len, 1);
    ASSERT_LE(len, 16);
    const auto [doc, first] = set.where.at(raw[0]);
    EXPECT_EQ(first % 16, 0) << "pieces start every S tokens of their document";
    for (int i = 0; i < len; ++i) EXPECT_EQ(raw[i], set.docs[doc][first + i]);
    EXPECT_EQ(len, std::min<int>(16, int(set.docs[doc].size()) - first));
    seen.insert({doc, first});
  }
  EXPECT_EQ(int64_t(seen.size()), s.num_samples()) << "an epoch visits every sample once";
}

TEST(MlmSampler, DeterministicResumableAndSeeded) {
  DocShards set(2, 40, 4);
  const int B = 3, S = 16;
  MlmSampler a(options(set.pattern(), B, S, 9)), b(options(set.pattern(), B, S, 9)), c(options(set.pattern(), B, S, 10));
  std::vector<int32_t> ta(B * S), la(B * S), tb(B * S), lb(B * S);
  std::vector<std::vector<int32_t>> run_t, run_l;
  // Across the epoch boundary (the sampler reorders at each epoch).
  const int64_t batches = 2 * a.num_samples() / B + 2;
  for (int64_t m = 0; m < batches; ++m) {
    a.fill(m, ta.data(), la.data());
    run_t.push_back(ta);
    run_l.push_back(la);
  }
  for (int64_t m : {batches - 1, int64_t(0), batches / 2, int64_t(5)}) {  // a fresh sampler, any order: the same batch
    b.fill(m, tb.data(), lb.data());
    EXPECT_EQ(tb, run_t[m]) << m;
    EXPECT_EQ(lb, run_l[m]) << m;
  }
  int differ = 0;
  for (int64_t m = 0; m < 4; ++m) {
    c.fill(m, tb.data(), lb.data());
    differ += tb != run_t[m];
  }
  EXPECT_GT(differ, 0) << "another seed draws other batches";
}

TEST(MlmSampler, PaddingToTheLongestOrToS) {
  DocShards set(1, 50, 5);
  const int B = 4, S = 32;
  MlmOptions o = options(set.pattern(), B, S, 2);
  MlmSampler fixed(o);
  o.pad_to_longest = true;
  MlmSampler longest(o);
  std::vector<int32_t> tf(B * S), lf(B * S), tl(B * S), ll(B * S);
  for (int64_t m = 0; m < 10; ++m) {
    const MlmBatchInfo f = fixed.fill(m, tf.data(), lf.data());
    const MlmBatchInfo l = longest.fill(m, tl.data(), ll.data());
    EXPECT_EQ(f.row_len, S);
    EXPECT_EQ(l.row_len, l.longest);
    EXPECT_EQ(f.longest, l.longest);
    EXPECT_EQ(f.real_tokens, l.real_tokens);
    EXPECT_EQ(f.predictions, l.predictions);
    int64_t pads = 0, labels = 0;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < S; ++t) {
        const bool in_l = t < l.row_len;
        if (in_l) {
          EXPECT_EQ(tf[b * S + t], tl[b * l.row_len + t]);
          EXPECT_EQ(lf[b * S + t], ll[b * l.row_len + t]);
        } else {
          EXPECT_EQ(tf[b * S + t], kPad);
        }
        if (tf[b * S + t] == kPad) {
          ++pads;
          EXPECT_EQ(lf[b * S + t], kIgnoreLabel) << "a label on padding";
        }
        labels += lf[b * S + t] != kIgnoreLabel;
      }
    EXPECT_EQ(pads, B * S - f.real_tokens);
    EXPECT_EQ(labels, f.predictions);
  }
}

TEST(MlmSampler, SyntheticLengthsAndTokens) {
  const int B = 8, S = 20;
  MlmSampler s(options("", B, S, 3));
  EXPECT_TRUE(s.synthetic());
  std::vector<int32_t> raw(S);
  std::set<int> lengths;
  for (int64_t k = 0; k < 2000; ++k) {
    const int len = s.raw_sample(k, raw.data());
    ASSERT_GE(len, S / 2);
    ASSERT_LE(len, S);
    lengths.insert(len);
    for (int i = 0; i < len; ++i) ASSERT_TRUE(raw[i] >= 0 && raw[i] < kEot) << raw[i];
  }
  EXPECT_EQ(lengths.size(), std::size_t(S - S / 2 + 1)) << "every length in [S/2, S] occurs";
  MlmSampler again(options("", B, S, 3));
  std::vector<int32_t> t1(B * S), l1(B * S), t2(B * S), l2(B * S);
  s.fill(17, t1.data(), l1.data());
  again.fill(17, t2.data(), l2.data());
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(l1, l2);
}

TEST(MlmSampler, BadInputIsNamed) {
  DocShards set(1, 2, 6);
  try {
    MlmSampler s(options(set.pattern(), 64, 8, 1));
    FAIL() << "a micro-batch larger than the samples was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one micro-batch needs 64"), std::string::npos) << e.what();
  }
  MlmOptions o = options("", 2, 8, 1);
  o.rule.mask_id = 5;
  EXPECT_THROW(MlmSampler{o}, Error);
  o = options("", 2, 8, 1);
  o.rule.max_predictions = 0;
  EXPECT_THROW(MlmSampler{o}, Error);
  try {
    MlmSampler s(options(set.dir / "nothing_*.bin", 1, 8, 1));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matches no file"), std::string::npos) << e.what();
  }
}

// The plain-Python reference reads the same shards, draws the same samples and masks and must
// agree with every batch written here; it also checks the rule's statistics on its own draws.
TEST(MlmSampler, PythonReferenceAgrees) {
  if (std::system("python3 -c 'import sys' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found: skipped";
  DocShards set(2, 60, 8);
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& [B, S, seed, max_pred, shuffle, longest] :
       {std::tuple{4, 16, 11, 3, true, false}, std::tuple{3, 24, 12, 24, false, true}, std::tuple{5, 8, 0, 2, true, true}}) {
    MlmOptions o = options(set.pattern(), B, S, uint64_t(seed));
    o.rule.max_predictions = max_pred;
    o.shuffle = shuffle;
    o.pad_to_longest = longest;
    for (bool synthetic : {false, true}) {
      if (synthetic) o.patterns.clear();
      MlmSampler s(o);
      nlohmann::json c = {{"batch_size", B}, {"seq_len", S}, {"seed", seed}, {"max_predictions", max_pred},
                          {"shuffle", shuffle}, {"pad_to_longest", longest}, {"synthetic", synthetic},
                          {"mask_id", kMask}, {"pad_id", kPad}, {"random_tokens", 50256}, {"eot", kEot},
                          {"shards", synthetic ? std::vector<std::string>{} : expand_shard_patterns(o.patterns)}};
      std::vector<int32_t> t(B * S), l(B * S);
      nlohmann::json batches = nlohmann::json::array();
      for (int64_t m : {int64_t(0), int64_t(1), int64_t(7), int64_t(40)}) {
        const MlmBatchInfo info = s.fill(m, t.data(), l.data());
        batches.push_back({{"micro_batch", m},
                           {"row_len", info.row_len},
                           {"tokens", std::vector<int32_t>(t.begin(), t.begin() + B * info.row_len)},
                           {"labels", std::vector<int32_t>(l.begin(), l.begin() + B * info.row_len)}});
      }
      c["batches"] = batches;
      cases.push_back(c);
    }
  }
  const std::string dump = set.dir / "mlm_cpp.json";
  std::ofstream(dump) << cases.dump();
  const std::string cmd = "python3 " + std::string(CUTRAIN_SOURCE_DIR) + "/tests/scripts/mlm_reference.py " + dump;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace cutrain::data
