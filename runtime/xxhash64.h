// @brief XXH64, the 64-bit xxHash (Yann Collet's specification, seed 0 by default): the checksum
// of checkpoint files. Portable C++ (no intrinsics), several GB/s per core, so checking a file
// costs less than reading it from disk; `xxh64sum` (Debian package xxhash) and Python's
// `xxhash.xxh64` compute the same value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace cutrain {

// Streaming: update() any number of times with pieces of any size, digest() the whole.
class Xxh64 {
 public:
  explicit Xxh64(std::uint64_t seed = 0);
  void update(const void* data, std::size_t bytes);
  std::uint64_t digest() const;

 private:
  std::uint64_t v_[4];
  std::uint64_t seed_;
  std::uint64_t total_ = 0;
  unsigned char buf_[32];
  std::size_t buffered_ = 0;
};

std::uint64_t xxh64(const void* data, std::size_t bytes, std::uint64_t seed = 0);
// 16 lowercase hex digits (what xxh64sum prints).
std::string xxh64_hex(std::uint64_t h);

struct FileDigest {
  std::uint64_t bytes = 0;
  std::uint64_t xxh64 = 0;
};
// Reads the whole file (4 MiB pieces); errors name the path.
FileDigest xxh64_file(const std::filesystem::path& path);

}  // namespace cutrain
