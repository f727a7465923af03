// @brief Benchmarks of the MoE layer (model/moe_layer.h) and its grouped expert GEMM.
//
//   moe/fwd/T8192_H1024_F4096_E<E>_k<k>      the layer's forward (gate GEMM, gate, permute, fc1,
//   moe/fwd_bwd/...[_residual|_packed]       GELU, fc2, un-permute; + the whole backward), bf16,
//                                            capacity factor 1, token dropping, bf16 gradients; the
//                                            [E, C] slot layout (no host sync), _packed: the packed
//                                            rows (counts to the host, grouped GEMMs);
//                                            peer: bench/peers/moe_peer.py (DeepSpeed's MoE layer
//                                            and a plain PyTorch MoE, same names with @variant)
//   moe_gemm/dense_<dir>/R<R>_N<N>_K<K>       one dense GEMM of all R rows: the anchor
//   moe_gemm/grouped_<dir>/E<E>_R<R>_N<N>_K<K>  kernels::GroupedGemm over E experts of R/E rows
//   moe_gemm/grouped_skew_<dir>/...           the same with unequal rows (expert e gets a share
//                                            proportional to 1/(1+e/4), total R)
//   moe_gemm/loop_<dir>/..., loop_skew_<dir>  the alternative measured beside it: one cuBLASLt
//                                            GEMM per expert through kernels::Gemm
//   moe_gemm/slots_<dir>/E<E>_R<R>_N<N>_K<K>   the slot layout's strided batch (Gemm::*_batched) of
//                                            E products over R/E rows each
// dir: fwd (y = x·Wᵀ), dgrad (dx = dy·W), wgrad (dW = dyᵀ·x, bf16). TFLOP/s from 2·R·N·K; the
// layer's from its active FLOPs (rows actually routed).
#include <benchmark/benchmark.h>

#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench/support/bench_support.h"
#include "kernels/gemm.cuh"
#include "kernels/moe_grouped_gemm.cuh"
#include "model/moe_config.h"
#include "model/moe_layer.h"
#include "runtime/allocator.h"
#include "runtime/check.h"

using namespace cutrain;

namespace {

constexpr int kTokens = 8192, kHidden = 1024, kFfn = 4096;

using DevBuf = bench::DeviceBuffer;
std::unique_ptr<DevBuf> random_bf16(std::size_t n, std::uint32_t seed, float scale) {
  auto b = std::make_unique<DevBuf>(n * sizeof(bf16));
  bench::fill_uniform(b->as<bf16>(), n, -scale, scale, seed);
  return b;
}

CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator(make_device_source());
  return *a;
}
kernels::Gemm& lt() {
  static kernels::Gemm* g = new kernels::Gemm(nullptr);
  return *g;
}
kernels::GroupedGemm& grouped() {
  static kernels::GroupedGemm* g = new kernels::GroupedGemm(1024);
  return *g;
}

std::string layer_shape(int E, int k) {
  return "T" + std::to_string(kTokens) + "_H" + std::to_string(kHidden) + "_F" + std::to_string(kFfn) + "_E" +
         std::to_string(E) + "_k" + std::to_string(k);
}

void bench_layer(benchmark::State& state, int E, int k, bool backward, bool residual = false, bool packed = false) {
  if (!bench::require_gpu(state)) return;
  model::MoeConfig c;
  c.hidden = kHidden, c.ffn = kFfn, c.experts = E, c.k = k, c.capacity_factor = 1.0, c.min_capacity = 4;
  c.use_residual = residual;
  const auto lay = model::moe_param_layout(c);
  auto params = random_bf16(lay.total, 11, 0.03f);
  auto x = random_bf16(std::size_t(kTokens) * kHidden, 12, 1.f);
  auto dy = random_bf16(std::size_t(kTokens) * kHidden, 13, 1.f);
  auto y = random_bf16(std::size_t(kTokens) * kHidden, 14, 1.f);
  auto dx = random_bf16(std::size_t(kTokens) * kHidden, 15, 1.f);
  auto grads = random_bf16(lay.total, 16, 1.f);
  model::MoeLayerGpu layer(c, kTokens, allocator(), nullptr, packed);
  layer.forward(bench::bench_stream(), params->as<bf16>(), x->as<bf16>(), y->as<bf16>(), kTokens, true);
  const auto st = layer.last_stats(bench::bench_stream());
  const double R = std::accumulate(st.kept_counts.begin(), st.kept_counts.end(), 0.0);
  const double gate = 2.0 * kTokens * E * kHidden, experts = 2.0 * 2.0 * R * kHidden * kFfn;
  const double mlp = residual ? 2.0 * 2.0 * kTokens * kHidden * kFfn + 2.0 * kTokens * 2 * kHidden : 0.0;
  const double flops = (backward ? 3 : 1) * (gate + experts + mlp);
  // Bytes: the weights once per pass (the GEMMs' floor; activations are re-read by design).
  const double bytes = double(lay.total) * 2 * (backward ? 3 : 1);
  bench::run_timed(state, [&](cudaStream_t s) {
    layer.forward(s, params->as<bf16>(), x->as<bf16>(), y->as<bf16>(), kTokens, true);
    if (backward)
      layer.backward(s, params->as<bf16>(), x->as<bf16>(), dy->as<bf16>(), 0.01f, dx->as<bf16>(), grads->get(),
                     DType::BF16, false);
  }, bytes, flops);
  state.counters["rows"] = R;
  state.counters["computed_rows"] = layer.capturable() ? double(E) * st.capacity : R;  // the slots' padding too
  state.counters["dropped"] = st.dropped;
  state.counters["max_load"] = st.max_load();
  state.counters["min_load"] = st.min_load();
}

enum class Dir { Fwd, Dgrad, Wgrad };
const char* dir_name(Dir d) { return d == Dir::Fwd ? "fwd" : d == Dir::Dgrad ? "dgrad" : "wgrad"; }

std::vector<int> rows_for(int E, int R, bool skew) {
  std::vector<double> share(E, 1.0);
  if (skew)
    for (int e = 0; e < E; ++e) share[e] = 1.0 / (1.0 + e / 4.0);
  const double total = std::accumulate(share.begin(), share.end(), 0.0);
  std::vector<int> rows(E);
  int used = 0;
  for (int e = 0; e < E; ++e) used += rows[e] = int(R * share[e] / total);
  rows[0] += R - used;
  return rows;
}

// How: 0 dense, 1 grouped, 2 per-expert loop, 3 the slots' strided batch (R/E rows each).
void bench_gemm(benchmark::State& state, int how, Dir d, int E, int R, int N, int K, bool skew) {
  if (!bench::require_gpu(state)) return;
  const auto rows = rows_for(E, R, skew);
  auto x = random_bf16(std::size_t(R) * K, 21, 1.f), w = random_bf16(std::size_t(E) * N * K, 22, 0.05f);
  auto y = random_bf16(std::size_t(R) * N, 23, 1.f), dw = random_bf16(std::size_t(E) * N * K, 24, 1.f);
  const bf16 *xp = x->as<bf16>(), *wp = w->as<bf16>();
  bf16 *yp = y->as<bf16>(), *dwp = dw->as<bf16>();
  auto loop = [&](cudaStream_t s) {
    std::int64_t row = 0;
    for (int g = 0; g < E; row += rows[g], ++g) {
      if (!rows[g]) continue;
      const std::size_t wo = std::size_t(g) * N * K;
      if (d == Dir::Fwd) lt().forward(s, xp + row * K, wp + wo, nullptr, yp + row * N, rows[g], N, K);
      else if (d == Dir::Dgrad) lt().grad_input(s, yp + row * N, wp + wo, x->as<bf16>() + row * K, rows[g], N, K);
      else lt().grad_weight(s, yp + row * N, xp + row * K, dwp + wo, DType::BF16, rows[g], N, K, false);
    }
  };
  std::function<void(cudaStream_t)> fn;
  if (how == 0) {
    fn = [&](cudaStream_t s) {
      if (d == Dir::Fwd) lt().forward(s, xp, wp, nullptr, yp, R, N, K);
      else if (d == Dir::Dgrad) lt().grad_input(s, yp, wp, x->as<bf16>(), R, N, K);
      else lt().grad_weight(s, yp, xp, dwp, DType::BF16, R, N, K, false);
    };
  } else if (how == 1) {
    fn = [&](cudaStream_t s) {
      if (d == Dir::Fwd) grouped().forward(s, xp, wp, yp, rows.data(), E, N, K);
      else if (d == Dir::Dgrad) grouped().grad_input(s, yp, wp, x->as<bf16>(), rows.data(), E, N, K);
      else grouped().grad_weight(s, yp, xp, dwp, DType::BF16, rows.data(), E, N, K, false);
    };
  } else if (how == 3) {
    const int M = R / E;
    fn = [&, M](cudaStream_t s) {
      if (d == Dir::Fwd) lt().forward_batched(s, xp, wp, yp, E, M, N, K);
      else if (d == Dir::Dgrad) lt().grad_input_batched(s, yp, wp, x->as<bf16>(), E, M, N, K);
      else lt().grad_weight_batched(s, yp, xp, dwp, DType::BF16, E, M, N, K, false);
    };
  } else {
    fn = loop;
  }
  const double wbytes = 2.0 * (how == 0 ? 1 : E) * N * K;
  bench::run_timed(state, fn, 2.0 * (double(R) * (N + K)) + wbytes, 2.0 * R * N * K);
  if (how == 1) state.counters["fallbacks"] = double(grouped().fallback_count());
}

void reg(const std::string& name, int iters, std::function<void(benchmark::State&)> fn) {
  benchmark::RegisterBenchmark(name.c_str(), [fn](benchmark::State& st) { fn(st); })
      ->UseManualTime()
      ->Iterations(iters)
      ->Unit(benchmark::kMicrosecond);
}

void register_all() {
  for (int E : {8, 64})
    for (int k : {1, 2}) {
      const std::string sh = layer_shape(E, k);
      reg("moe/fwd/" + sh, 30, [=](benchmark::State& st) { bench_layer(st, E, k, false); });
      reg("moe/fwd_bwd/" + sh, 30, [=](benchmark::State& st) { bench_layer(st, E, k, true); });
    }
  // PR-MoE's residual variant (a dense MLP beside the experts, the learned mix), top-1.
  for (int E : {8, 64}) {
    const std::string sh = layer_shape(E, 1) + "_residual";
    reg("moe/fwd_bwd/" + sh, 30, [=](benchmark::State& st) { bench_layer(st, E, 1, true, true); });
  }
  // The packed layout beside the slots (the counts to the host each forward, grouped GEMMs).
  for (int E : {8, 64})
    for (int k : {1, 2}) {
      const std::string sh = layer_shape(E, k) + "_packed";
      reg("moe/fwd_bwd/" + sh, 30, [=](benchmark::State& st) { bench_layer(st, E, k, true, false, true); });
    }
  // fc1's shape (N = F, K = H) and fc2's (N = H, K = F) at the rows of top-1 and top-2.
  for (int R : {kTokens, 2 * kTokens})
    for (auto nk : {std::pair{kFfn, kHidden}, std::pair{kHidden, kFfn}})
      for (Dir d : {Dir::Fwd, Dir::Dgrad, Dir::Wgrad}) {
        const int N = nk.first, K = nk.second;
        const std::string rnk = "R" + std::to_string(R) + "_N" + std::to_string(N) + "_K" + std::to_string(K);
        const std::string dn = dir_name(d);
        reg("moe_gemm/dense_" + dn + "/" + rnk, 50, [=](benchmark::State& st) { bench_gemm(st, 0, d, 1, R, N, K, false); });
        for (int E : {8, 64}) {
          const std::string sh = "E" + std::to_string(E) + "_" + rnk;
          reg("moe_gemm/grouped_" + dn + "/" + sh, 50, [=](benchmark::State& st) { bench_gemm(st, 1, d, E, R, N, K, false); });
          reg("moe_gemm/slots_" + dn + "/" + sh, 50, [=](benchmark::State& st) { bench_gemm(st, 3, d, E, R, N, K, false); });
          reg("moe_gemm/loop_" + dn + "/" + sh, 50, [=](benchmark::State& st) { bench_gemm(st, 2, d, E, R, N, K, false); });
          reg("moe_gemm/grouped_skew_" + dn + "/" + sh, 50, [=](benchmark::State& st) { bench_gemm(st, 1, d, E, R, N, K, true); });
          reg("moe_gemm/loop_skew_" + dn + "/" + sh, 50, [=](benchmark::State& st) { bench_gemm(st, 2, d, E, R, N, K, true); });
        }
      }
}

}  // namespace

int main(int argc, char** argv) { return cutrain::bench::run_benchmarks(argc, argv, register_all); }
