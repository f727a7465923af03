// Host-side cost of one allocate + free: the caching allocator (a cached block) against
// cudaMalloc/cudaFree and the stream-ordered cudaMallocAsync/cudaFreeAsync pool. These are API
// timings, so Google Benchmark's own (host) timing is used, plus the median of per-iteration times.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/support/bench_support.h"
#include "runtime/allocator.h"
#include "runtime/check.h"

namespace cutrain::bench {
namespace {

struct Size {
  const char* name;
  std::size_t bytes;
};
constexpr Size kSizes[] = {{"512B", 512}, {"64KiB", 64 << 10}, {"4MiB", 4 << 20}, {"64MiB", 64 << 20}};

// Runs `pair` once per iteration, timing each with steady_clock; sets median_us.
void time_pairs(benchmark::State& state, std::size_t bytes, const std::function<void()>& pair) {
  for (int i = 0; i < 3; ++i) pair();  // warm-up: segments, pools, driver state
  std::vector<double> ns;
  ns.reserve(1 << 16);
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    pair();
    auto t1 = std::chrono::steady_clock::now();
    if (ns.size() < ns.capacity()) ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  if (ns.empty()) return;
  std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
  state.counters["median_us"] = ns[ns.size() / 2] * 1e-3;
  state.counters["bytes"] = static_cast<double>(bytes);
}

void BM_cached(benchmark::State& state, std::size_t n) {
  if (!require_gpu(state)) return;
  CachingAllocator& a = device_allocator();
  cudaStream_t s = bench_stream();
  time_pairs(state, n, [&] {
    void* p = a.allocate(n, s);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  });
}

void BM_cudaMalloc(benchmark::State& state, std::size_t n) {
  if (!require_gpu(state)) return;
  time_pairs(state, n, [&] {
    void* p = nullptr;
    CUTRAIN_CUDA_CHECK(cudaMalloc(&p, n));
    benchmark::DoNotOptimize(p);
    CUTRAIN_CUDA_CHECK(cudaFree(p));
  });
}

void BM_cudaMallocAsync(benchmark::State& state, std::size_t n) {
  if (!require_gpu(state)) return;
  // The peer at its best: the default pool keeps freed memory instead of trimming at every sync.
  int dev = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  cudaMemPool_t pool = nullptr;
  CUTRAIN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  std::uint64_t keep = UINT64_MAX;
  CUTRAIN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  cudaStream_t s = bench_stream();
  time_pairs(state, n, [&] {
    void* p = nullptr;
    CUTRAIN_CUDA_CHECK(cudaMallocAsync(&p, n, s));
    benchmark::DoNotOptimize(p);
    CUTRAIN_CUDA_CHECK(cudaFreeAsync(p, s));
  });
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
}

int register_all() {
  for (const Size& sz : kSizes) {
    std::size_t n = sz.bytes;
    std::string tail = sz.name;
    benchmark::RegisterBenchmark(("allocator/cached/" + tail).c_str(), [n](benchmark::State& st) { BM_cached(st, n); });
    benchmark::RegisterBenchmark(("allocator/cudaMalloc/" + tail).c_str(),
                                 [n](benchmark::State& st) { BM_cudaMalloc(st, n); });
    benchmark::RegisterBenchmark(("allocator/cudaMallocAsync/" + tail).c_str(),
                                 [n](benchmark::State& st) { BM_cudaMallocAsync(st, n); });
  }
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace cutrain::bench

BENCHMARK_MAIN();
