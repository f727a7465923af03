// One training step of the BF16 example's default model (h 1024, 12 layers, 16 heads, vocab 50000,
// batch 4, seq 512) per precision layout, CUDA graph on: the figure `cutrain train` reports as
// avg_step_time, comparable to bench/peers/train_peer.py's rows of the same names.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <random>

#include "bench/support/bench_support.h"
#include "train/config.h"
#include "train/engine.h"

namespace {

using namespace cutrain;

void BM_TrainStep(benchmark::State& state, const char* layout) {
  if (!bench::require_gpu(state)) return;
  train::BackendOptions o;  // the BF16 example's defaults
  o.dims = model::ModelDims{1024, 12, 16, 50000, 512};
  o.batch = 4;
  o.seq = 512;
  train::TrainConfig cfg = train::load_config(std::string("configs/") + layout + ".json");
  cfg.resolve_batch(1);
  auto eng = std::make_unique<train::GpuEngine>(o, cfg);
  const std::size_t n = std::size_t(o.batch) * o.seq * cfg.accumulation();
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<std::int32_t> d(0, o.dims.vocab - 1);
  std::vector<std::int32_t> tok(n), lab(n);
  int step = 0;
  auto one = [&] {
    for (auto& t : tok) t = d(rng);
    for (auto& l : lab) l = d(rng);
    return eng->step(tok.data(), lab.data(), ++step, 1e-4f);
  };
  for (int i = 0; i < 3; ++i) one();  // eager step, graph capture, first replay
  bench::Timing t;
  std::vector<double> us;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    one();  // ends with a sync (the loss read), like the training loop
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(s);
    us.push_back(s * 1e6);
  }
  std::sort(us.begin(), us.end());
  t.samples = int(us.size());
  t.median_us = us[us.size() / 2];
  t.min_us = us.front();
  t.p90_us = us[us.size() * 9 / 10];
  // 6 FLOPs per parameter per token in the GEMMs, plus attention (forward 1x, backward 2.5x).
  const double L = 12, h = 1024, V = 50000, S = 512, B = 4, T = B * S;
  const double gemm = 6.0 * T * (L * 12 * h * h + V * h);
  const double attn = 3.5 * 4.0 * B * S * S * h * L;
  bench::set_counters(state, t, 0, (gemm + attn) * cfg.accumulation());
  state.counters["peak_GB"] = double(eng->memory().peak) / (1 << 30);
}

BENCHMARK_CAPTURE(BM_TrainStep, baseline, "baseline")
    ->Name("train/step/h1024_l12_b4_s512_baseline")->UseManualTime()->Iterations(10)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainStep, bf16_master_wg, "bf16_master_wg")
    ->Name("train/step/h1024_l12_b4_s512_bf16_master_wg")->UseManualTime()->Iterations(10)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainStep, bf16_full, "bf16_full")
    ->Name("train/step/h1024_l12_b4_s512_bf16_full")->UseManualTime()->Iterations(10)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
