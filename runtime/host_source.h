// @brief The plain-host raw source of the caching allocator: aligned host memory with an optional
// cap (to test exhaustion without a GPU) and simulated events a test completes by hand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

#include "runtime/allocator.h"

namespace cutrain {

// Simulated streams: an event recorded on stream S gets the next sequence number; it is complete
// once S has been completed up to it (complete_stream / complete_all / synchronize_event), so
// events of one stream complete in order, as CUDA's do.
class HostSource final : public RawSource {
 public:
  explicit HostSource(std::size_t limit_bytes = SIZE_MAX);
  ~HostSource() override;

  void* alloc(std::size_t bytes) override;
  void free(void* p, std::size_t bytes) override;   // throws on an unknown pointer or wrong size
  const char* name() const override { return "host"; }
  bool is_device() const override { return false; }
  void mem_info(std::size_t* free_bytes, std::size_t* total_bytes) const override;

  void* create_event() override;
  void record_event(void* event, cudaStream_t stream) override;
  bool query_event(void* event) override;
  void synchronize_event(void* event) override;
  void destroy_event(void* event) override;

  // Test controls and counters.
  void complete_stream(cudaStream_t stream);  // all work recorded on `stream` so far is done
  void complete_all();
  std::size_t used_bytes() const;
  std::size_t live_allocations() const;
  std::size_t live_events() const;
  std::int64_t synchronizations() const;

 private:
  struct SimEvent {
    cudaStream_t stream = nullptr;
    std::uint64_t seq = 0;  // 0: never recorded (complete, like a fresh CUDA event)
  };
  mutable std::mutex mu_;
  std::size_t limit_, used_ = 0;
  std::unordered_map<void*, std::size_t> live_;
  std::uint64_t next_seq_ = 1;
  std::map<cudaStream_t, std::uint64_t> recorded_, completed_;
  std::size_t live_events_ = 0;
  std::int64_t syncs_ = 0;
};

}  // namespace cutrain
