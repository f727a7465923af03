// @brief The GPU engine's captured step graphs: one CUDA graph of the step's capturable part
// (H2D staging copies, forward/backward, gradient reduction, norm) per step shape — random-LTD's
// kept count and the micro-batch's rows x seq of a sequence-length curriculum — since the kernels'
// shapes follow them. The first step after construction or clear() runs eagerly (the workspace's
// first allocation, the first cuBLASLt plans); from then on a new shape is captured at its first
// step and replayed from then on, whichever shapes ran in between: a curriculum that comes back to
// a length replays its graph. Should a first-step capture fail (something at a new shape that a
// capture does not allow), that shape runs eagerly and every later new shape gets one eager step
// before its capture.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace cutrain::train {

struct StepShape {
  int kept = 0;  // random-LTD's kept tokens per sequence (0: no drop)
  int rows = 0, seq = 0;
  bool operator==(const StepShape& o) const { return kept == o.kept && rows == o.rows && seq == o.seq; }
};

class StepGraphs {
 public:
  StepGraphs() = default;
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Runs `enqueue` (the step's capturable part) on `s` at `shape`: replayed from its graph, or
  // captured first (a shape without a graph once a step has run since the last clear), or eagerly
  // (the first step since the last clear; `use_graphs` off; `replay_ok` false: --timing_report /
  // --profile_steps measure the step). A capture that fails (a launcher that syncs or allocates)
  // after the shape ran eagerly turns graphs off for the run with a warning on stderr; one at a
  // shape's first step makes every new shape run one eager step first (a note on stderr). Nothing
  // captured has run, so the step then runs eagerly.
  void run(cudaStream_t s, const StepShape& shape, bool use_graphs, bool replay_ok, const std::function<void()>& enqueue);
  // Drops every graph (the addresses they hold changed: a workspace release, a state reload);
  // the next step runs eagerly, then each shape is captured again.
  void clear();
  // Whether `shape` has a captured graph.
  bool captured(const StepShape& shape) const;
  int captures() const { return captures_; }  // successful captures so far (all shapes)
  int size() const;                           // graphs held now

 private:
  struct Entry {
    StepShape shape;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    int eager = 0;  // eager steps run at this shape since its last clear
  };
  std::vector<Entry> entries_;
  bool failed_ = false;
  bool warm_ = false;         // a step has run since construction or the last clear()
  bool eager_first_ = false;  // a first-step capture failed: new shapes run one eager step first
  int captures_ = 0;
};

}  // namespace cutrain::train
