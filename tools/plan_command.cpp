// `cutrain plan`: the parallel-layout planner (parallel/planner.h). The model by `cutrain train`'s
// shape flags and DeepSpeed config, a number of GPUs and their link: per-GPU memory and a predicted
// step time of ZeRO 0-3, a pipeline and tensor parallelism, from kernel timings of a timing report
// (--kernel_timings), of a short profiled run on the local GPU, or of a roofline from device peaks.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "parallel/pipeline_plan.h"
#include "parallel/planner.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/timing_report.h"
#include "tools/commands.h"
#include "train/config.h"
#include "train/precision.h"
#include "train/step_profiler.h"
#include "train/train_loop.h"

namespace cutrain::tools {
namespace {

struct PlanFlags {
  std::string config;
  int hidden = 1024, layers = 12, heads = 16, vocab = 50000, batch = 4, seq = 512, max_seq = 0;
  bool checkpointing = false;
  std::string attention = "bidirectional";
  int num_gpus = 0;
  double link_gbps = 450, link_latency_us = 10;
  std::vector<std::string> layouts{"zero0", "zero1", "zero2", "zero3", "pp", "tp"};
  int pp = 0, tp = 0;  // 0: num_gpus
  std::string kernel_timings;
  bool roofline = false;
  double peak_tflops = 0, peak_gbps = 0, gpu_memory_gb = 0;
  int probe_layers = 4;
};

std::string num(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

constexpr double kGB = 1024.0 * 1024 * 1024;

// The profiled run on this GPU: `cutrain train` at the same shapes with `layers` blocks (per-block
// times do not depend on the count), 4 steps, the last 3 timed; its timing report and peak memory.
struct ProbeResult {
  parallel::TimedRun run;
  double peak_bytes = 0;
  double predicted_bytes = 0;
};

ProbeResult probe(const PlanFlags& fl, const parallel::PlanModel& m, int layers, const train::PrecisionPlan& prec) {
  train::TrainOptions o;
  o.deepspeed_config = fl.config;
  o.hidden_dim = fl.hidden, o.num_layers = layers, o.num_heads = fl.heads, o.vocab_size = fl.vocab;
  o.batch_size = fl.batch, o.seq_length = fl.seq, o.max_seq_len = fl.max_seq;
  o.activation_checkpointing = fl.checkpointing;
  o.attention = m.causal ? train::AttentionChoice::Causal : train::AttentionChoice::Bidirectional;
  o.num_steps = 4, o.warmup_steps = 1, o.log_interval = 1000;
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("cutrain_plan_timing_" + std::to_string(::getpid()) + ".json");
  o.profiling.timing_report = true;
  o.profiling.timing_report_file = file;
  o.profiling.timing_steps = 3;
  // The run's own lines (the loop's and the engine's on stdout) stay out of the plan.
  std::ostringstream log;
  struct Quiet {
    std::streambuf* old;
    explicit Quiet(std::streambuf* to) : old(std::cout.rdbuf(to)) {}
    ~Quiet() { std::cout.rdbuf(old); }
  };
  ProbeResult r;
  try {
    const Quiet quiet(log.rdbuf());
    const train::TrainResult res = train::run_training(o, log);
    r.peak_bytes = double(res.peak_bytes);
    r.run = parallel::read_timing_report(file, dtype_size(prec.grad), dtype_size(prec.moment), prec.has_master,
                                         prec.compensation);
  } catch (const Error& e) {
    std::filesystem::remove(file);
    CUTRAIN_FAIL("plan: the profiled run on this GPU (cutrain train at these shapes with ", layers,
                 " layers) failed: ", e.what(), "; try fewer --probe_layers, or --roofline, or --kernel_timings FILE");
  }
  std::filesystem::remove(file);
  parallel::PlanModel pm = m;
  pm.dims.layers = layers;
  r.predicted_bytes = parallel::single_gpu_memory(pm).total();
  return r;
}

int run_plan(const PlanFlags& fl) {
  CUTRAIN_CHECK(fl.num_gpus >= 1, "plan: --num_gpus must be >= 1, got ", fl.num_gpus);
  CUTRAIN_CHECK(fl.link_gbps > 0, "plan: --link_gbps must be > 0 (GB/s per direction), got ", fl.link_gbps);
  CUTRAIN_CHECK(fl.link_latency_us >= 0, "plan: --link_latency_us must be >= 0, got ", fl.link_latency_us);
  CUTRAIN_CHECK(fl.hidden >= 1 && fl.layers >= 1 && fl.heads >= 1 && fl.vocab >= 1, "plan: --hidden_dim, --num_layers, "
                "--num_heads and --vocab_size must be >= 1");
  CUTRAIN_CHECK(fl.batch >= 1 && fl.seq >= 1, "plan: --batch_size and --seq_length must be >= 1, got ", fl.batch, " and ",
                fl.seq);
  CUTRAIN_CHECK(fl.probe_layers >= 1, "plan: --probe_layers must be >= 1, got ", fl.probe_layers);
  CUTRAIN_CHECK(fl.kernel_timings.empty() || !fl.roofline, "plan: --kernel_timings and --roofline exclude each other");
  const int pp = fl.pp ? fl.pp : fl.num_gpus, tp = fl.tp ? fl.tp : fl.num_gpus;
  CUTRAIN_CHECK(pp >= 1, "plan: --pipeline_parallel_size must be >= 1, got ", pp);
  CUTRAIN_CHECK(tp >= 1, "plan: --tensor_parallel_size must be >= 1, got ", tp);

  train::TrainConfig cfg = train::load_config(fl.config);
  for (const auto& w : cfg.warnings) std::cout << "warning: " << w << "\n";
  if (!cfg.train_micro_batch_size_per_gpu) cfg.train_micro_batch_size_per_gpu = fl.batch;
  cfg.resolve_batch(1);
  const train::PrecisionPlan prec = train::plan_from_config(cfg);
  // What the config asks that the planner's model leaves out: said, not silently dropped.
  if (cfg.optimizer.type == train::OptimizerType::Lamb)
    std::cout << "warning: " << fl.config << ": optimizer.type Lamb: the plan counts AdamW's state and time (the "
              << "same buffers; LAMB's second pass and tensor table are not modelled)\n";
  if (cfg.zero_optimization.offload_optimizer.device != train::OffloadTarget::None)
    std::cout << "warning: " << fl.config << ": zero_optimization.offload_optimizer is not modelled: the plan keeps the "
              << "optimizer state on the GPU\n";
  if (cfg.zero_optimization.offload_param.device != train::OffloadTarget::None)
    std::cout << "warning: " << fl.config << ": zero_optimization.offload_param is not modelled: the plan keeps the "
              << "parameters on the GPU\n";

  parallel::PlanModel m;
  m.dims = model::ModelDims{fl.hidden, fl.layers, fl.heads, fl.vocab, fl.max_seq ? fl.max_seq : fl.seq};
  m.dims.validate();
  CUTRAIN_CHECK(fl.seq <= m.dims.max_seq, "plan: --seq_length ", fl.seq, " exceeds --max_seq_len ", m.dims.max_seq);
  m.micro_batch = fl.batch, m.seq = fl.seq, m.accumulation = cfg.accumulation();
  m.checkpointing = fl.checkpointing;
  m.causal = fl.attention == "causal";
  m.deterministic_attention = cfg.attention_backward == train::AttentionBackward::Deterministic;
  m.state.label = prec.label();
  m.state.params = double(dtype_size(prec.param));
  m.state.grads = double(dtype_size(prec.grad));
  m.state.master = prec.has_master ? 4 : 0;
  m.state.moments = 2.0 * double(dtype_size(prec.moment));
  m.state.compensation = prec.compensation ? 2 : 0;
  m.overlap_comm = cfg.zero_optimization.overlap_comm;
  m.persistence_threshold = std::size_t(std::max<std::int64_t>(0, cfg.zero_optimization.stage3_param_persistence_threshold));

  const std::vector<parallel::Layout> layouts = parallel::make_layouts(fl.layouts, fl.num_gpus, pp, tp);
  for (const parallel::Layout& l : layouts) parallel::check_layout(m, l, fl.num_gpus);
  const parallel::LinkModel link{fl.link_gbps, fl.link_latency_us};

  std::string why;
  const bool gpu = gpu_available(&why);
  DeviceInfo dev;
  if (gpu) dev = device_info();
  const double gpu_mem_gb = fl.gpu_memory_gb > 0 ? fl.gpu_memory_gb : gpu ? double(dev.total_mem) / kGB : 80.0;

  const model::TransformerParams table(m.dims);
  std::cout << "cutrain plan: the BF16 example's model, hidden " << fl.hidden << ", " << fl.layers << " layers, "
            << fl.heads << " heads, vocab " << fl.vocab << ": " << train::with_commas(table.num_params())
            << " parameters\n";
  std::cout << "  precision layout " << prec.label() << " (params " << m.state.params << " + grads " << m.state.grads
            << " + master " << m.state.master << " + compensation " << m.state.compensation << " + moments "
            << m.state.moments << " bytes/param, " << fl.config << "), micro-batch " << fl.batch << " x " << fl.seq
            << ", gradient_accumulation_steps " << m.accumulation << ", activation checkpointing "
            << (m.checkpointing ? "on" : "off") << ", " << (m.causal ? "causal" : "bidirectional") << " attention\n";
  std::cout << "  " << fl.num_gpus << " GPUs, link " << num("%g", fl.link_gbps) << " GB/s per direction, "
            << num("%g", fl.link_latency_us) << " us per ring step"
            << (fl.link_gbps == 450 ? " (the default: NVLink 4 of H100 / H200 SXM, 900 GB/s bidirectional)" : "")
            << "\n";

  // Kernel timings: a report file, the local GPU, or the roofline.
  parallel::KernelTimings kt;
  const std::size_t gb = dtype_size(prec.grad), mb = dtype_size(prec.moment);
  auto check_run = [&](const parallel::TimedRun& run, const std::string& what) {
    model::ModelDims rd = m.dims;
    rd.layers = run.layers;
    const double want = train::model_flops_per_step(model::TransformerParams(rd), fl.batch, fl.seq, run.accumulation,
                                                    m.causal);
    CUTRAIN_CHECK(std::abs(run.model_flops_per_step - want) <= 1e-6 * want, "plan: ", what, ": the timed run's model FLOPs per step (",
                  run.model_flops_per_step, ") are not this model's at its ", run.layers, " layers and ",
                  run.accumulation, " micro-batches (", want, "): time the same --hidden_dim, --num_heads, --vocab_size, "
                  "--batch_size, --seq_length and --attention");
  };
  if (!fl.kernel_timings.empty()) {
    const parallel::TimedRun run =
        parallel::read_timing_report(fl.kernel_timings, gb, mb, prec.has_master, prec.compensation);
    check_run(run, "--kernel_timings " + fl.kernel_timings);
    kt = run.timings;
    kt.source = "timing report " + fl.kernel_timings + " (" + (run.device.empty() ? "device not named" : run.device) +
                ", " + std::to_string(run.steps) + " steps of " + std::to_string(run.layers) + " layers)";
  } else if (gpu && !fl.roofline) {
    const int layers = std::min(fl.layers, fl.probe_layers);
    const ProbeResult pr = probe(fl, m, layers, prec);
    check_run(pr.run, "the profiled run's timing report");
    kt = pr.run.timings;
    kt.source = "measured on this GPU (" + dev.name + "): cutrain train at these shapes with " + std::to_string(layers) +
                " layers, 3 timed steps (per-block times)";
    std::cout << "  memory check of the profiled run (1 GPU, " << layers << " layers): predicted "
              << num("%.3f", pr.predicted_bytes / kGB) << " GB, allocator peak " << num("%.3f", pr.peak_bytes / kGB)
              << " GB (" << num("%+.1f%%", 100 * (pr.predicted_bytes - pr.peak_bytes) / pr.peak_bytes) << ")\n";
  } else {
    parallel::DevicePeakRates peaks;
    if (gpu && datasheet_bf16_tflops(dev.name) > 0) {
      peaks.device = dev.name + " (datasheet)";
      peaks.tflops = datasheet_bf16_tflops(dev.name);
      peaks.gbps = dev.name.find("H200") != std::string::npos ? 4800 : 3350;
    } else {
      peaks.device = "H100 SXM (datasheet; the default without a GPU)";
    }
    if (fl.peak_tflops > 0) peaks.tflops = fl.peak_tflops, peaks.device = "the given peaks";
    if (fl.peak_gbps > 0) peaks.gbps = fl.peak_gbps, peaks.device = "the given peaks";
    kt = parallel::roofline_timings(m.dims, fl.batch, fl.seq, m.causal, gb, mb, prec.has_master, prec.compensation, peaks);
    if (!gpu) kt.source += "; no GPU here (" + why + ")";
  }
  std::cout << "  kernel timings: " << kt.source << "\n";
  std::cout << "    per micro-batch: embedding " << num("%.3f", 1e3 * (kt.embed_fwd + kt.embed_bwd)) << " ms, block fwd "
            << num("%.3f", 1e3 * kt.layer_fwd) << " ms + bwd " << num("%.3f", 1e3 * kt.layer_bwd) << " ms"
            << (m.checkpointing ? " + recompute " + num("%.3f", 1e3 * (kt.layer_recompute > 0 ? kt.layer_recompute : kt.layer_fwd)) + " ms" : "")
            << " (LayerNorms " << num("%.1f%%", 100 * kt.layer_replicated_fraction) << "), head "
            << num("%.3f", 1e3 * (kt.head_fwd + kt.head_bwd)) << " ms; optimizer " << num("%.3f", 1e9 * kt.optimizer_per_elem)
            << " ns/element, grad norm " << num("%.3f", 1e9 * kt.grad_norm_per_elem) << " ns/element\n";

  std::vector<parallel::LayoutPrediction> rows;
  for (const parallel::Layout& l : layouts) {
    rows.push_back(parallel::predict(m, l, kt, link));
    const parallel::LayoutPrediction& r = rows.back();
    if (l.kind == parallel::LayoutKind::Pipeline) {
      const auto pl = parallel::pipeline_layers(table);
      const auto plan = parallel::make_pipeline_plan(pl, parallel::parse_partition_method("parameters"), l.pp, m.accumulation);
      std::cout << "  " << l.name() << ": " << plan.describe(pl) << "; memory of stage " << r.memory_stage
                << " (the most loaded)\n";
      if (m.accumulation == 1 && l.pp > 1)
        std::cout << "  warning: " << l.name() << " with gradient_accumulation_steps 1: one micro-batch per step, no "
                  << "stage overlaps another\n";
    } else if (l.kind == parallel::LayoutKind::Tensor && l.tp > 1) {
      std::cout << "  " << l.name() << ": Megatron partition (QKV and FC1 by columns, out_proj and FC2 by rows, "
                << "vocabulary-parallel embedding and loss): per block and micro-batch "
                << parallel::tp_allreduces_per_layer(m, l.tp) << " all-reduces of "
                << num("%.2f", double(fl.batch) * fl.seq * fl.hidden * 2 / (1 << 20)) << " MiB = "
                << num("%.2f", parallel::tp_allreduce_bytes_per_layer(m, l.tp) / (1 << 20)) << " MiB ("
                << num("%.3f", 1e3 * parallel::tp_allreduces_per_layer(m, l.tp) *
                                 parallel::allreduce_seconds(double(fl.batch) * fl.seq * fl.hidden * 2, l.tp, link))
                << " ms on the link)\n";
    }
  }
  // The persistent state alone, for every precision layout and ZeRO stage at dp = num_gpus.
  std::cout << "\nPersistent state per GPU (params + grads + optimizer, GB) by precision layout and ZeRO stage, dp = "
            << fl.num_gpus << ":\n";
  std::cout << "| precision layout            | bytes/param |  zero0 |  zero1 |  zero2 |  zero3 |\n";
  std::cout << "|-----------------------------|------------:|-------:|-------:|-------:|-------:|\n";
  for (const auto& [layout, comp] : {std::pair{kernels::OptimizerLayout::Baseline, false},
                                     std::pair{kernels::OptimizerLayout::Bf16MasterWG, false},
                                     std::pair{kernels::OptimizerLayout::Bf16Full, false},
                                     std::pair{kernels::OptimizerLayout::Bf16MasterWG, true},
                                     std::pair{kernels::OptimizerLayout::Bf16Full, true}}) {
    const train::PrecisionPlan p = train::plan_for(layout, m.accumulation, comp);
    parallel::PlanModel pm = m;
    pm.state = parallel::StateBytes{p.label(), double(dtype_size(p.param)), double(dtype_size(p.grad)),
                                    p.has_master ? 4.0 : 0.0, 2.0 * double(dtype_size(p.moment)), p.compensation ? 2.0 : 0.0};
    char line[160];
    std::snprintf(line, sizeof line, "| %-27s | %11zu |", p.label().c_str(), p.bytes_per_param());
    std::cout << line;
    for (int stage = 0; stage <= 3; ++stage) {
      const parallel::MemoryBreakdown mem =
          fl.num_gpus > 1 ? parallel::zero_rank_memory(pm, stage, fl.num_gpus) : parallel::single_gpu_memory(pm);
      std::snprintf(line, sizeof line, " %6.2f |", (mem.params + mem.grads + mem.optimizer) / kGB);
      std::cout << line;
    }
    std::cout << (p.label() == prec.label() ? "  <- " + fl.config : std::string()) << "\n";
  }
  std::cout << "\nPredicted per GPU (GB = 1024^3 bytes; predictions of cutrain's engine, not measurements):\n";
  std::cout << parallel::format_plan_table(rows, gpu_mem_gb);
  std::cout << "  fits: total <= " << num("%.1f", gpu_mem_gb) << " GB"
            << (fl.gpu_memory_gb > 0 ? " (--gpu_memory_gb)" : gpu ? " (this GPU)" : " (80 GB H100 SXM; --gpu_memory_gb)")
            << "; comm s: the exposed part (* = some hidden behind compute)\n";
  for (const parallel::LayoutPrediction& r : rows) std::cout << "  " << r.layout.name() << ": " << r.note << "\n";
  return 0;
}

}  // namespace

CLI::App* setup_plan_command(CLI::App& parent, int& exit_code) {
  static PlanFlags f;
  CLI::App* sub = parent.add_subcommand(
      "plan", "Predict per-GPU memory and step time of ZeRO 0-3, pipeline and tensor-parallel layouts");
  sub->add_option("--deepspeed_config", f.config, "DeepSpeed-style JSON config (precision layout, accumulation, ZeRO)")
      ->required();
  sub->add_option("--hidden_dim", f.hidden, "Hidden size")->capture_default_str();
  sub->add_option("--num_layers", f.layers, "Transformer blocks")->capture_default_str();
  sub->add_option("--num_heads", f.heads, "Attention heads")->capture_default_str();
  sub->add_option("--vocab_size", f.vocab, "Vocabulary size")->capture_default_str();
  sub->add_option("--batch_size", f.batch, "Micro batch size per GPU")->capture_default_str();
  sub->add_option("--seq_length", f.seq, "Sequence length")->capture_default_str();
  sub->add_option("--max_seq_len", f.max_seq, "Rows of the position table (not given: --seq_length)");
  sub->add_flag("--activation_checkpointing", f.checkpointing, "Recompute each block in backward");
  sub->add_option("--attention", f.attention, "causal or bidirectional")
      ->capture_default_str()
      ->check(CLI::IsMember({"causal", "bidirectional"}));
  sub->add_option("--num_gpus", f.num_gpus, "GPUs to plan for")->required();
  sub->add_option("--link_gbps", f.link_gbps,
                  "Link bandwidth per GPU and direction in GB/s (gigabytes, 1e9 bytes/s; 450: NVLink 4)")
      ->capture_default_str();
  sub->add_option("--link_latency_us", f.link_latency_us, "Latency of one ring step, microseconds")->capture_default_str();
  sub->add_option("--layouts", f.layouts, "Comma list of zero0, zero1, zero2, zero3, pp, tp")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--pipeline_parallel_size", f.pp, "Stages of the pp layout (not given: --num_gpus)");
  sub->add_option("--tensor_parallel_size", f.tp, "Degree of the tp layout (not given: --num_gpus)");
  sub->add_option("--kernel_timings", f.kernel_timings,
                  "A timing report JSON (cutrain train --timing_report FILE at the same shapes) to take the kernel "
                  "times from");
  sub->add_flag("--roofline", f.roofline, "Roofline kernel times from device peaks even with a GPU present");
  sub->add_option("--peak_tflops", f.peak_tflops, "Roofline: dense bf16 TFLOP/s (default: the GPU's datasheet, else H100 SXM 989.4)");
  sub->add_option("--peak_gbps", f.peak_gbps, "Roofline: memory GB/s (default: H200 4800 / H100 SXM 3350)");
  sub->add_option("--gpu_memory_gb", f.gpu_memory_gb, "Memory per GPU for the fits column (default: this GPU's, else 80)");
  sub->add_option("--probe_layers", f.probe_layers, "Blocks of the profiled run on a local GPU")->capture_default_str();
  sub->callback([&exit_code] { exit_code = run_plan(f); });
  return sub;
}

}  // namespace cutrain::tools
