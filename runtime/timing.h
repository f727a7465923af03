// @brief Named-region timing with CUDA events, without an external profiler (--timing_report).
//
// A TimedRegion opens the NVTX range of its name (runtime/nvtx.h joins it onto the enclosing ranges:
// "step/fwd/layer03/attn") and, when its RegionTimer is enabled, records a start and a stop event
// from a pool on `stream`. collect() waits for the events and adds each region's elapsed time to its
// name's totals; the pool is then reused, so after the first timed step nothing is allocated.
// Disabled, a TimedRegion costs the NVTX range and one branch.
//
// Rules: all work of a region must be on its stream (events time that stream only). Regions opened
// while their stream is being captured into a CUDA graph record no events (timing events inside a
// graph are not meaningful): callers run their work eagerly while the timer is enabled. Use one host
// thread per timer at a time (a mutex guards it, but regions from two threads would interleave
// their NVTX paths per thread, not per timer). Call collect() outside every timed region.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/nvtx.h"
#include "runtime/timing_report.h"

namespace cutrain {

class RegionTimer {
 public:
  RegionTimer() = default;
  ~RegionTimer();
  RegionTimer(const RegionTimer&) = delete;
  RegionTimer& operator=(const RegionTimer&) = delete;

  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // The region whose calls are the steps (default "step"): its per-call times are kept for MFU.
  void set_step_region(std::string name) { step_region_ = std::move(name); }
  const std::string& step_region() const { return step_region_; }

  // Waits for every recorded region and folds its time into the totals; the events go back to the
  // pool. Throws Error for a region still open, or for a CUDA error a region's stop hit earlier.
  void collect();
  // collect(), then the totals in first-seen order, and the step region's per-call times.
  std::vector<RegionTotals> totals();
  std::vector<double> step_ms();
  // Forgets every total (the pool stays).
  void clear();
  // collect() and make the report against `peaks`.
  TimingReport report(const DevicePeaks& peaks, double model_flops_per_step = 0, std::string flops_formula = "");

  std::size_t pooled_events() const { return pool_.size(); }
  std::size_t pending() const { return pending_.size(); }

  // For TimedRegion: begin() returns a pending index, or -1 when nothing was recorded (disabled, or
  // the stream is capturing); end() never throws (a failure is kept and thrown by collect()).
  int begin(const std::string& name, cudaStream_t stream);
  void end(int pending, std::uint64_t generation, cudaStream_t stream, double flops, double bytes) noexcept;
  // Bumped by clear(): a region opened before it cannot close into the new records.
  std::uint64_t generation() const { return generation_; }

 private:
  struct Pending {
    int region;
    cudaEvent_t start, stop;
    bool closed;
  };
  cudaEvent_t take_event();
  int region_id(const std::string& name);

  bool enabled_ = false;
  std::string step_region_ = "step";
  std::mutex mu_;
  std::vector<cudaEvent_t> pool_;
  std::size_t next_event_ = 0;
  std::vector<Pending> pending_;
  std::unordered_map<std::string, int> ids_;
  std::vector<RegionTotals> totals_;
  std::vector<double> step_ms_;
  std::string deferred_error_;
  std::uint64_t generation_ = 0;
};

// The process-wide timer every TimedRegion uses; disabled until a tool enables it.
RegionTimer& region_timer();

class TimedRegion {
 public:
  // `flops` and `bytes`: what the region's work must compute and move (0: not a kernel, no rate).
  TimedRegion(RegionTimer& timer, std::string_view name, cudaStream_t stream, double flops = 0, double bytes = 0);
  TimedRegion(std::string_view name, cudaStream_t stream, double flops = 0, double bytes = 0)
      : TimedRegion(region_timer(), name, stream, flops, bytes) {}
  ~TimedRegion();
  TimedRegion(const TimedRegion&) = delete;
  TimedRegion& operator=(const TimedRegion&) = delete;

 private:
  NvtxRange nvtx_;
  RegionTimer& timer_;
  cudaStream_t stream_;
  double flops_, bytes_;
  int pending_ = -1;
  std::uint64_t generation_ = 0;
};

}  // namespace cutrain
