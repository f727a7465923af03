// @brief Benchmarks of LAMB's kernel pair (kernels/lamb.cuh) against AdamW's one launch over the
// same flat buffer and against copy bandwidth, per precision layout, nearest and stochastic rounding:
//   lamb/<baseline|bf16_master_wg|bf16_full>[_sr]/<tensors>, tensors = bert_large (BERT-Large's
//   336M parameters in its 392 tensors, 64-aligned as the model's flat buffer) or small (4096
//   tensors of 1031 elements: the per-chunk reduction's overhead).
// Counters: frac_copy_bw (lamb_bytes_per_param x n over the median, against the process's
// device-to-device copy bandwidth), vs_adam (LAMB's median over AdamW's on the same buffers, the
// AdamW launch timed before and after in the same call, the mean of the two) and bytes_vs_adam
// (the bytes each must move: what vs_adam would be at equal bandwidth).
#include <benchmark/benchmark.h>

#include <functional>
#include <string>
#include <vector>

#include "bench/support/bench_support.h"
#include "kernels/adamw.cuh"
#include "kernels/lamb.cuh"
#include "runtime/check.h"

using namespace cutrain;
using kernels::OptimizerLayout;

namespace {

using DevBuf = bench::DeviceBuffer;
using bench::fill_uniform;

const char* layout_tag(OptimizerLayout l) {
  switch (l) {
    case OptimizerLayout::Baseline: return "baseline";
    case OptimizerLayout::Bf16MasterWG: return "bf16_master_wg";
    case OptimizerLayout::Bf16Full: return "bf16_full";
  }
  return "?";
}

std::size_t align64(std::size_t x) { return (x + 63) / 64 * 64; }

// BERT-Large (hidden 1024, 24 layers, intermediate 4096, vocab 30528, 512 positions, 2 token types):
// its parameter tensors in a 64-aligned flat buffer; `total` gets the buffer's size.
std::vector<kernels::LambTensor> bert_large(std::size_t& total) {
  const std::size_t h = 1024, f = 4096;
  std::vector<std::size_t> sizes{30528 * h, 512 * h, 2 * h, h, h};  // embeddings and their LayerNorm
  for (int l = 0; l < 24; ++l)
    for (std::size_t s : {3 * h * h, 3 * h, h * h, h, h, h, f * h, f, h * f, h, h, h}) sizes.push_back(s);
  std::vector<kernels::LambTensor> t;
  std::size_t at = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    t.push_back({at, sizes[k], sizes[k] > h});  // matrices and embeddings decay, vectors do not
    at = align64(at + sizes[k]);
  }
  total = at;
  return t;
}

std::vector<kernels::LambTensor> small_tensors(std::size_t& total) {
  std::vector<kernels::LambTensor> t;
  std::size_t at = 0;
  for (int k = 0; k < 4096; ++k) {
    t.push_back({at, 1031, true});
    at = align64(at + 1031);
  }
  total = at;
  return t;
}

void bench_lamb(benchmark::State& state, OptimizerLayout layout, bool sr, bool bert) {
  if (!bench::require_gpu(state)) return;
  std::size_t n = 0;
  const std::vector<kernels::LambTensor> tensors = bert ? bert_large(n) : small_tensors(n);
  const bool full = layout == OptimizerLayout::Bf16Full;
  const std::size_t msz = full ? sizeof(bf16) : sizeof(float);
  DevBuf params(n * sizeof(bf16)), grads(n * sizeof(bf16)), m(n * msz), v(n * msz),
      master(layout == OptimizerLayout::Baseline ? n * sizeof(float) : 0);
  fill_uniform(params.as<bf16>(), n, -0.05f, 0.05f, 3);
  fill_uniform(grads.as<bf16>(), n, -1e-3f, 1e-3f, 4);
  if (layout == OptimizerLayout::Baseline) fill_uniform(master.as<float>(), n, -0.05f, 0.05f, 3);
  if (full) {
    fill_uniform(m.as<bf16>(), n, -1e-4f, 1e-4f, 5);
    fill_uniform(v.as<bf16>(), n, 0.f, 1e-7f, 6);
  } else {
    fill_uniform(m.as<float>(), n, -1e-4f, 1e-4f, 5);
    fill_uniform(v.as<float>(), n, 0.f, 1e-7f, 6);
  }
  const kernels::LambPlan plan = kernels::LambPlan::make(tensors);
  std::vector<unsigned char> packed(plan.table_bytes());
  plan.pack(packed.data());
  DevBuf table(packed.size()), ws(plan.workspace_bytes());
  CUTRAIN_CUDA_CHECK(cudaMemcpy(table.get(), packed.data(), packed.size(), cudaMemcpyHostToDevice));
  CUTRAIN_CUDA_CHECK(cudaMemset(ws.get(), 0, plan.workspace_bytes()));
  const kernels::LambDeviceTable t = kernels::lamb_device_table(plan, table.get(), ws.get());
  float* mas = layout == OptimizerLayout::Baseline ? master.as<float>() : nullptr;

  kernels::LambParams lp;
  lp.weight_decay = 0.01f;
  lp.stochastic_rounding = sr;
  lp.seed = 42;
  kernels::AdamParams ap;
  ap.weight_decay = 0.01f;
  ap.stochastic_rounding = sr;
  ap.seed = 42;
  int step = 0;
  auto adam = [&](cudaStream_t s) {
    ap.step = ++step;
    kernels::adam_step(s, layout, ap, params.as<bf16>(), grads.get(), DType::BF16, mas, m.get(), v.get(), n, nullptr,
                       nullptr);
  };
  const double before = bench::time_median(adam, 15).median_us;
  const double bytes = kernels::lamb_bytes_per_param(layout, DType::BF16) * static_cast<double>(n);
  const bench::Timing timing = bench::run_timed(
      state,
      [&](cudaStream_t s) {
        lp.step = ++step;
        kernels::lamb_step(s, layout, lp, t, params.as<bf16>(), grads.get(), DType::BF16, mas, m.get(), v.get(),
                           nullptr, nullptr);
      },
      bytes, 0);
  const double after = bench::time_median(adam, 15).median_us;
  state.counters["params"] = static_cast<double>(n);
  state.counters["tensors"] = static_cast<double>(tensors.size());
  state.counters["bytes_per_param"] = kernels::lamb_bytes_per_param(layout, DType::BF16);
  state.counters["vs_adam"] = timing.median_us / (0.5 * (before + after));
  state.counters["bytes_vs_adam"] =
      kernels::lamb_bytes_per_param(layout, DType::BF16) / kernels::adam_bytes_per_param(layout, DType::BF16);
}

void register_all() {
  for (bool bert : {true, false})
    for (OptimizerLayout l : {OptimizerLayout::Baseline, OptimizerLayout::Bf16MasterWG, OptimizerLayout::Bf16Full})
      for (bool sr : {false, true}) {
        const std::string name = std::string("lamb/") + layout_tag(l) + (sr ? "_sr/" : "/") + (bert ? "bert_large" : "small");
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { bench_lamb(st, l, sr, bert); })
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
}

}  // namespace

int main(int argc, char** argv) { return cutrain::bench::run_benchmarks(argc, argv, register_all); }
