// `cutrain offload-bench`: DeepSpeedExamples' training/offload_states/offload_states.py. Each
// iteration trains one step of the SimpleModel, times offload_states and reload_states, checks
// that allocated device memory fell and rose again, and prints the example's lines; the summary
// goes to offload_states.log. Added: the achieved GB/s and its ratio to a raw cudaMemcpyAsync of
// the same states between the same buffers, measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>

#include "runtime/allocator.h"
#include "runtime/check.h"
#include "tools/commands.h"
#include "tools/offload_model/offload_model.h"

namespace cutrain::tools {
namespace {

struct OffloadBenchArgs {
  std::vector<std::string> included_state;
  bool pin_memory = false, non_blocking = false, no_pageable_staging = false, no_extras = false;
  int nlayers = 1, hidden_dim = 1024, iteration = 10, warmup = 5;
  std::string dtype = "torch.bfloat16", log = "offload_states.log", device = "cpu", nvme_path;
  std::uint64_t seed = 42;
};

DType parse_dtype(const std::string& s) {
  std::string t = s.rfind("torch.", 0) == 0 ? s.substr(6) : s;
  if (t == "bfloat16" || t == "bf16") return DType::BF16;
  if (t == "float16" || t == "fp16" || t == "half") return DType::F16;
  if (t == "float32" || t == "fp32" || t == "float") return DType::F32;
  CUTRAIN_FAIL("--dtype: expected torch.bfloat16, torch.float16 or torch.float32, got '", s, "'");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const char* py_bool(bool b) { return b ? "True" : "False"; }

std::string include_str(const std::vector<std::string>& inc) {
  if (inc.empty()) return "None";
  std::string s = "[";
  for (std::size_t i = 0; i < inc.size(); ++i) s += (i ? ", " : "") + inc[i];
  return s + "]";
}

// One raw cudaMemcpyAsync per state between the offloader's own host buffers and the states,
// on a fresh stream, wall time around enqueue + synchronize; median of `reps`.
double raw_copy_seconds(StateOffloader& off, const std::vector<std::string>& names, bool to_host, int reps) {
  Stream s;
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& n : names) {
      void* d = off.device_ptr(n);
      void* h = const_cast<void*>(off.host_buffer(n));
      CUTRAIN_CHECK(d && h, "raw copy anchor: state '", n, "' has no device or host buffer");
      if (to_host) CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(h, d, off.bytes(n), cudaMemcpyDeviceToHost, s.get()));
      else CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(d, h, off.bytes(n), cudaMemcpyHostToDevice, s.get()));
    }
    s.synchronize();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

int run_offload_bench(const OffloadBenchArgs& a) {
  CUTRAIN_CHECK(a.iteration > a.warmup, "--iteration (", a.iteration, ") must exceed --warmup (", a.warmup,
                "): the summary averages the iterations after the warm-up");
  CUTRAIN_CHECK(a.warmup >= 0, "--warmup must be >= 0, got ", a.warmup);
  OffloadModelOptions mo;
  mo.hidden = a.hidden_dim;
  mo.nlayers = a.nlayers;
  mo.dtype = parse_dtype(a.dtype);
  mo.lr = 1e-6f;
  mo.seed = a.seed;
  OffloadOptions oo;
  oo.device = parse_offload_device(a.device);
  oo.pin_memory = a.pin_memory;
  oo.non_blocking = a.non_blocking;
  oo.nvme_path = a.nvme_path;
  oo.pageable_staging = !a.no_pageable_staging;

  OffloadModel m(mo);
  CachingAllocator& alloc = device_allocator();
  StateOffloader& off = m.offloader();
  std::vector<std::string> names = a.included_state.empty() ? off.names() : a.included_state;
  for (const auto& n : names) (void)off.bytes(n);  // unknown names: the error lists the valid ones
  std::size_t moved = 0;
  for (const auto& n : names) moved += off.bytes(n);
  std::cout << "offload-bench: SimpleModel hidden_dim=" << a.hidden_dim << " nlayers=" << a.nlayers << ", "
            << m.param_count() << " parameters, " << dtype_name(mo.dtype) << ", training state "
            << format_bytes(double(m.state_bytes())) << ", offloading " << format_bytes(double(moved)) << " ("
            << include_str(names) << ") to " << offload_device_name(oo.device) << "\n";

  std::mt19937_64 rng(a.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(std::size_t(a.hidden_dim));
  std::vector<double> t_off, t_load, t_off_done, t_load_done;
  for (int i = 0; i < a.iteration; ++i) {
    for (float& v : x) v = normal(rng);
    const int label = int(rng() % std::uint64_t(a.hidden_dim));
    m.step(x.data(), label);

    const std::int64_t alloc_before = alloc.stats().allocated_bytes.current;
    auto t0 = std::chrono::steady_clock::now();
    m.offload_states(a.included_state, oo);
    t_off.push_back(seconds_since(t0));
    std::int64_t alloc_after = alloc.stats().allocated_bytes.current;
    off.synchronize();  // non-blocking: when the copies really finished (for GB/s)
    t_off_done.push_back(seconds_since(t0));
    // A non-blocking NVMe offload is a background write that holds the device memory until it lands.
    if (oo.device == OffloadDevice::Nvme && oo.non_blocking) alloc_after = alloc.stats().allocated_bytes.current;
    CUTRAIN_CHECK(alloc_after < alloc_before, "iteration ", i, ": allocated memory did not decrease after offload (",
                  alloc_before, " -> ", alloc_after, " bytes)");

    t0 = std::chrono::steady_clock::now();
    m.reload_states(a.non_blocking);
    t_load.push_back(seconds_since(t0));
    off.synchronize();
    t_load_done.push_back(seconds_since(t0));
    const std::int64_t alloc_reloaded = alloc.stats().allocated_bytes.current;
    CUTRAIN_CHECK(alloc_after < alloc_reloaded, "iteration ", i, ": allocated memory did not increase after reload (",
                  alloc_after, " -> ", alloc_reloaded, " bytes)");
    std::cout << "Memory usage (" << i << "): include=" << include_str(a.included_state)
              << ", pin_memory=" << py_bool(a.pin_memory) << ", non_blocking=" << py_bool(a.non_blocking)
              << " alloc_before_offload=" << alloc_before << " alloc_after_offload=" << alloc_after << "\n";
  }
  auto drop = [&](std::vector<double>& v) { v.erase(v.begin(), v.begin() + a.warmup); };
  drop(t_off), drop(t_load), drop(t_off_done), drop(t_load_done);
  const double offload_time = mean(t_off), load_time = mean(t_load);
  {
    std::ofstream f(a.log, std::ios::app);
    CUTRAIN_CHECK(f.good(), "cannot append to the log '", a.log, "'");
    f << std::setprecision(17) << (a.pin_memory ? 1 : 0) << "," << (a.non_blocking ? 1 : 0) << "," << offload_time
      << "," << load_time << "\n";
    CUTRAIN_CHECK(f.good(), "writing the log '", a.log, "' failed");
  }
  std::cout << std::setprecision(17) << "Summary: pin_memory=" << py_bool(a.pin_memory)
            << " non_blocking=" << py_bool(a.non_blocking) << " offload=" << offload_time << " load=" << load_time
            << "\n";

  const double gb = double(moved) / 1e9;
  const double off_s = mean(t_off_done), load_s = mean(t_load_done);
  std::cout << std::fixed << std::setprecision(2) << "Bandwidth: offload " << gb / off_s << " GB/s, load "
            << gb / load_s << " GB/s (" << format_bytes(double(moved)) << " per direction, copies complete";
  if (a.no_extras) {
    std::cout << ")\n";
    return 0;
  }
  if (oo.device == OffloadDevice::Cpu) {
    // The anchor: the same bytes between the same device states and host buffers, raw.
    const double raw_d2h = raw_copy_seconds(off, names, true, 3), raw_h2d = raw_copy_seconds(off, names, false, 3);
    std::cout << "); raw cudaMemcpyAsync (" << (a.pin_memory ? "pinned" : "pageable, the driver's path") << ") D2H " << gb / raw_d2h
              << " GB/s, H2D " << gb / raw_h2d << " GB/s; ratio offload/raw " << raw_d2h / off_s
              << ", load/raw " << raw_h2d / load_s << "\n";
  } else {
    std::cout << ")\n";
    return 0;
  }

  // Overlap: a non-blocking round trip followed at once by a step (which waits for each state
  // just before its first use), against a step and a blocking round trip done in turn.
  OffloadOptions blocking = oo, nb = oo;
  blocking.non_blocking = false;
  nb.non_blocking = true;
  const int label = int(rng() % std::uint64_t(a.hidden_dim));
  auto t0 = std::chrono::steady_clock::now();
  m.step(x.data(), label);
  const double t_step = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  m.offload_states(a.included_state, blocking);
  m.reload_states(false);
  const double t_rt = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  m.offload_states(a.included_state, nb);
  m.reload_states(true);
  m.step(x.data(), label);
  off.synchronize();
  const double t_both = seconds_since(t0);
  std::cout << std::setprecision(4) << "Overlap: step " << t_step << " s, blocking round trip " << t_rt
            << " s, non-blocking round trip + step " << t_both << " s (in turn: " << t_step + t_rt << " s)\n";
  return 0;
}

}  // namespace

CLI::App* setup_offload_bench_command(CLI::App& parent, int& exit_code) {
  auto* a = new OffloadBenchArgs;  // lives for the process, like the CLI app
  CLI::App* sub = parent.add_subcommand(
      "offload-bench", "Offload training state to host memory and back (DeepSpeedExamples offload_states)");
  sub->add_option("--included_state", a->included_state,
                  "States to offload (default: all): optim_states, hp_params, lp_params, lp_grads")
      ->check(CLI::IsMember({"optim_states", "hp_params", "lp_params", "lp_grads", "contiguous_grad_buffer"}));
  sub->add_flag("--pin_memory", a->pin_memory, "Offload to pinned host memory");
  sub->add_flag("--non_blocking", a->non_blocking, "Non-blocking copies");
  sub->add_option("--nlayers", a->nlayers, "Linear layers")->capture_default_str();
  sub->add_option("--hidden_dim", a->hidden_dim, "Hidden size (and classes)")->capture_default_str();
  sub->add_option("--dtype", a->dtype, "torch.bfloat16 | torch.float16 | torch.float32")->capture_default_str();
  sub->add_option("--iteration", a->iteration, "Iterations")->capture_default_str();
  sub->add_option("--warmup", a->warmup, "Warm-up iterations left out of the summary")->capture_default_str();
  sub->add_option("--log", a->log, "File the summary line is appended to")->capture_default_str();
  sub->add_option("--device", a->device, "cpu | nvme")->capture_default_str();
  sub->add_option("--nvme_path", a->nvme_path, "Folder for --device nvme");
  sub->add_flag("--no_pageable_staging", a->no_pageable_staging,
                "Pageable copies with the driver's cudaMemcpyAsync instead of the staged copier");
  sub->add_flag("--no_extras", a->no_extras, "Skip the raw-copy anchor and the overlap measurement (sweeps)");
  sub->add_option("--seed", a->seed, "Seed of the model and the data")->capture_default_str();
  sub->callback([a, &exit_code] { exit_code = run_offload_bench(*a); });
  return sub;
}

}  // namespace cutrain::tools
