#include "runtime/aio/aio_file.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cuda_runtime.h>

#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace cutrain::aio {
namespace {

constexpr std::size_t kAlign = AioHandle::get_alignment();

// Two aligned staging chunks: pinned (the handle's locked tensors) with a GPU, else page-aligned
// host memory (CPU-only machines; O_DIRECT needs alignment, not page locking).
class Staging {
 public:
  Staging(AioHandle& h, std::size_t bytes) : h_(h), pinned_(gpu_available()) {
    for (auto& b : buf_) {
      b = pinned_ ? h_.new_cpu_locked_tensor(bytes) : std::aligned_alloc(kAlign, bytes);
      CUTRAIN_CHECK(b != nullptr, "aio file staging: cannot allocate a ", bytes, "-byte aligned chunk");
    }
  }
  ~Staging() {
    for (auto* b : buf_) {
      if (!b) continue;
      if (pinned_) h_.free_cpu_locked_tensor(b);
      else std::free(b);
    }
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  char* operator[](int i) const { return static_cast<char*>(buf_[i]); }

 private:
  AioHandle& h_;
  bool pinned_;
  void* buf_[2] = {nullptr, nullptr};
};

void check_chunk(std::size_t chunk) {
  CUTRAIN_CHECK(chunk >= kAlign && chunk % kAlign == 0, "aio file: chunk size must be a positive multiple of ", kAlign,
                " bytes, got ", chunk);
}

}  // namespace

void write_file_atomic(AioHandle& h, const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces,
                       std::size_t chunk, Xxh64* sum) {
  check_chunk(chunk);
  AtomicFileWriter w(path);  // the temp name; removed again if anything below throws
  const std::string tmp = w.temp_path().string();
  Staging buf(h, chunk);
  int cur = 0;
  bool inflight = false;
  std::uint64_t off = 0;
  std::size_t fill = 0;
  try {
    // Chunk k goes out at offset k * chunk (aligned); filling the next chunk overlaps its write.
    auto flush = [&] {
      if (sum) sum->update(buf[cur], fill);  // while the other chunk's write runs, from cache
      if (inflight) h.wait();  // the other chunk's write: that buffer is filled next
      h.async_pwrite(buf[cur], fill, tmp, static_cast<std::int64_t>(off));
      inflight = true;
      off += fill;
      fill = 0;
      cur ^= 1;
    };
    for (const auto& p : pieces) {
      const std::byte* src = p.data();
      std::size_t left = p.size();
      while (left > 0) {
        const std::size_t n = std::min(left, chunk - fill);
        std::memcpy(buf[cur] + fill, src, n);
        fill += n;
        src += n;
        left -= n;
        if (fill == chunk) flush();
      }
    }
    if (fill > 0) flush();
    if (inflight) h.wait();
  } catch (...) {
    try {
      h.wait();  // nothing may still write into the staging (or the temp file) once we unwind
    } catch (...) {
    }
    throw;
  }
  w.commit();  // fsync (covers the data the handle wrote through its own descriptors), rename, fsync the folder
}

std::pair<std::uint64_t, std::uint64_t> read_ranges(AioHandle& h, const std::filesystem::path& path,
                                                    std::span<const FileRange> ranges, std::size_t chunk, Xxh64* sum) {
  check_chunk(chunk);
  std::vector<FileRange> rs;
  for (const auto& r : ranges)
    if (r.bytes > 0) rs.push_back(r);
  if (rs.empty()) return {0, 0};
  std::sort(rs.begin(), rs.end(), [](const FileRange& a, const FileRange& b) { return a.offset < b.offset; });
  std::uint64_t hi = 0;
  for (const auto& r : rs) hi = std::max<std::uint64_t>(hi, r.offset + r.bytes);
  const std::uint64_t lo = rs.front().offset / kAlign * kAlign;
  const std::uint64_t nchunks = (hi - lo + chunk - 1) / chunk;
  const std::string file = path.string();
  Staging buf(h, chunk);
  auto len_of = [&](std::uint64_t k) { return static_cast<std::size_t>(std::min<std::uint64_t>(chunk, hi - lo - k * chunk)); };
  std::size_t first = 0;  // the first range not yet completely copied out
  try {
    h.async_pread(buf[0], len_of(0), file, static_cast<std::int64_t>(lo));
    h.wait();
    for (std::uint64_t k = 0; k < nchunks; ++k) {
      // The next chunk's read overlaps copying this one out.
      if (k + 1 < nchunks) h.async_pread(buf[(k + 1) % 2], len_of(k + 1), file, static_cast<std::int64_t>(lo + (k + 1) * chunk));
      const std::uint64_t cs = lo + k * chunk, ce = cs + len_of(k);
      const char* data = buf[k % 2];
      if (sum) sum->update(data, ce - cs);
      for (std::size_t i = first; i < rs.size() && rs[i].offset < ce; ++i) {
        const std::uint64_t b = std::max(cs, rs[i].offset), e = std::min(ce, rs[i].offset + rs[i].bytes);
        if (b >= e) {
        } else if (rs[i].device) {
          // Synchronous: the chunk is read into again once this returns.
          CUTRAIN_CUDA_CHECK(cudaMemcpy(static_cast<char*>(rs[i].dst) + (b - rs[i].offset), data + (b - cs), e - b,
                                        cudaMemcpyHostToDevice));
        } else {
          std::memcpy(static_cast<char*>(rs[i].dst) + (b - rs[i].offset), data + (b - cs), e - b);
        }
        if (i == first && rs[i].offset + rs[i].bytes <= ce) ++first;
      }
      h.wait();
    }
  } catch (...) {
    try {
      h.wait();
    } catch (...) {
    }
    throw;
  }
  return {lo, hi};
}

}  // namespace cutrain::aio
