// @brief Benchmarks of the k3 kernels: fused cross-entropy forward+backward, Adam/AdamW in each
// precision layout, the global gradient norm. Names match bench/peers/k3_peer.py:
//   cross_entropy/fwdbwd/<rows>x<vocab>, adamw/<baseline|bf16_master_wg|bf16_full>[_sr]/<n>,
//   grad_norm/<bf16|fp32>/<n>; and ours only, adamw/<bf16_master_wg|bf16_full>_comp/<n>: the
//   compensated bf16 master, with counter vs_plain = its median over the plain layout's median
//   on the same buffers in the same call (the plain launch timed before and after it; target <= 1.05).
// Bytes are what each kernel must move: cross-entropy reads the logits once and writes dlogits
// once (plus labels and row losses: 2 * 2 * vocab + 8 bytes per row, the floor of any fused
// kernel; counter ctas_per_row: the cluster size of its row kernel); AdamW moves adam_bytes_per_param(layout) per parameter;
// the norm reads the gradients once. Cross-entropy runs in place, so after the first call the
// buffer holds gradients: its cost does not depend on the values (every element takes the same
// two exponentials), so timing repeated calls on it is fair.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "bench/support/bench_support.h"
#include "kernels/adamw.cuh"
#include "kernels/common/stochastic_round.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/reduce.cuh"
#include "runtime/check.h"

using namespace cutrain;
using kernels::OptimizerLayout;

namespace {

using DevBuf = bench::DeviceBuffer;
using bench::fill_uniform;


using bench::reg;

// ---- cross-entropy ----
void bench_cross_entropy(benchmark::State& state, int rows, int vocab) {
  if (!bench::require_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(rows) * vocab;
  DevBuf logits(n * sizeof(bf16)), labels(rows * sizeof(int32_t)), loss(sizeof(float)), row_loss(rows * sizeof(float)),
      status(sizeof(int)), scratch(kernels::cross_entropy_scratch_bytes(rows));
  fill_uniform(logits.as<bf16>(), n, -4.f, 4.f, 1);
  bench::fill_classes(labels.as<int32_t>(), rows, vocab, 2);
  const double bytes = 2.0 * n * sizeof(bf16) + rows * (sizeof(int32_t) + sizeof(float));
  bench::run_timed(
      state,
      [&](cudaStream_t s) {
        kernels::cross_entropy_forward_backward(s, logits.as<bf16>(), labels.as<int32_t>(), rows, vocab, vocab,
                                                loss.as<float>(), row_loss.as<float>(), status.as<int>(),
                                                scratch.as<void>(), -100, 1.f);
      },
      bytes, 0);
  state.counters["extra_bytes"] = static_cast<double>(kernels::cross_entropy_scratch_bytes(rows));
  state.counters["ctas_per_row"] = kernels::cross_entropy_ctas_per_row(vocab);
}

// ---- AdamW ----
const char* layout_tag(OptimizerLayout l) {
  switch (l) {
    case OptimizerLayout::Baseline: return "baseline";
    case OptimizerLayout::Bf16MasterWG: return "bf16_master_wg";
    case OptimizerLayout::Bf16Full: return "bf16_full";
  }
  return "?";
}

void bench_adam(benchmark::State& state, OptimizerLayout layout, std::size_t n, bool sr, bool comp = false) {
  if (!bench::require_gpu(state)) return;
  const bool full = layout == OptimizerLayout::Bf16Full;
  const std::size_t msz = full ? sizeof(bf16) : sizeof(float);
  DevBuf params(n * sizeof(bf16)), grads(n * sizeof(bf16)), m(n * msz), v(n * msz),
      master(layout == OptimizerLayout::Baseline ? n * sizeof(float) : 0), cbuf(comp ? n * sizeof(bf16) : 0);
  fill_uniform(params.as<bf16>(), n, -0.05f, 0.05f, 3);
  if (comp) fill_uniform(cbuf.as<bf16>(), n, -1e-5f, 1e-5f, 8);  // below half an ulp of the weights
  fill_uniform(grads.as<bf16>(), n, -1e-3f, 1e-3f, 4);
  if (layout == OptimizerLayout::Baseline) fill_uniform(master.as<float>(), n, -0.05f, 0.05f, 3);
  if (full) {
    fill_uniform(m.as<bf16>(), n, -1e-4f, 1e-4f, 5);
    fill_uniform(v.as<bf16>(), n, 0.f, 1e-7f, 6);
  } else {
    fill_uniform(m.as<float>(), n, -1e-4f, 1e-4f, 5);
    fill_uniform(v.as<float>(), n, 0.f, 1e-7f, 6);
  }
  kernels::AdamParams p;
  p.weight_decay = 0.01f;
  p.stochastic_rounding = sr;
  p.seed = 42;
  int step = 0;
  auto launch = [&](cudaStream_t s, bf16* c) {
    p.step = ++step;
    kernels::adam_step(s, layout, p, params.as<bf16>(), grads.as<void>(), DType::BF16,
                       layout == OptimizerLayout::Baseline ? master.as<float>() : nullptr, m.as<void>(), v.as<void>(),
                       n, nullptr, nullptr, c);
  };
  auto plain = [&](cudaStream_t s) { launch(s, nullptr); };
  // The anchor of a compensated row: the plain launch, before and after, the mean of the two medians.
  const double before = comp ? bench::time_median(plain, 15).median_us : 0;
  const bench::Timing t = bench::run_timed(
      state, [&](cudaStream_t s) { launch(s, comp ? cbuf.as<bf16>() : nullptr); },
      kernels::adam_bytes_per_param(layout, DType::BF16, comp) * static_cast<double>(n), 0);
  state.counters["bytes_per_param"] = kernels::adam_bytes_per_param(layout, DType::BF16, comp);
  if (comp) {
    const double after = bench::time_median(plain, 15).median_us;
    state.counters["vs_plain"] = t.median_us / (0.5 * (before + after));
  }
}

// ---- grad norm ----
void bench_grad_norm(benchmark::State& state, DType gt, std::size_t n) {
  if (!bench::require_gpu(state)) return;
  DevBuf g(n * dtype_size(gt)), out(3 * sizeof(float)), scratch(kernels::grad_norm_scratch_bytes(n));
  if (gt == DType::BF16) fill_uniform(g.as<bf16>(), n, -1e-2f, 1e-2f, 7);
  else fill_uniform(g.as<float>(), n, -1e-2f, 1e-2f, 7);
  float* o = out.as<float>();
  bench::run_timed(
      state,
      [&](cudaStream_t s) {
        kernels::grad_norm_clip(s, g.as<void>(), gt, n, 1.f, o, o + 1, reinterpret_cast<int*>(o + 2), scratch.as<void>());
      },
      static_cast<double>(n) * dtype_size(gt), 0);
}

void register_all() {
  for (auto rv : {std::pair{2048, 50000}, std::pair{8192, 50304}, std::pair{16384, 50304}, std::pair{8192, 50257},
                  std::pair{2048, 262144}}) {
    const int rows = rv.first, vocab = rv.second;
    const std::string shape = std::to_string(rows) + "x" + std::to_string(vocab);
    reg("cross_entropy/fwdbwd/" + shape, [=](benchmark::State& st) { bench_cross_entropy(st, rows, vocab); });
  }
  for (std::size_t n : {std::size_t(254128976), std::size_t(1300000000)})
    for (OptimizerLayout l : {OptimizerLayout::Baseline, OptimizerLayout::Bf16MasterWG, OptimizerLayout::Bf16Full})
      for (bool sr : {false, true})
        reg(std::string("adamw/") + layout_tag(l) + (sr ? "_sr/" : "/") + std::to_string(n),
            [=](benchmark::State& st) { bench_adam(st, l, n, sr); });
  for (std::size_t n : {std::size_t(254128976), std::size_t(1300000000)})
    for (OptimizerLayout l : {OptimizerLayout::Bf16MasterWG, OptimizerLayout::Bf16Full})
      reg(std::string("adamw/") + layout_tag(l) + "_comp/" + std::to_string(n),
          [=](benchmark::State& st) { bench_adam(st, l, n, false, true); });
  for (std::size_t n : {std::size_t(254128976), std::size_t(1300000000)}) {
    reg("grad_norm/bf16/" + std::to_string(n), [=](benchmark::State& st) { bench_grad_norm(st, DType::BF16, n); });
    reg("grad_norm/fp32/" + std::to_string(n), [=](benchmark::State& st) { bench_grad_norm(st, DType::F32, n); });
  }
}

}  // namespace

int main(int argc, char** argv) { return cutrain::bench::run_benchmarks(argc, argv, register_all); }
