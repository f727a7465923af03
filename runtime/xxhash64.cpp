#include "runtime/xxhash64.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/file_util.h"

namespace cutrain {
namespace {

constexpr std::uint64_t P1 = 11400714785074694791ULL;
constexpr std::uint64_t P2 = 14029467366897019727ULL;
constexpr std::uint64_t P3 = 1609587929392839161ULL;
constexpr std::uint64_t P4 = 9650029242287828579ULL;
constexpr std::uint64_t P5 = 2870177450012600261ULL;

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline std::uint64_t read64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts (x86-64, aarch64)
  return v;
}
inline std::uint32_t read32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline std::uint64_t round(std::uint64_t acc, std::uint64_t input) { return rotl(acc + input * P2, 31) * P1; }
inline std::uint64_t merge(std::uint64_t h, std::uint64_t v) { return (h ^ round(0, v)) * P1 + P4; }

}  // namespace

Xxh64::Xxh64(std::uint64_t seed) : v_{seed + P1 + P2, seed + P2, seed, seed - P1}, seed_(seed) {}

void Xxh64::update(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += bytes;
  if (buffered_ + bytes < 32) {
    if (bytes) std::memcpy(buf_ + buffered_, p, bytes);
    buffered_ += bytes;
    return;
  }
  if (buffered_) {
    const std::size_t fill = 32 - buffered_;
    std::memcpy(buf_ + buffered_, p, fill);
    for (int i = 0; i < 4; ++i) v_[i] = round(v_[i], read64(buf_ + 8 * i));
    p += fill;
    bytes -= fill;
    buffered_ = 0;
  }
  std::uint64_t v0 = v_[0], v1 = v_[1], v2 = v_[2], v3 = v_[3];
  for (; bytes >= 32; p += 32, bytes -= 32) {
    v0 = round(v0, read64(p));
    v1 = round(v1, read64(p + 8));
    v2 = round(v2, read64(p + 16));
    v3 = round(v3, read64(p + 24));
  }
  v_[0] = v0, v_[1] = v1, v_[2] = v2, v_[3] = v3;
  if (bytes) std::memcpy(buf_, p, bytes);
  buffered_ = bytes;
}

std::uint64_t Xxh64::digest() const {
  std::uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (std::uint64_t v : v_) h = merge(h, v);
  } else {
    h = seed_ + P5;
  }
  h += total_;
  const unsigned char* p = buf_;
  std::size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round(0, read64(p)), 27) * P1 + P4;
  if (n >= 4) {
    h = rotl(h ^ (std::uint64_t(read32(p)) * P1), 23) * P2 + P3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) h = rotl(h ^ (std::uint64_t(*p) * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

std::uint64_t xxh64(const void* data, std::size_t bytes, std::uint64_t seed) {
  Xxh64 x(seed);
  x.update(data, bytes);
  return x.digest();
}

std::string xxh64_hex(std::uint64_t h) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[std::size_t(i)] = kDigits[h & 15];
  return s;
}

FileDigest xxh64_file(const std::filesystem::path& path) {
  ReadOnlyFile f(path);
  std::vector<unsigned char> buf(std::size_t(4) << 20);
  Xxh64 x;
  for (std::uint64_t off = 0; off < f.size();) {
    const std::size_t n = std::size_t(std::min<std::uint64_t>(buf.size(), f.size() - off));
    f.read_at(off, buf.data(), n);
    x.update(buf.data(), n);
    off += n;
  }
  return {f.size(), x.digest()};
}

}  // namespace cutrain
