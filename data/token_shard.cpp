#include "data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "runtime/error.h"

namespace cutrain::data {
namespace {

// The .bin format is little-endian; so is every machine this runs on (x86-64, aarch64).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token shards are little-endian");

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    CUTRAIN_CHECK(w > 0, "token shard '", path, "': write failed: ", std::strerror(errno));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

void write_shard(const std::string& path, const int32_t* tokens, std::size_t n) {
  CUTRAIN_CHECK(n <= std::size_t(INT32_MAX), "token shard '", path, "': ", n,
                " tokens do not fit the header's int32 count");
  std::vector<uint16_t> body(n);
  for (std::size_t i = 0; i < n; ++i) {
    CUTRAIN_CHECK(tokens[i] >= 0 && tokens[i] <= 65535, "token shard '", path, "': token ", i, " is ",
                  tokens[i], ", expected 0..65535 (the format stores uint16)");
    body[i] = static_cast<uint16_t>(tokens[i]);
  }
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(n);

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CUTRAIN_CHECK(fd >= 0, "token shard '", path, "': cannot create '", tmp, "': ", std::strerror(errno));
  try {
    write_all(fd, header, sizeof(header), path);
    write_all(fd, body.data(), body.size() * sizeof(uint16_t), path);
    CUTRAIN_CHECK(::fsync(fd) == 0, "token shard '", path, "': fsync failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  const int close_rc = ::close(fd);
  if (close_rc != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    CUTRAIN_FAIL("token shard '", path, "': cannot finish writing (close/rename): ", std::strerror(err));
  }
}

TokenShard TokenShard::open(const std::string& path, int32_t vocab_size) {
  TokenShard s;
  s.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  CUTRAIN_CHECK(fd >= 0, "token shard '", path, "': cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    CUTRAIN_FAIL("token shard '", path, "': cannot stat: ", std::strerror(err));
  }
  const std::size_t bytes = static_cast<std::size_t>(st.st_size);
  if (bytes < kShardHeaderBytes) {
    ::close(fd);
    CUTRAIN_FAIL("token shard '", path, "' at offset ", bytes, ": truncated header (file has ", bytes,
                 " bytes, the header needs ", kShardHeaderBytes, ")");
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  CUTRAIN_CHECK(map != MAP_FAILED, "token shard '", path, "': mmap failed: ", std::strerror(map_err));
  s.map_ = map;
  s.map_bytes_ = bytes;  // from here on the destructor unmaps, also when a check below throws

  int32_t header[3];
  std::memcpy(header, map, sizeof(header));
  CUTRAIN_CHECK(header[0] == kShardMagic, "token shard '", path, "' at offset 0: magic is ", header[0],
                ", expected ", kShardMagic, " (llm.c .bin format)");
  CUTRAIN_CHECK(header[1] == kShardVersion, "token shard '", path, "' at offset 4: version is ", header[1],
                ", expected ", kShardVersion, " (uint16 tokens)");
  CUTRAIN_CHECK(header[2] >= 0, "token shard '", path, "' at offset 8: token count is ", header[2],
                ", expected >= 0");
  const std::size_t n = static_cast<std::size_t>(header[2]);
  const std::size_t want = kShardHeaderBytes + n * sizeof(uint16_t);
  CUTRAIN_CHECK(bytes >= want, "token shard '", path, "' at offset ", bytes, ": truncated: the header says ", n,
                " tokens (", want, " bytes) but the file ends after ", bytes, " bytes");
  CUTRAIN_CHECK(bytes == want, "token shard '", path, "' at offset ", want, ": ", bytes - want,
                " trailing bytes after the ", n, " tokens the header announces");
  s.tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) + kShardHeaderBytes);
  s.n_tokens_ = n;
  for (std::size_t i = 0; i < n; ++i) {
    if (s.tokens_[i] >= vocab_size)
      CUTRAIN_FAIL("token shard '", path, "' at offset ", kShardHeaderBytes + i * sizeof(uint16_t), " (token ", i,
                   "): token id ", s.tokens_[i], " >= vocab size ", vocab_size);
  }
  return s;
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

TokenShard::TokenShard(TokenShard&& o) noexcept
    : path_(std::move(o.path_)), map_(std::exchange(o.map_, nullptr)), map_bytes_(std::exchange(o.map_bytes_, 0)),
      tokens_(std::exchange(o.tokens_, nullptr)), n_tokens_(std::exchange(o.n_tokens_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& o) noexcept {
  std::swap(path_, o.path_);
  std::swap(map_, o.map_);
  std::swap(map_bytes_, o.map_bytes_);
  std::swap(tokens_, o.tokens_);
  std::swap(n_tokens_, o.n_tokens_);
  return *this;
}

}  // namespace cutrain::data
