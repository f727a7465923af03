// @brief What `cutrain train --timing_report / --profile_steps` do around the training loop: the
// profiler window (cudaProfilerStart/Stop around steps A..B), the region timer switched on for a
// few steps after warm-up, CUDA-graph replay switched off while either measures, the device's
// peaks measured once before the training state is allocated, and the report (table + JSON)
// with MFU per step at the end.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <string>

#include "model/transformer_params.h"
#include "runtime/profiler.h"
#include "runtime/timing_report.h"

namespace cutrain::train {

struct ProfilingOptions {
  std::string profile_steps;        // "A:B", empty: no window
  bool profile_with_graphs = false;  // keep CUDA-graph replay inside the window (ncu sees the graph)
  bool timing_report = false;
  std::filesystem::path timing_report_file;  // JSON; empty: the table only
  int timing_steps = 5;                      // steps the region timer covers
  bool timing_all_rows = false;              // table rows per layer instead of layer* folded
};

// Model FLOPs of one optimizer step, the llm.c / PaLM-appendix-B count: 6·N per token for the
// weight matmuls (forward 2N, backward 4N) plus the attention score and value matmuls,
// 12·L·T·C per token without a mask (6·L·T·C with a causal mask, as llm.c counts). N excludes the
// token and position embedding tables (lookups, no matmul; the output head is a separate matmul
// here and is counted); in a MoE block only the k experts a token uses count (the active
// parameters). `formula` (optional) receives that description with the numbers.
double model_flops_per_step(const model::TransformerParams& table, int batch, int seq, int accumulation, bool causal,
                            std::string* formula = nullptr);

class StepProfiler {
 public:
  // Measures the peaks now when timing on a GPU: construct it before the engine allocates its
  // state. Throws Error for a bad --profile_steps or --timing_steps (on every backend).
  StepProfiler(const ProfilingOptions& options, const model::TransformerParams& table, int batch, int seq, int accumulation,
               bool causal, bool on_gpu);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // The run's steps are first_step..last_step (as the Step lines print them; known after a
  // resume): the timer covers --timing_steps of them after `warmup_steps` (at least one).
  void set_steps(int first_step, int last_step, int warmup_steps);

  bool timing() const { return timing_; }
  int timed_first() const { return timed_first_; }
  int timed_last() const { return timed_last_; }
  const ProfileWindow& window() const { return window_; }

  void begin_step(int step);
  void end_step(int step);
  // Prints the report (when timing) and writes its JSON; stops an open profiler window.
  void finish(std::ostream& out);

 private:
  bool measuring(int step) const;
  ProfilingOptions opt_;
  ProfileWindow window_;
  bool timing_ = false;
  int timed_first_ = 0, timed_last_ = -1;
  double model_flops_ = 0;
  std::string formula_;
  DevicePeaks peaks_;
};

}  // namespace cutrain::train
