#include "runtime/host_source.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "runtime/error.h"

namespace cutrain {

namespace {
constexpr std::size_t kHostAlign = 4096;  // a page, like cudaHostAlloc: any allocator alignment up to it works
}

HostSource::HostSource(std::size_t limit_bytes) : limit_(limit_bytes) {}

HostSource::~HostSource() {
  for (auto& [p, bytes] : live_) std::free(p);
}

void* HostSource::alloc(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes == 0 || bytes > limit_ - std::min(limit_, used_)) return nullptr;
  // aligned_alloc wants a multiple of the alignment; the allocator only asks for such sizes.
  std::size_t padded = (bytes + kHostAlign - 1) / kHostAlign * kHostAlign;
  void* p = std::aligned_alloc(kHostAlign, padded);
  if (!p) return nullptr;
  live_[p] = bytes;
  used_ += bytes;
  return p;
}

void HostSource::free(void* p, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  CUTRAIN_CHECK(it != live_.end(), "host source: free of ", p, ", which it never allocated (or freed already)");
  CUTRAIN_CHECK(it->second == bytes, "host source: free of ", p, " with size ", bytes, ", expected the allocated size ",
                it->second);
  used_ -= bytes;
  live_.erase(it);
  std::free(p);
}

void HostSource::mem_info(std::size_t* free_bytes, std::size_t* total_bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t total = limit_;
  if (limit_ == SIZE_MAX) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    total = pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
  }
  if (total_bytes) *total_bytes = total;
  if (free_bytes) *free_bytes = total > used_ ? total - used_ : 0;
}

void* HostSource::create_event() {
  std::lock_guard<std::mutex> lock(mu_);
  ++live_events_;
  return new SimEvent{};
}

void HostSource::record_event(void* event, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto* e = static_cast<SimEvent*>(event);
  e->stream = stream;
  e->seq = next_seq_++;
  recorded_[stream] = e->seq;
}

bool HostSource::query_event(void* event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto* e = static_cast<SimEvent*>(event);
  if (e->seq == 0) return true;
  auto it = completed_.find(e->stream);
  return it != completed_.end() && it->second >= e->seq;
}

void HostSource::synchronize_event(void* event) {
  // Waiting for an event on the simulated timeline is what finishes its stream up to it.
  std::lock_guard<std::mutex> lock(mu_);
  auto* e = static_cast<SimEvent*>(event);
  ++syncs_;
  if (e->seq == 0) return;
  std::uint64_t& done = completed_[e->stream];
  done = std::max(done, e->seq);
}

void HostSource::destroy_event(void* event) {
  std::lock_guard<std::mutex> lock(mu_);
  --live_events_;
  delete static_cast<SimEvent*>(event);
}

void HostSource::complete_stream(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = recorded_.find(stream);
  if (it != recorded_.end()) completed_[stream] = it->second;
}

void HostSource::complete_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [s, seq] : recorded_) completed_[s] = seq;
}

std::size_t HostSource::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}
std::size_t HostSource::live_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}
std::size_t HostSource::live_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_events_;
}
std::int64_t HostSource::synchronizations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return syncs_;
}

std::unique_ptr<RawSource> make_host_source(std::size_t limit_bytes) { return std::make_unique<HostSource>(limit_bytes); }

}  // namespace cutrain
