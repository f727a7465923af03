// @brief Token shards in llm.c's .bin format: a header of 256 int32 (magic 20240520, version 1,
// token count, the rest zero) then the tokens as little-endian uint16. Shards written by llm.c's
// dev/data scripts load here and ours load there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cutrain::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderInts = 256;
inline constexpr std::size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

// Writes tokens (each 0..65535, else an error naming the index) to `path` via a temp file and a
// rename, so a reader never sees a half-written shard.
void write_shard(const std::string& path, const int32_t* tokens, std::size_t n);
inline void write_shard(const std::string& path, const std::vector<int32_t>& tokens) {
  write_shard(path, tokens.data(), tokens.size());
}

// A shard opened read-only and memory-mapped, its header and every token id checked (< vocab_size)
// on open. Errors name the file, the byte offset and the problem.
class TokenShard {
 public:
  static TokenShard open(const std::string& path, int32_t vocab_size);
  TokenShard() = default;
  ~TokenShard();
  TokenShard(TokenShard&& o) noexcept;
  TokenShard& operator=(TokenShard&& o) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  std::size_t size() const { return n_tokens_; }
  const uint16_t* tokens() const { return tokens_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  std::size_t n_tokens_ = 0;
};

}  // namespace cutrain::data
