#include "parallel/planner_timings.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "kernels/gemm_bias_grad_rule.h"
#include "model/kernel_costs.h"
#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/json_util.h"

namespace cutrain::parallel {

namespace cost = model::cost;

namespace {

struct Roof {
  const DevicePeakRates& p;
  double operator()(const cost::Cost& c) const {
    return std::max(c.flops / (p.tflops * 1e12), c.bytes / (p.gbps * 1e9));
  }
};

double adam_bytes_per_elem(std::size_t g, std::size_t mb, bool master, bool comp) {
  return cost::adam_step(1, g, mb, master, comp).bytes;
}

}  // namespace

KernelTimings roofline_timings(const model::ModelDims& d, int B, int S, bool causal, std::size_t g, std::size_t mb,
                               bool master, bool comp, const DevicePeakRates& peaks) {
  CUTRAIN_CHECK(peaks.tflops > 0 && peaks.gbps > 0, "plan: the roofline needs positive device peaks, got ",
                peaks.tflops, " TFLOP/s and ", peaks.gbps, " GB/s");
  const Roof t{peaks};
  const std::size_t M = std::size_t(B) * S, h = d.hidden, F = d.ffn(), V = d.vocab_rows(), H = d.heads;
  const std::size_t D = d.head_dim();
  KernelTimings k;
  char src[200];
  std::snprintf(src, sizeof src, "roofline of %s (%.1f TFLOP/s bf16, %.0f GB/s): max(FLOPs/peak, bytes/bandwidth) per "
                "kernel, a lower bound", peaks.device.c_str(), peaks.tflops, peaks.gbps);
  k.source = src;
  k.embed_fwd = t(cost::embedding_forward(B, S, h));
  k.embed_bwd = t(cost::embedding_backward(B, S, h, g));
  const double ln_f = 2 * t(cost::layernorm_residual_forward(M, h));
  const double ln_b = 2 * t(cost::layernorm_backward(M, h, g, false));
  // dW and db as the models run them (kernels/gemm_bias_grad_rule.h: db in the GEMM's epilogue or
  // the reduction after it), then dx.
  auto linear_bwd = [&](std::size_t N, std::size_t K) {
    const double params = kernels::bias_grad_in_epilogue(int(M), int(N), int(K), false)
                              ? t(cost::gemm_grad_weight_bias(M, N, K, g))
                              : t(cost::gemm_grad_weight(M, N, K, g, false)) + t(cost::bias_grad(M, N, g, false));
    return params + t(cost::gemm_grad_input(M, N, K, false));
  };
  k.layer_fwd = t(cost::gemm_forward(M, 3 * h, h)) + t(cost::attention_forward(B, S, H, D, causal)) +
                t(cost::gemm_forward(M, h, h)) + t(cost::gemm_forward(M, F, h)) + t(cost::gelu_forward(M * F)) +
                t(cost::gemm_forward(M, h, F)) + ln_f;
  k.layer_bwd = linear_bwd(h, F) + t(cost::gelu_backward(M * F)) + linear_bwd(F, h) + linear_bwd(h, h) +
                t(cost::attention_backward(B, S, H, D, causal)) + linear_bwd(3 * h, h) + ln_b;
  k.layer_recompute = k.layer_fwd;
  k.layer_replicated_fraction = (ln_f + ln_b) / (k.layer_fwd + k.layer_bwd);
  k.head_fwd = t(cost::gemm_forward(M, V, h)) + t(cost::cross_entropy(M, d.vocab));
  k.head_bwd = linear_bwd(V, h);
  k.optimizer_per_elem = adam_bytes_per_elem(g, mb, master, comp) / (peaks.gbps * 1e9);
  k.grad_norm_per_elem = double(g) / (peaks.gbps * 1e9);
  return k;
}

TimedRun timings_from_report(const nlohmann::json& j, const std::string& what, std::size_t g, std::size_t mb,
                             bool master, bool comp) {
  CUTRAIN_CHECK(j.is_object() && j.contains("regions") && j["regions"].is_array(), what,
                ": expected a timing report (cutrain train --timing_report FILE) with a \"regions\" array");
  TimedRun run;
  run.steps = j.value("steps", 0);
  CUTRAIN_CHECK(run.steps > 0, what, ": the timing report covers no steps (\"steps\": ", run.steps, ")");
  run.model_flops_per_step = j.value("model_flops_per_step", 0.0);
  run.device = j.value("device", std::string());
  struct Row {
    double calls = 0, ms = 0, gbps = 0;
  };
  std::map<std::string, Row> rows;  // folded by layer: "step/fwd/layer*/attn/ln1"
  for (const nlohmann::json& r : j["regions"]) {
    CUTRAIN_CHECK(r.is_object() && r.contains("name") && r.contains("calls") && r.contains("total_ms"), what,
                  ": a region without name, calls and total_ms");
    std::string name = r["name"].get<std::string>();
    // "layer07" -> "layer*" (the report's own folding, runtime/timing_report.h)
    std::string folded;
    for (std::size_t p = 0; p <= name.size();) {
      std::size_t e = name.find('/', p);
      if (e == std::string::npos) e = name.size();
      std::string part = name.substr(p, e - p);
      const bool layer = part.size() > 5 && part.compare(0, 5, "layer") == 0 &&
                         std::all_of(part.begin() + 5, part.end(), [](char c) { return c >= '0' && c <= '9'; });
      folded += (p ? "/" : "") + (layer ? std::string("layer*") : part);
      p = e + 1;
    }
    Row& row = rows[folded];
    row.calls += r["calls"].get<double>();
    row.ms += r["total_ms"].get<double>();
    if (r.contains("gbps")) row.gbps = r["gbps"].get<double>();
  }
  auto need = [&](const std::string& n) -> const Row& {
    auto it = rows.find(n);
    CUTRAIN_CHECK(it != rows.end() && it->second.calls > 0, what, ": the timing report has no region ", n,
                  " (expected the regions of cutrain train's GPU engine on the BF16 example's model)");
    return it->second;
  };
  auto ms = [&](const std::string& n) {
    auto it = rows.find(n);
    return it == rows.end() ? 0.0 : it->second.ms;
  };
  CUTRAIN_CHECK(!rows.count("step/fwd/layer*/moe"), what,
                ": the timed run has MoE blocks; the planner models dense blocks only");
  CUTRAIN_CHECK(!rows.count("step/fwd/head/ln_f"), what,
                ": the timed run is GPT-2 (a final LayerNorm in the head); the planner models the BF16 example's "
                "model (--model simple)");
  const Row& emb = need("step/fwd/embedding");
  const Row& lf = need("step/fwd/layer*");
  const Row& lb = need("step/bwd/layer*");
  const double micro = emb.calls;  // one embedding forward per micro-batch
  run.accumulation = int(micro / run.steps + 0.5);
  run.layers = int(lf.calls / micro + 0.5);
  CUTRAIN_CHECK(run.accumulation >= 1 && run.layers >= 1, what, ": the timing report's calls (", emb.calls,
                " embedding forwards, ", lf.calls, " block forwards over ", run.steps, " steps) are not a whole model");
  const double calls = lf.calls;
  KernelTimings& k = run.timings;
  k.embed_fwd = emb.ms * 1e-3 / micro;
  k.embed_bwd = need("step/bwd/embedding").ms * 1e-3 / micro;
  k.layer_fwd = lf.ms * 1e-3 / calls;
  k.layer_recompute = ms("step/bwd/layer*/recompute") * 1e-3 / calls;
  k.layer_bwd = lb.ms * 1e-3 / calls - k.layer_recompute;
  const double ln = ms("step/fwd/layer*/attn/ln1") + ms("step/fwd/layer*/mlp/ln2") + ms("step/bwd/layer*/attn/ln1") +
                    ms("step/bwd/layer*/mlp/ln2");
  k.layer_replicated_fraction = ln * 1e-3 / calls / (k.layer_fwd + k.layer_bwd);
  k.head_fwd = need("step/fwd/head").ms * 1e-3 / micro;
  k.head_bwd = need("step/bwd/head").ms * 1e-3 / micro;
  // Memory-bound passes over the state: their measured GB/s applied to the planned layout's bytes.
  const Row& opt = need("step/optimizer");
  const Row& norm = need("step/grad_norm");
  CUTRAIN_CHECK(opt.gbps > 0 && norm.gbps > 0, what, ": the optimizer and grad_norm regions carry no GB/s");
  k.optimizer_per_elem = adam_bytes_per_elem(g, mb, master, comp) / (opt.gbps * 1e9);
  k.grad_norm_per_elem = double(g) / (norm.gbps * 1e9);
  return run;
}

TimedRun read_timing_report(const std::filesystem::path& path, std::size_t g, std::size_t mb, bool master, bool comp) {
  const nlohmann::json j = parse_json_strict(read_text_file(path), path.string());
  TimedRun r = timings_from_report(j, path.string(), g, mb, master, comp);
  return r;
}

}  // namespace cutrain::parallel
