#include "runtime/timing.h"

#include "runtime/check.h"

namespace cutrain {

RegionTimer::~RegionTimer() {
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

RegionTimer& region_timer() {
  static RegionTimer* t = new RegionTimer();  // lives for the process: regions may close at exit
  return *t;
}

cudaEvent_t RegionTimer::take_event() {
  if (next_event_ == pool_.size()) {
    cudaEvent_t e = nullptr;
    CUTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
    pool_.push_back(e);
  }
  return pool_[next_event_++];
}

int RegionTimer::region_id(const std::string& name) {
  auto it = ids_.find(name);
  if (it != ids_.end()) return it->second;
  const int id = static_cast<int>(totals_.size());
  ids_.emplace(name, id);
  totals_.push_back(RegionTotals{name, 0, 0, 0, 0});
  return id;
}

int RegionTimer::begin(const std::string& name, cudaStream_t stream) {
  if (!enabled_) return -1;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  const cudaError_t qe = cudaStreamIsCapturing(stream, &cap);
  if (qe != cudaSuccess) {
    // The legacy stream during a global-mode capture elsewhere: unsafe to record, so skip.
    cudaGetLastError();
    return -1;
  }
  if (cap != cudaStreamCaptureStatusNone) return -1;
  std::lock_guard<std::mutex> lk(mu_);
  const int id = region_id(name);
  cudaEvent_t start = take_event();
  cudaEvent_t stop = take_event();
  CUTRAIN_CUDA_CHECK(cudaEventRecord(start, stream));
  ++totals_[static_cast<std::size_t>(id)].calls;
  pending_.push_back(Pending{id, start, stop, false});
  return static_cast<int>(pending_.size() - 1);
}

void RegionTimer::end(int pending, std::uint64_t generation, cudaStream_t stream, double flops,
                      double bytes) noexcept {
  if (pending < 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (generation != generation_ || static_cast<std::size_t>(pending) >= pending_.size()) {
    // clear() ran while this region was open: its record is gone, so it is dropped.
    return;
  }
  Pending& p = pending_[static_cast<std::size_t>(pending)];
  const cudaError_t err = cudaEventRecord(p.stop, stream);
  if (err != cudaSuccess) {
    if (deferred_error_.empty())
      deferred_error_ = detail::concat("cudaEventRecord at the end of region '", totals_[p.region].name,
                                       "': ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
    return;
  }
  p.closed = true;
  RegionTotals& t = totals_[static_cast<std::size_t>(p.region)];
  t.flops += flops;
  t.bytes += bytes;
}

void RegionTimer::collect() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!deferred_error_.empty()) {
    std::string e = std::move(deferred_error_);
    deferred_error_.clear();
    CUTRAIN_FAIL("region timer: ", e);
  }
  for (const Pending& p : pending_)
    CUTRAIN_CHECK(p.closed, "region timer: collect() while region '", totals_[p.region].name,
                  "' is still open (call it outside every TimedRegion)");
  for (const Pending& p : pending_) {
    CUTRAIN_CUDA_CHECK(cudaEventSynchronize(p.stop));
    float ms = 0;
    CUTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
    RegionTotals& t = totals_[static_cast<std::size_t>(p.region)];
    t.total_ms += ms;
    if (t.name == step_region_) step_ms_.push_back(ms);
  }
  pending_.clear();
  next_event_ = 0;
}

std::vector<RegionTotals> RegionTimer::totals() {
  collect();
  std::lock_guard<std::mutex> lk(mu_);
  return totals_;
}

std::vector<double> RegionTimer::step_ms() {
  collect();
  std::lock_guard<std::mutex> lk(mu_);
  return step_ms_;
}

void RegionTimer::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  pending_.clear();
  next_event_ = 0;
  ids_.clear();
  totals_.clear();
  step_ms_.clear();
  deferred_error_.clear();
  ++generation_;
}

TimingReport RegionTimer::report(const DevicePeaks& peaks, double model_flops_per_step, std::string flops_formula) {
  std::vector<RegionTotals> t = totals();
  std::vector<double> s = step_ms();
  return make_timing_report(t, s, peaks, step_region_, model_flops_per_step, std::move(flops_formula));
}

TimedRegion::TimedRegion(RegionTimer& timer, std::string_view name, cudaStream_t stream, double flops, double bytes)
    : nvtx_(name), timer_(timer), stream_(stream), flops_(flops), bytes_(bytes) {
  if (timer_.enabled()) {
    generation_ = timer_.generation();
    pending_ = timer_.begin(NvtxRange::current_path(), stream_);
  }
}

TimedRegion::~TimedRegion() { timer_.end(pending_, generation_, stream_, flops_, bytes_); }

}  // namespace cutrain
