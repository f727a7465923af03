// @brief The GPT-2 byte-level BPE tokenizer: reads encoder.json/vocab.json and vocab.bpe/merges.txt,
// encodes text to token ids and decodes them back, byte-exact for any input (invalid UTF-8 too).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cutrain::data {

inline constexpr int32_t kGpt2EndOfText = 50256;  // "<|endoftext|>" in GPT-2's vocabulary
inline constexpr int32_t kGpt2VocabSize = 50257;

// Remembers the BPE of recent pieces (words repeat a lot). One per thread: not thread-safe.
class WordCache {
 public:
  explicit WordCache(std::size_t max_entries = 1 << 18) : max_entries_(max_entries) {}
  const std::vector<int32_t>* find(std::string_view piece) const;
  void insert(std::string_view piece, std::vector<int32_t> ids);
  std::size_t size() const { return map_.size(); }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::size_t max_entries_;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map_;
};

class Gpt2Tokenizer {
 public:
  // vocab: JSON object token -> id (GPT-2's encoder.json / HF vocab.json); merges: "a b" per line,
  // rank = line order, an optional "#version" first line. Errors name the file and line/token.
  static Gpt2Tokenizer from_files(const std::string& vocab_path, const std::string& merges_path);

  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  // The id of "<|endoftext|>" (50256 for GPT-2); throws if the vocabulary has none.
  int32_t eot_id() const;

  // Appends the ids of `text` to `out`. The text is plain text: "<|endoftext|>" inside it is
  // encoded as ordinary characters; separators are the caller's (encode_documents) business.
  void encode(std::string_view text, std::vector<int32_t>& out, WordCache* cache = nullptr) const;
  std::vector<int32_t> encode(std::string_view text) const;
  // BPE of one pre-tokenized piece (appended to out).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::string decode(const int32_t* ids, std::size_t n) const;
  std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }
  // The raw bytes a token stands for.
  const std::string& token_bytes(int32_t id) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  const Merge* find_merge(int32_t a, int32_t b) const;

  std::vector<std::string> token_bytes_;             // id -> bytes
  std::unordered_map<std::string, int32_t> by_bytes_;  // bytes -> id
  std::unordered_map<uint64_t, Merge> merges_;        // (left id, right id) -> rank, merged id
  int32_t byte_id_[256] = {};                        // id of each single byte
  int32_t eot_ = -1;
};

}  // namespace cutrain::data
