// The GPT-2 tokenizer: byte map, UTF-8, the pre-tokenizer, BPE against an independent naive
// implementation, golden ids from HF tokenizers + Python regex (scripts/gen_tokenizer_golden.py),
// round trips on random bytes, WikiText-2, and multi-threaded encoding.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "data/byte_unicode.h"
#include "data/documents.h"
#include "data/encode_documents.h"
#include "data/pretokenize.h"
#include "data/utf8.h"
#include "tests/support/test_support.h"
#include "tests/unit/data_test_util.h"

namespace cutrain::data {
namespace {

using test::gpt2;

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for (auto p : pretokenize(text)) out.emplace_back(p);
  return out;
}

std::string random_bytes(std::mt19937_64& rng, std::size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

// Text biased to the pre-tokenizer's corner cases: spaces, apostrophes, digits, multi-byte chars,
// Unicode whitespace, plus raw random bytes (invalid UTF-8).
std::string random_tricky_text(std::mt19937_64& rng, std::size_t n_atoms) {
  static const std::vector<std::string> atoms = {" ", "  ", "\n", "\t", "\r\n", "'", "'s", "'ll", "'re", "a", "Q",
                                                 "ing", "1", "42", "é", "ß", "中", "😀", "\xC2\xA0", "\xE3\x80\x80",
                                                 "\xE2\x80\x89", "!", "?!", ".", "-", "\x1e", "\xD9\xA3"};
  std::string s;
  for (std::size_t i = 0; i < n_atoms; ++i) {
    const auto r = rng() % 100;
    if (r < 80) s += atoms[rng() % atoms.size()];
    else if (r < 90) s += random_bytes(rng, 1 + rng() % 3);
    else s += utf8(static_cast<uint32_t>(0xA0 + rng() % 0xD000));
  }
  return s;
}

// ---------------------------------------------------------------------------- byte map, UTF-8

TEST(ByteUnicode, IsABijectionWithPrintableBytesKept) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_to_unicode()[b];
    EXPECT_TRUE(seen.insert(cp).second) << "byte " << b;
    EXPECT_EQ(unicode_to_byte(cp), b);
    if (b >= '!' && b <= '~') {
      EXPECT_EQ(cp, uint32_t(b));
    }
  }
  EXPECT_EQ(byte_to_unicode()[' '], 0x120u);  // 'Ġ'
  EXPECT_EQ(byte_to_unicode()['\n'], 0x10Au);  // 'Ċ'
  EXPECT_EQ(*seen.rbegin(), 0x143u);
  EXPECT_EQ(unicode_to_byte(0x144), -1);
  EXPECT_EQ(unicode_to_byte(0x4E2D), -1);
}

TEST(Utf8, DecodesValidAndRejectsInvalidOneByteAtATime) {
  for (uint32_t cp : {0x41u, 0xE9u, 0x7FFu, 0x800u, 0x4E2Du, 0xFFFDu, 0x10000u, 0x1F600u, 0x10FFFFu}) {
    const std::string s = utf8(cp);
    const Decoded d = decode_utf8(s, 0);
    EXPECT_EQ(d.cp, cp);
    EXPECT_EQ(d.len, s.size());
  }
  for (const std::string& bad : {std::string("\xC0\x80"), std::string("\xC1\xBF"), std::string("\xED\xA0\x80"),
                                std::string("\xE0\x80\x80"), std::string("\xF4\x90\x80\x80"), std::string("\xF5\x80"),
                                std::string("\x80"), std::string("\xE2\x82"), std::string("\xF0\x9F\x98")}) {
    const Decoded d = decode_utf8(bad, 0);
    EXPECT_EQ(d.cp, kInvalidCodepoint) << "bytes " << bad.size();
    EXPECT_EQ(d.len, 1u);
  }
}

TEST(Utf8, ClassesFollowRegexSemantics) {
  EXPECT_EQ(classify('a'), CharClass::kLetter);
  EXPECT_EQ(classify(0x4E2D), CharClass::kLetter);   // 中
  EXPECT_EQ(classify(0x01C5), CharClass::kLetter);   // ǅ (Lt)
  EXPECT_EQ(classify(0x02B0), CharClass::kLetter);   // ʰ (Lm)
  EXPECT_EQ(classify('7'), CharClass::kNumber);
  EXPECT_EQ(classify(0x0663), CharClass::kNumber);   // ٣ (Nd)
  EXPECT_EQ(classify(0x2167), CharClass::kNumber);   // Ⅷ (Nl)
  EXPECT_EQ(classify(0x00BD), CharClass::kNumber);   // ½ (No)
  for (uint32_t s : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u,
                     0x2029u, 0x202Fu, 0x205Fu, 0x3000u})
    EXPECT_EQ(classify(s), CharClass::kSpace) << std::hex << s;
  // regex's \s is White_Space: the information separators are not in it (Python's isspace says yes).
  for (uint32_t o : {0x1Cu, 0x1Du, 0x1Eu, 0x1Fu, 0x200Bu, 0x21u, 0x27u, 0x0301u, 0x1F600u, kInvalidCodepoint})
    EXPECT_EQ(classify(o), CharClass::kOther) << std::hex << o;
}

// ---------------------------------------------------------------------------- pre-tokenizer

TEST(Pretokenize, SplitsLikeGpt2Pattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("don't we'll they're I'm"), (V{"don", "'t", " we", "'ll", " they", "'re", " I", "'m"}));
  EXPECT_EQ(pieces("DON'T"), (V{"DON", "'", "T"}));  // contractions are case-sensitive
  EXPECT_EQ(pieces(" 's"), (V{" '", "s"}));
  EXPECT_EQ(pieces("''s"), (V{"''", "s"}));
  EXPECT_EQ(pieces("a   b"), (V{"a", "  ", " b"}));  // the last space goes with the word
  EXPECT_EQ(pieces("a\nb"), (V{"a", "\n", "b"}));
  EXPECT_EQ(pieces("a \n b"), (V{"a", " \n", " b"}));
  EXPECT_EQ(pieces("x  "), (V{"x", "  "}));  // a run at the end stays whole
  EXPECT_EQ(pieces("abc123 456!?  ?"), (V{"abc", "123", " 456", "!?", " ", " ?"}));
  EXPECT_EQ(pieces(" \xC2\xA0x"), (V{" ", "\xC2\xA0", "x"}));  // NBSP is \s but not the optional ' '
  EXPECT_EQ(pieces("caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87"), (V{"caf\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87"}));
  EXPECT_EQ(pieces("\x1e\x1e a"), (V{"\x1e\x1e", " a"}));  // U+001E is not \s for regex
  EXPECT_EQ(pieces("\xFF\xFE" "ab"), (V{"\xFF\xFE", "ab"}));  // invalid bytes: a run of "other"
  EXPECT_TRUE(pieces("").empty());
}

TEST(Pretokenize, PiecesConcatenateToTheInputOnRandomBytes) {
  auto rng = test::fresh_rng();
  for (int i = 0; i < 300; ++i) {
    const std::string s = i % 2 ? random_bytes(rng, 1 + rng() % 200) : random_tricky_text(rng, 1 + rng() % 60);
    std::string joined;
    for (auto p : pretokenize(s)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s);
  }
}

// ---------------------------------------------------------------------------- BPE

// GPT-2's bpe() written the slow, obvious way over the files' spelled tokens: an independent check
// of the heap-based merge order in Gpt2Tokenizer::encode_piece.
class NaiveGpt2 {
 public:
  NaiveGpt2() {
    const auto j = nlohmann::json::parse(test::slurp(test::vocab_path()));
    for (const auto& [k, v] : j.items()) encoder_[k] = v.get<int32_t>();
    const std::string merges = test::slurp(test::merges_path());
    std::istringstream in(merges);
    std::string line;
    std::getline(in, line);  // #version
    int rank = 0;
    while (std::getline(in, line)) {
      const auto sp = line.find(' ');
      if (sp == std::string::npos) continue;
      ranks_[{line.substr(0, sp), line.substr(sp + 1)}] = rank++;
    }
  }
  std::vector<int32_t> bpe(std::string_view piece) const {
    std::vector<std::string> parts;
    for (unsigned char b : piece) parts.push_back(utf8(byte_to_unicode()[b]));
    while (parts.size() > 1) {
      int best = INT32_MAX;
      std::pair<std::string, std::string> best_pair;
      for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
        const auto it = ranks_.find({parts[i], parts[i + 1]});
        if (it != ranks_.end() && it->second < best) {
          best = it->second;
          best_pair = it->first;
        }
      }
      if (best == INT32_MAX) break;
      std::vector<std::string> merged;
      for (std::size_t i = 0; i < parts.size();) {
        if (i + 1 < parts.size() && parts[i] == best_pair.first && parts[i + 1] == best_pair.second) {
          merged.push_back(parts[i] + parts[i + 1]);
          i += 2;
        } else {
          merged.push_back(parts[i++]);
        }
      }
      parts = std::move(merged);
    }
    std::vector<int32_t> ids;
    for (const auto& p : parts) ids.push_back(encoder_.at(p));
    return ids;
  }

 private:
  std::map<std::string, int32_t> encoder_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
};

TEST(Gpt2Tokenizer, LoadsTheStandardFiles) {
  CUTRAIN_REQUIRE_GPT2_DATA();
  EXPECT_EQ(gpt2().vocab_size(), kGpt2VocabSize);
  EXPECT_EQ(gpt2().eot_id(), kGpt2EndOfText);
  EXPECT_EQ(gpt2().token_bytes(kGpt2EndOfText), "<|endoftext|>");
  EXPECT_EQ(gpt2().token_bytes(995), " world");
  EXPECT_THROW(gpt2().token_bytes(kGpt2VocabSize), Error);
  EXPECT_THROW(gpt2().token_bytes(-1), Error);
}

TEST(Gpt2Tokenizer, KnownIds) {
  CUTRAIN_REQUIRE_GPT2_DATA();
  EXPECT_EQ(gpt2().encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(gpt2().encode(""), std::vector<int32_t>{});
  // Special tokens in the text are plain text: EOT only comes from encode_documents.
  const auto eot_text = gpt2().encode("<|endoftext|>");
  EXPECT_GT(eot_text.size(), 1u);
  EXPECT_EQ(std::count(eot_text.begin(), eot_text.end(), kGpt2EndOfText), 0);
}

TEST(Gpt2Tokenizer, HeapBpeMatchesNaiveBpeOnRandomPieces) {
  CUTRAIN_REQUIRE_GPT2_DATA();
  static const NaiveGpt2 naive;
  auto rng = test::fresh_rng();
  std::vector<std::string> words;
  for (int i = 0; i < 200; ++i) {
    const std::string text = random_tricky_text(rng, 1 + rng() % 30);  // outlives the views into it
    for (auto p : pretokenize(text)) words.emplace_back(p);
  }
  // Repetitive pieces stress the "merge all occurrences, then look again" order.
  for (const char* unit : {"a", "aa", "ab", " ", "1", "12", "=", "😀", "\xFF"})
    for (int reps : {2, 3, 5, 8, 13, 31}) {
      std::string w;
      for (int r = 0; r < reps; ++r) w += unit;
      words.push_back(w);
    }
  const std::string wiki = std::filesystem::exists(test::wikitext_path("valid")) ? test::slurp(test::wikitext_path("valid")) : "";
  for (auto p : pretokenize(std::string_view(wiki).substr(0, 100000))) words.emplace_back(p);
  for (const auto& w : words) {
    std::vector<int32_t> ours;
    gpt2().encode_piece(w, ours);
    ASSERT_EQ(ours, naive.bpe(w)) << "piece of " << w.size() << " bytes";
  }
}

TEST(Gpt2Tokenizer, MatchesGoldenIds) {
  CUTRAIN_REQUIRE_GPT2_DATA();
  const auto golden = nlohmann::json::parse(test::slurp(std::string(CUTRAIN_SOURCE_DIR) + "/tests/data/gpt2_tokenizer_golden.json"));
  ASSERT_GT(golden["cases"].size(), 300u);
  WordCache cache;
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(gpt2().encode(text), want) << "text: " << c["text"].dump();
    std::vector<int32_t> cached;  // through a shared cache too: a hit must give the same ids
    gpt2().encode(text, cached, &cache);
    gpt2().encode(text, cached, &cache);
    std::vector<int32_t> twice = want;
    twice.insert(twice.end(), want.begin(), want.end());
    EXPECT_EQ(cached, twice);
    EXPECT_EQ(gpt2().decode(want), text);
  }
}

TEST(Gpt2Tokenizer, RoundTripsRandomBytesAndText) {
  CUTRAIN_REQUIRE_GPT2_DATA();
  auto rng = test::fresh_rng();
  WordCache cache;
  for (int i = 0; i < 500; ++i) {
    const std::string s = i % 2 ? random_bytes(rng, rng() % 300) : random_tricky_text(rng, rng() % 80);
    std::vector<int32_t> ids;
    gpt2().encode(s, ids, &cache);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < kGpt2VocabSize);
    ASSERT_EQ(gpt2().decode(ids), s);
  }
}

TEST(Gpt2Tokenizer, LongPiecesStayFastAndExact) {
  CUTRAIN_REQUIRE_GPT2_DATA();
  for (const char* unit : {"a", " ", "9", "ab", "\xE4\xB8\xAD"}) {
    std::string s;
    ASSERT_NE(unit, nullptr);
    while (s.size() < 200000) s += unit;
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = gpt2().encode(s);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(gpt2().decode(ids), s);
    EXPECT_LT(secs, 5.0) << "a 200 kB piece of '" << unit << "' took " << secs << " s (quadratic BPE?)";
  }
}

TEST(Gpt2Tokenizer, WikiText2MatchesGoldenCountHashAndPrefix) {
  CUTRAIN_REQUIRE_GPT2_DATA();
  const auto golden = nlohmann::json::parse(test::slurp(std::string(CUTRAIN_SOURCE_DIR) + "/tests/data/gpt2_tokenizer_golden.json"));
  for (const char* split_name : {"valid", "test"}) {
    const std::string split = split_name;
    if (!std::filesystem::exists(test::wikitext_path(split))) GTEST_SKIP() << "WikiText-2 " << split << " not found: skipped";
    const std::string text = test::slurp(test::wikitext_path(split));
    const auto& g = golden["wikitext2"][split];
    ASSERT_EQ(text.size(), g["bytes"].get<std::size_t>()) << "a different " << split << ".txt than the golden file's";
    const auto ids = gpt2().encode(text);
    const auto first = g["first"].get<std::vector<int32_t>>();
    ASSERT_GE(ids.size(), first.size());
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + first.size()), first);
    EXPECT_EQ(ids.size(), g["count"].get<std::size_t>());
    uint64_t h = 0xCBF29CE484222325ull;
    for (int32_t t : ids)
      for (int k = 0; k < 4; ++k) h = (h ^ ((uint32_t(t) >> (8 * k)) & 0xFF)) * 0x100000001B3ull;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
    EXPECT_EQ(std::string(hex), g["fnv1a64"].get<std::string>()) << split;
    EXPECT_EQ(gpt2().decode(ids), text);
  }
}

// ---------------------------------------------------------------------------- documents

TEST(SplitDocuments, WikiTextHeadingsStartDocuments) {
  EXPECT_TRUE(is_wikitext_heading(" = Homarus gammarus = \n"));
  EXPECT_FALSE(is_wikitext_heading(" = = Taxonomy = = \n"));
  EXPECT_FALSE(is_wikitext_heading(" = = = Deep = = = "));
  EXPECT_FALSE(is_wikitext_heading(" x = y = z"));
  EXPECT_FALSE(is_wikitext_heading(" =  = "));
  const std::string text =
      " \n = A = \n \n First para .\n \n = = Sub = = \n \n More .\n \n = B = \n \n Second .\n";
  const auto docs = split_documents(text, SplitMode::kAuto);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], " = A = \n \n First para .\n \n = = Sub = = \n \n More .\n");
  EXPECT_EQ(docs[1], " = B = \n \n Second .\n");
  const auto paras = split_documents(text, SplitMode::kParagraphs);
  ASSERT_EQ(paras.size(), 6u);
  EXPECT_EQ(paras[1], " First para .\n");
  ASSERT_EQ(split_documents(text, SplitMode::kNone).size(), 1u);
  EXPECT_TRUE(split_documents(" \n\n \n", SplitMode::kNone).empty());
}

TEST(SplitDocuments, WithoutHeadingsAutoSplitsParagraphs) {
  const std::string text = "one\ntwo\n\n\nthree\r\n\r\nfour";
  const auto docs = split_documents(text, SplitMode::kAuto);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "one\ntwo\n");
  EXPECT_EQ(docs[1], "three\r\n");
  EXPECT_EQ(docs[2], "four");
  EXPECT_THROW(parse_split_mode("chapters"), Error);
  EXPECT_EQ(parse_split_mode("headings"), SplitMode::kHeadings);
}

TEST(SplitDocuments, WikiText2ValidHasItsArticles) {
  if (!std::filesystem::exists(test::wikitext_path("valid"))) GTEST_SKIP() << "WikiText-2 valid not found: skipped";
  const std::string text = test::slurp(test::wikitext_path("valid"));
  const auto docs = split_documents(text, SplitMode::kAuto);
  std::size_t headings = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t eol = std::min(text.find('\n', pos), text.size());
    headings += is_wikitext_heading(std::string_view(text).substr(pos, eol - pos));
    pos = eol + 1;
  }
  EXPECT_GT(headings, 50u);
  EXPECT_EQ(docs.size(), headings);
  for (auto d : docs) EXPECT_TRUE(is_wikitext_heading(d.substr(0, d.find('\n'))));
}

TEST(EncodeDocuments, SameStreamForEveryThreadCount) {
  CUTRAIN_REQUIRE_GPT2_DATA();
  if (!std::filesystem::exists(test::wikitext_path("valid"))) GTEST_SKIP() << "WikiText-2 valid not found: skipped";
  const std::string text = test::slurp(test::wikitext_path("valid"));
  // Doubled so there are several 1 MiB chunks for the threads to share.
  const std::string twice = text + text;
  const auto docs = split_documents(twice, SplitMode::kAuto);
  ASSERT_GT(docs.size(), 100u);
  std::size_t doc_bytes = 0;
  std::vector<int32_t> serial;
  for (auto d : docs) {
    doc_bytes += d.size();
    serial.push_back(kGpt2EndOfText);
    const auto ids = gpt2().encode(d);
    serial.insert(serial.end(), ids.begin(), ids.end());
  }
  for (int threads : {1, 2, 3, 7}) {
    EncodeOptions opt;
    opt.threads = threads;
    std::size_t last_done = 0;
    bool finished = false;
    opt.progress = [&](std::size_t done, std::size_t total) {
      EXPECT_GE(done, last_done);
      EXPECT_EQ(total, doc_bytes);
      last_done = done;
      finished = finished || done == total;
    };
    EXPECT_EQ(encode_documents(gpt2(), docs, opt), serial) << threads << " threads";
    EXPECT_TRUE(finished);
  }
}

}  // namespace
}  // namespace cutrain::data
