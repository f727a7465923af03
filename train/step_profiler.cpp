#include "train/step_profiler.h"

#include <algorithm>
#include <ostream>

#include "runtime/error.h"
#include "runtime/peaks.h"
#include "runtime/timing.h"

namespace cutrain::train {

double model_flops_per_step(const model::TransformerParams& t, int batch, int seq, int accumulation, bool causal,
                            std::string* formula) {
  const model::ModelDims& d = t.dims();
  // The input tables are lookups, not matmuls; a tied head's weight is the token embedding, whose
  // GEMM does count (llm.c's N for GPT-2 keeps wte as the head; its wpe, under 1% of N at GPT-2's
  // sizes, is left out here).
  double N = double(t.num_params()) - double(t.tensor(t.pos_embedding()).count);
  if (!t.tied_head()) N -= double(t.tensor(t.embedding()).count);
  // A MoE block's token passes through k of its E experts: N counts the active parameters.
  double inactive = 0;
  for (int l = 0; l < d.layers; ++l)
    if (d.moe.is_moe(l)) inactive += double(d.moe.experts[std::size_t(l)] - d.moe.k) * 2.0 * d.ffn() * d.hidden;
  N -= inactive;
  const double tokens = double(batch) * seq * accumulation;
  const double attn = (causal ? 6.0 : 12.0) * d.layers * double(seq) * d.hidden;
  const char* counted = t.tied_head() ? " params without the position table (the tied head's GEMM counted)"
                                      : " params without the embedding tables";
  if (formula)
    *formula = detail::concat("(6*N + ", causal ? "6" : "12", "*L*T*C) * tokens, N=", std::size_t(N), counted,
                              inactive > 0 ? " (MoE: the k experts a token uses)" : "",
                              ", L=", d.layers, ", T=", seq, ", C=", d.hidden,
                              ", tokens=", std::size_t(tokens), causal ? " (causal: llm.c's count)" : " (no mask)");
  return (6.0 * N + attn) * tokens;
}

StepProfiler::StepProfiler(const ProfilingOptions& o, const model::TransformerParams& table, int batch, int seq,
                           int accumulation, bool causal, bool on_gpu)
    : opt_(o) {
  // Parsed on every backend (a typo fails fast); armed only on the GPU, where there is a profiler.
  if (!o.profile_steps.empty()) {
    ProfileWindow w = ProfileWindow::parse(o.profile_steps);
    if (on_gpu) window_ = std::move(w);
  }
  CUTRAIN_CHECK(o.timing_steps >= 1, "--timing_steps must be >= 1, got ", o.timing_steps);
  timing_ = o.timing_report && on_gpu;
  model_flops_ = model_flops_per_step(table, batch, seq, accumulation, causal, &formula_);
  if (timing_) {
    peaks_ = measure_peaks();
    region_timer().clear();
    region_timer().set_step_region("step");
  }
}

void StepProfiler::set_steps(int first_step, int last_step, int warmup_steps) {
  CUTRAIN_CHECK(last_step >= first_step, "profiler: the run's last step ", last_step, " comes before its first ",
                first_step);
  // Time steps after the warm-up (the first step builds cuBLASLt plans and allocates the
  // activations); a run too short for that times its last steps.
  const int n = last_step - first_step + 1;
  timed_first_ = first_step + std::min(std::max(1, warmup_steps), n - 1);
  timed_last_ = std::min(last_step, timed_first_ + opt_.timing_steps - 1);
}

StepProfiler::~StepProfiler() {
  region_timer().set_enabled(false);
  set_graph_replay_allowed(true);
}

bool StepProfiler::measuring(int step) const {
  return (timing_ && step >= timed_first_ && step <= timed_last_) ||
         (window_.contains(step) && !opt_.profile_with_graphs);
}

void StepProfiler::begin_step(int step) {
  set_graph_replay_allowed(!measuring(step));
  region_timer().set_enabled(timing_ && step >= timed_first_ && step <= timed_last_);
  window_.begin_step(step);
}

void StepProfiler::end_step(int step) {
  window_.end_step(step);
  if (region_timer().enabled()) region_timer().collect();
  region_timer().set_enabled(false);
  set_graph_replay_allowed(true);
}

void StepProfiler::finish(std::ostream& out) {
  window_.finish();
  region_timer().set_enabled(false);
  if (!opt_.profile_steps.empty() && !window_.active())
    out << "[Rank 0] --profile_steps: ignored on the CPU backend (no CUDA profiler)\n";
  if (!timing_) {
    if (opt_.timing_report) out << "[Rank 0] --timing_report: no report on the CPU backend (it times CUDA events)\n";
    return;
  }
  const TimingReport r = region_timer().report(peaks_, model_flops_, formula_);
  out << "\n[Rank 0] steps " << timed_first_ << ".." << timed_last_ << " timed eagerly (CUDA graph replay off)\n";
  out << format_timing_report(r, opt_.timing_all_rows);
  if (!opt_.timing_report_file.empty()) {
    write_timing_report(opt_.timing_report_file, r);
    out << "[Rank 0] Timing report written to: " << opt_.timing_report_file.string() << "\n";
  }
}

}  // namespace cutrain::train
