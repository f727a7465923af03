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
//
// The source also owns the events behind record_stream: the device and pinned sources use real
// CUDA events, the host source (CPU tests) simulated ones whose completion a test controls. The
// allocator treats a cudaStream_t only as an opaque key, so the same logic runs everywhere.
class RawSource {
 public:
  virtual ~RawSource() = default;
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void free(void* p, std::size_t bytes) = 0;
  virtual const char* name() const = 0;   // "device", "pinned", "host"
  virtual bool is_device() const = 0;     // device memory (cudaMalloc); false for host memory
  virtual void mem_info(std::size_t* free_bytes, std::size_t* total_bytes) const = 0;

  // Opaque event handles: created once, recorded and queried many times (the allocator pools
  // them), destroyed once. record_event marks "the work queued on `stream` up to now".
  virtual void* create_event() = 0;
  virtual void record_event(void* event, cudaStream_t stream) = 0;
  virtual bool query_event(void* event) = 0;        // true when complete
  virtual void synchronize_event(void* event) = 0;  // blocks until complete
  virtual void destroy_event(void* event) = 0;
};

std::unique_ptr<RawSource> make_device_source(int device = -1);   // cudaMalloc / cudaFree
std::unique_ptr<RawSource> make_pinned_source();                  // cudaHostAlloc / cudaFreeHost
// Plain host memory, optionally capped at `limit_bytes` (to test exhaustion without a GPU).
// runtime/host_source.h has the concrete class, whose simulated events a test can complete.
std::unique_ptr<RawSource> make_host_source(std::size_t limit_bytes = SIZE_MAX);

// The pool rules (PyTorch's): every size is rounded up to kMinBlockSize; requests of at most
// kSmallSize come from the small pool, whose segments are kSmallBuffer; larger requests under
// kMinLargeAlloc get kLargeBuffer segments, bigger ones a segment rounded up to kRoundLarge.
// A large-pool block is split only when the remainder exceeds kSmallSize.
namespace alloc_rules {
inline constexpr std::size_t kMinBlockSize = 512;
inline constexpr std::size_t kSmallSize = std::size_t{1} << 20;
inline constexpr std::size_t kSmallBuffer = std::size_t{2} << 20;
inline constexpr std::size_t kLargeBuffer = std::size_t{20} << 20;
inline constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;
inline constexpr std::size_t kRoundLarge = std::size_t{2} << 20;
}  // namespace alloc_rules

struct AllocatorOptions {
  // Cached blocks of at least this size are "oversize": never split, and handed only to requests
  // that are oversize too and waste at most kLargeBuffer (PyTorch's max_split_size_mb).
  std::size_t max_split_size = SIZE_MAX;
  // Every block size (and so every block address) is a multiple of this: a power of two from
  // kMinBlockSize (512) to 2 MiB. The pinned allocator uses 4096 so its blocks suit O_DIRECT.
  std::size_t alignment = alloc_rules::kMinBlockSize;
};

// {current, peak, allocated (total ever added), freed (total ever removed)}, like PyTorch's.
struct Stat {
  std::int64_t current = 0, peak = 0, allocated = 0, freed = 0;
};

struct AllocatorStats {
  Stat allocated_bytes;   // bytes in blocks handed out (after rounding)
  Stat reserved_bytes;    // bytes in segments obtained from the raw source
  Stat active_bytes;      // allocated + freed blocks still waiting on stream events
  Stat requested_bytes;   // bytes the callers asked for (before rounding), of active blocks
  Stat allocation;        // count of blocks handed out
  Stat segment;           // count of segments
  Stat active;            // count of active blocks
  std::int64_t num_raw_allocs = 0, num_raw_frees = 0, num_alloc_retries = 0, num_ooms = 0;
};
nlohmann::json to_json(const AllocatorStats& s);
std::string format_bytes(double bytes);  // "512 B", "1.50 MiB", ...

class CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<RawSource> source, AllocatorOptions options = {});
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (0 gives nullptr), aligned to options.alignment (512 B by
  // default), usable on `stream`.
  // On exhaustion: frees cached blocks, retries once, then throws OutOfMemoryError.
  void* allocate(std::size_t bytes, cudaStream_t stream = nullptr);
  void deallocate(void* p);
  // The block was used on `stream` too: on deallocate it returns to the pool only after the work
  // queued on `stream` up to now has completed.
  void record_stream(void* p, cudaStream_t stream);
  // Returns every unused cached segment to the raw source (after waiting for the events of
  // freed blocks still in use on other streams).
  void empty_cache();

  AllocatorStats stats() const;
  void reset_peak();
  // {"source", "stats", "segments": [{"address", "size", "pool", "stream", "blocks": [{"address",
  // "size", "requested", "state": "allocated"|"free"|"pending_free", "stream"}]}]}, by address.
  nlohmann::json snapshot() const;
  const RawSource& source() const;
  std::string summary() const;       // one line: allocated / reserved / peak, human-readable
  // Size a request of `bytes` really takes with the default 512 B alignment.
  static std::size_t round_size(std::size_t bytes);

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
