// @brief Benchmarks of random-LTD's token gather and scatter (kernels/token_drop.cuh) against copy
// bandwidth, at the shapes of scripts/random_ltd_bench.py (GPT-2 small: batch 8 x seq 1024, hidden
// 768; the BF16 example's model: 4 x 512, hidden 1024) with half the tokens kept, and a quarter:
//   token_gather/fwd/B<b>S<s>K<k>H<h>: read the kept rows of x [B, S, H], write kept [B, K, H];
//   token_scatter/fwd/B<b>S<s>K<k>H<h>: read kept, write its rows into out [B, S, H] (the copy path,
//   no second operand: what DeepSpeed's token_scatter_ does);
//   token_merge/fwd/B<b>S<s>K<k>H<h>: a dropping block's output stream in one pass: every row of out
//   [B, S, H] written, from kept at the kept positions and from x elsewhere (the model's bypass +
//   scatter; no peer row: DeepSpeed's scatter writes into the input stream in place).
// Names match bench/peers/data_efficiency_peer.py's rows (DeepSpeed's random_ltd op and PyTorch's
// index ops at the same shapes). Counter frac_copy_bw: bytes moved over the median against the
// process's device-to-device copy.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/support/bench_support.h"
#include "kernels/token_drop.cuh"
#include "runtime/check.h"

using namespace cutrain;

namespace {

using DevBuf = bench::DeviceBuffer;

// 200 timed launches a row: each launch flushes L2 first (~85 us of host time against a ~9 us
// kernel), so Google Benchmark's own choice (tens of thousands) would take minutes.
void reg(const std::string& name, std::function<void(benchmark::State&)> fn) { bench::reg(name, fn, 200); }

// Each sequence's K kept positions: a uniform subset of [0, S), ascending (as the training draw).
std::vector<std::int32_t> kept_positions(int B, int S, int K, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> all(S), idx;
  idx.reserve(std::size_t(B) * K);
  for (int b = 0; b < B; ++b) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + K);
    idx.insert(idx.end(), all.begin(), all.begin() + K);
  }
  return idx;
}

enum class Op { Gather, Scatter, Merge };

void bench_token_drop(benchmark::State& state, Op op, int B, int S, int K, int H) {
  if (!bench::require_gpu(state)) return;
  const std::size_t full = std::size_t(B) * S * H, kept = std::size_t(B) * K * H;
  DevBuf x(full * sizeof(bf16)), k(kept * sizeof(bf16)), idx(std::size_t(B) * K * sizeof(std::int32_t));
  DevBuf out(op == Op::Merge ? full * sizeof(bf16) : 16);
  bench::fill_uniform(x.as<bf16>(), full, -1.f, 1.f, 1);
  bench::fill_uniform(k.as<bf16>(), kept, -1.f, 1.f, 2);
  const std::vector<std::int32_t> h = kept_positions(B, S, K, 3);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(idx.get(), h.data(), h.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  // Gather and scatter move the kept rows once each way, the merge every row; plus the indices.
  const double bytes = 2.0 * (op == Op::Merge ? full : kept) * sizeof(bf16) + double(h.size()) * sizeof(std::int32_t);
  bench::run_timed(
      state,
      [&](cudaStream_t s) {
        if (op == Op::Gather) kernels::token_gather(s, x.as<bf16>(), idx.as<std::int32_t>(), k.as<bf16>(), B, S, K, H);
        else if (op == Op::Scatter)
          kernels::token_scatter(s, k.as<bf16>(), nullptr, idx.as<std::int32_t>(), x.as<bf16>(), B, S, K, H);
        else
          kernels::token_merge(s, x.as<bf16>(), k.as<bf16>(), nullptr, idx.as<std::int32_t>(), out.as<bf16>(), B, S, K, H);
      },
      bytes, 0);
}

void register_all() {
  struct Shape { int B, S, H; };
  for (Shape sh : {Shape{8, 1024, 768}, Shape{4, 512, 1024}})
    for (int K : {sh.S / 2, sh.S / 4}) {
      const std::string shape = "B" + std::to_string(sh.B) + "S" + std::to_string(sh.S) + "K" + std::to_string(K) + "H" +
                                std::to_string(sh.H);
      reg("token_gather/fwd/" + shape, [=](benchmark::State& st) { bench_token_drop(st, Op::Gather, sh.B, sh.S, K, sh.H); });
      reg("token_scatter/fwd/" + shape, [=](benchmark::State& st) { bench_token_drop(st, Op::Scatter, sh.B, sh.S, K, sh.H); });
      reg("token_merge/fwd/" + shape, [=](benchmark::State& st) { bench_token_drop(st, Op::Merge, sh.B, sh.S, K, sh.H); });
    }
}

}  // namespace

int main(int argc, char** argv) { return cutrain::bench::run_benchmarks(argc, argv, register_all); }
