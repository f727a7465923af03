#include "runtime/staged_copy.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/device.h"

namespace cutrain {

void parallel_memcpy(void* dst, const void* src, std::size_t bytes, int threads) {
  constexpr std::size_t kMinPerThread = std::size_t{4} << 20;
  const std::size_t t = std::max<std::size_t>(1, std::min<std::size_t>(threads, bytes / kMinPerThread));
  if (t == 1) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  const std::size_t per = (bytes / t + 4095) / 4096 * 4096;  // page-aligned parts
  auto part = [&](std::size_t i) {
    const std::size_t lo = std::min(bytes, i * per), hi = std::min(bytes, lo + per);
    if (hi > lo) std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo);
  };
  std::vector<std::thread> pool;
  pool.reserve(t - 1);
  for (std::size_t i = 1; i < t; ++i) pool.emplace_back(part, i);
  part(0);
  for (auto& th : pool) th.join();
}

struct StagedCopier::Impl {
  Buffer bounce[2];
  Event ev[2]{Event(false), Event(false)};  // ev[b]: the DMA using bounce[b] is done

  void ensure(std::size_t chunk) {
    if (bounce[0]) return;
    bounce[0] = Buffer(pinned_allocator(), chunk);
    bounce[1] = Buffer(pinned_allocator(), chunk);
  }
  void drain() {
    ev[0].synchronize();
    ev[1].synchronize();
  }
};

StagedCopier::StagedCopier(std::size_t chunk_bytes, int threads)
    : chunk_(chunk_bytes), threads_(threads), impl_(std::make_unique<Impl>()) {
  CUTRAIN_CHECK(chunk_bytes >= 4096 && chunk_bytes % 4096 == 0, "StagedCopier: chunk_bytes must be a positive ",
                "multiple of 4096, got ", chunk_bytes);
  if (threads_ <= 0) threads_ = std::clamp(int(std::thread::hardware_concurrency() / 2), 1, 8);
}

StagedCopier::~StagedCopier() {
  try {
    impl_->drain();  // the bounce buffers go back only after their DMA
  } catch (...) {
  }
}

void StagedCopier::to_host(void* dst, const void* src_device, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  Impl& m = *impl_;
  m.ensure(chunk_);
  m.drain();  // a previous to_device may still read the bounce buffers
  const std::size_t n = (bytes + chunk_ - 1) / chunk_;
  auto len = [&](std::size_t i) { return std::min(chunk_, bytes - i * chunk_); };
  auto enqueue = [&](std::size_t i) {
    const int b = int(i & 1);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(m.bounce[b].get(), static_cast<const char*>(src_device) + i * chunk_, len(i),
                                       cudaMemcpyDeviceToHost, stream));
    m.ev[b].record(stream);
  };
  enqueue(0);
  for (std::size_t i = 0; i < n; ++i) {
    const int b = int(i & 1);
    // bounce[1-b] was emptied by the host in the previous iteration: its next DMA can start.
    if (i + 1 < n) enqueue(i + 1);
    m.ev[b].synchronize();
    parallel_memcpy(static_cast<char*>(dst) + i * chunk_, m.bounce[b].get(), len(i), threads_);
  }
}

void StagedCopier::to_device(void* dst_device, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  Impl& m = *impl_;
  m.ensure(chunk_);
  m.drain();
  const std::size_t n = (bytes + chunk_ - 1) / chunk_;
  for (std::size_t i = 0; i < n; ++i) {
    const int b = int(i & 1);
    const std::size_t l = std::min(chunk_, bytes - i * chunk_);
    m.ev[b].synchronize();  // the DMA of chunk i-2 out of bounce[b] is done
    parallel_memcpy(m.bounce[b].get(), static_cast<const char*>(src) + i * chunk_, l, threads_);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst_device) + i * chunk_, m.bounce[b].get(), l,
                                       cudaMemcpyHostToDevice, stream));
    m.ev[b].record(stream);
  }
}

}  // namespace cutrain
