// @brief Copies between device memory and pageable host memory through two pinned bounce
// buffers: the DMA of one chunk runs while host threads move the previous chunk between its
// bounce buffer and the pageable memory. The driver's own pageable path stages serially on one
// thread; this one keeps the copy engine and several cores busy at once.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

namespace cutrain {

class StagedCopier {
 public:
  // `chunk_bytes`: each bounce buffer (pinned, from pinned_allocator(), allocated on first use);
  // `threads`: host threads per chunk (0: half the cores, at most 8).
  explicit StagedCopier(std::size_t chunk_bytes = std::size_t{64} << 20, int threads = 0);
  ~StagedCopier();  // waits for its copies in flight
  StagedCopier(const StagedCopier&) = delete;
  StagedCopier& operator=(const StagedCopier&) = delete;

  // Device -> pageable host, ordered after the work queued on `stream`; returns when `dst` holds
  // the bytes (like cudaMemcpyAsync to pageable memory).
  void to_host(void* dst, const void* src_device, std::size_t bytes, cudaStream_t stream);
  // Pageable host -> device on `stream`; returns once `src` has been read (the last chunks' DMA
  // may still run: later work on `stream` is ordered after it).
  void to_device(void* dst_device, const void* src, std::size_t bytes, cudaStream_t stream);

  std::size_t chunk_bytes() const { return chunk_; }
  int threads() const { return threads_; }

 private:
  struct Impl;
  std::size_t chunk_;
  int threads_;
  std::unique_ptr<Impl> impl_;
};

// memcpy split over `threads` threads (the caller is one of them); small copies stay on one.
void parallel_memcpy(void* dst, const void* src, std::size_t bytes, int threads);

}  // namespace cutrain
