// @brief The caching allocator: segments from a raw source (cudaMalloc, cudaHostAlloc or plain
// host memory), 512 B rounding, a small pool (<= 1 MiB requests in 2 MiB segments) and a large
// pool, best-fit per stream with split and coalesce, record_stream semantics, empty_cache,
// PyTorch-like statistics and a JSON snapshot; an OOM error that explains itself.
#pragma once

#include <cuda_runtime.h>
#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace cutrain {

// Where segments come from. alloc returns nullptr when the source is exhausted (never throws
// for exhaustion); info reports total/free bytes of the underlying memory when known.
class RawSource {
 public:
  virtual ~RawSource() = default;
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void free(void* p, std::size_t bytes) = 0;
  virtual const char* name() const = 0;   // "device", "pinned", "host"
  virtual bool is_device() const = 0;     // device memory: stream/event semantics apply
  virtual void mem_info(std::size_t* free_bytes, std::size_t* total_bytes) const = 0;
};

std::unique_ptr<RawSource> make_device_source(int device = -1);   // cudaMalloc / cudaFree
std::unique_ptr<RawSource> make_pinned_source();                  // cudaHostAlloc / cudaFreeHost
// Plain host memory, optionally capped at `limit_bytes` (to test exhaustion without a GPU).
std::unique_ptr<RawSource> make_host_source(std::size_t limit_bytes = SIZE_MAX);

// {current, peak, allocated (total ever added), freed (total ever removed)}, like PyTorch's.
struct Stat {
  std::int64_t current = 0, peak = 0, allocated = 0, freed = 0;
};

struct AllocatorStats {
  Stat allocated_bytes;   // bytes in blocks handed out (after rounding)
  Stat reserved_bytes;    // bytes in segments obtained from the raw source
  Stat active_bytes;      // allocated + freed blocks still waiting on stream events
  Stat requested_bytes;   // bytes the callers asked for (before rounding)
  Stat allocation;        // count of blocks handed out
  Stat segment;           // count of segments
  Stat active;            // count of active blocks
  std::int64_t num_raw_allocs = 0, num_raw_frees = 0, num_alloc_retries = 0, num_ooms = 0;
};

class CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<RawSource> source);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (0 gives nullptr), 512-byte aligned, usable on `stream`.
  // On exhaustion: frees cached blocks, retries once, then throws OutOfMemoryError.
  void* allocate(std::size_t bytes, cudaStream_t stream = nullptr);
  void deallocate(void* p);
  // The block was used on `stream` too: on deallocate it returns to the pool only after the work
  // queued on `stream` up to now has completed.
  void record_stream(void* p, cudaStream_t stream);
  // Returns every unused cached segment to the raw source.
  void empty_cache();

  AllocatorStats stats() const;
  void reset_peak();
  nlohmann::json snapshot() const;  // segments and blocks (address, size, allocated, stream)
  const RawSource& source() const;
  std::string summary() const;       // one line: allocated / reserved / peak, human-readable

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The process-wide allocators: one per device (created on first use) and one for pinned host memory.
CachingAllocator& device_allocator(int device = -1);
CachingAllocator& pinned_allocator();

// RAII ownership of one block.
class Buffer {
 public:
  Buffer() = default;
  Buffer(CachingAllocator& a, std::size_t bytes, cudaStream_t stream = nullptr)
      : alloc_(&a), p_(a.allocate(bytes, stream)), bytes_(bytes) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept : alloc_(o.alloc_), p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; o.bytes_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = o.alloc_; p_ = o.p_; bytes_ = o.bytes_;
      o.p_ = nullptr; o.bytes_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void reset() {
    if (p_) alloc_->deallocate(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return p_; }
  template <typename T> T* as() const { return static_cast<T*>(p_); }
  std::size_t bytes() const { return bytes_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  CachingAllocator* alloc_ = nullptr;
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace cutrain
