// @brief --profile_steps A:B: cudaProfilerStart before step A and cudaProfilerStop after step B,
// so `nsys --capture-range=cudaProfilerApi` and `ncu --profile-from-start off` see only those
// steps; and the process-wide switch that turns CUDA-graph replay off while steps are measured.
#pragma once

#include <functional>
#include <string_view>

namespace cutrain {

class ProfileWindow {
 public:
  ProfileWindow() = default;  // inactive: begin_step/end_step do nothing
  // "A:B" with 0 <= A <= B (step numbers as the Step lines print them; "7:7" is one step). Throws
  // Error naming the flag and the bad text: not two integers around one ':', negative, or B < A.
  static ProfileWindow parse(std::string_view spec);
  ProfileWindow(int first, int last);

  bool active() const { return first_ >= 0; }
  int first() const { return first_; }
  int last() const { return last_; }
  bool contains(int step) const { return active() && step >= first_ && step <= last_; }
  bool capturing() const { return capturing_; }

  // Before step `step`: starts the profiler at the first step inside [A, B] (also when a resumed
  // run starts past A). After step `step`: stops it once `step` >= B. finish() (and the
  // destructor) stop a window the run ended inside.
  void begin_step(int step);
  void end_step(int step);
  void finish();
  ~ProfileWindow();
  ProfileWindow(ProfileWindow&& o) noexcept;
  ProfileWindow& operator=(ProfileWindow&& o) noexcept;

  // For tests: what start and stop call (cudaProfilerStart / cudaProfilerStop by default).
  void set_hooks(std::function<void()> start, std::function<void()> stop);

 private:
  int first_ = -1, last_ = -1;
  bool capturing_ = false;
  std::function<void()> start_, stop_;
};

// Whether work captured as a CUDA graph may be replayed for the step about to run. The timing
// report and a profile window switch it off for the steps they measure, so kernels and
// their regions show up one by one (a replayed graph hides the launches from NVTX and events).
void set_graph_replay_allowed(bool allowed);
bool graph_replay_allowed();

}  // namespace cutrain
