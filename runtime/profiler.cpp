#include "runtime/profiler.h"

#include <cuda_profiler_api.h>

#include <atomic>
#include <charconv>
#include <string>
#include <utility>

#include "runtime/check.h"

namespace cutrain {

namespace {
std::atomic<bool> g_graph_replay_allowed{true};

bool parse_step(std::string_view s, int& out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end && out >= 0;
}
}  // namespace

void set_graph_replay_allowed(bool allowed) { g_graph_replay_allowed = allowed; }
bool graph_replay_allowed() { return g_graph_replay_allowed; }

ProfileWindow ProfileWindow::parse(std::string_view spec) {
  const std::size_t colon = spec.find(':');
  int a = -1, b = -1;
  CUTRAIN_CHECK(colon != std::string_view::npos && parse_step(spec.substr(0, colon), a) &&
                    parse_step(spec.substr(colon + 1), b),
                "--profile_steps: expected A:B with two step numbers >= 0 (e.g. 10:12), got '", std::string(spec),
                "'");
  CUTRAIN_CHECK(b >= a, "--profile_steps: the last step must not come before the first, got ", a, ":", b);
  return ProfileWindow(a, b);
}

ProfileWindow::ProfileWindow(int first, int last) : first_(first), last_(last) {
  CUTRAIN_CHECK(first >= 0 && last >= first, "profile window: expected 0 <= first <= last, got ", first, ":", last);
  start_ = [] { CUTRAIN_CUDA_CHECK(cudaProfilerStart()); };
  stop_ = [] { CUTRAIN_CUDA_CHECK(cudaProfilerStop()); };
}

ProfileWindow::ProfileWindow(ProfileWindow&& o) noexcept
    : first_(o.first_), last_(o.last_), capturing_(std::exchange(o.capturing_, false)),
      start_(std::move(o.start_)), stop_(std::move(o.stop_)) {
  o.first_ = o.last_ = -1;
}

ProfileWindow& ProfileWindow::operator=(ProfileWindow&& o) noexcept {
  if (this != &o) {
    try {
      finish();
    } catch (...) {
    }
    first_ = std::exchange(o.first_, -1);
    last_ = std::exchange(o.last_, -1);
    capturing_ = std::exchange(o.capturing_, false);
    start_ = std::move(o.start_);
    stop_ = std::move(o.stop_);
  }
  return *this;
}

ProfileWindow::~ProfileWindow() {
  try {
    finish();
  } catch (...) {
    // A failing cudaProfilerStop at exit has nobody left to report to.
  }
}

void ProfileWindow::set_hooks(std::function<void()> start, std::function<void()> stop) {
  start_ = std::move(start);
  stop_ = std::move(stop);
}

void ProfileWindow::begin_step(int step) {
  if (!contains(step) || capturing_) return;
  start_();
  capturing_ = true;
}

void ProfileWindow::end_step(int step) {
  if (capturing_ && step >= last_) finish();
}

void ProfileWindow::finish() {
  if (!capturing_) return;
  capturing_ = false;
  stop_();
}

}  // namespace cutrain
