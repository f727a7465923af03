// @brief Shared benchmark machinery: CUDA-event timing after warm-up with an L2 flush before
// every timed launch, the median of all samples, and the copy-bandwidth anchor of the same run.
//
// Naming convention (bench/peers/compare.py joins on it): "<family>/<direction>/<shape>",
// e.g. "layernorm/fwd/16384x4096". Every benchmark reports the counters
//   median_us, GB/s (bytes it must move / median), frac_copy_bw, TFLOP/s (if flops > 0).
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include "runtime/dtype.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cutrain::bench {

// Registers a benchmark timed by the caller (manual time, microseconds); `iterations` > 0 fixes the
// sample count (a median of that many flushed samples), 0 leaves it to Google Benchmark.
inline void reg(const std::string& name, std::function<void(benchmark::State&)> fn, int iterations = 0) {
  benchmark::internal::Benchmark* b =
      benchmark::RegisterBenchmark(name.c_str(), [fn](benchmark::State& st) { fn(st); })->UseManualTime();
  if (iterations > 0) b->Iterations(iterations);
  b->Unit(benchmark::kMicrosecond);
}

// Device-to-device cudaMemcpyAsync of 2 GiB, median of 15 after warm-up, counting bytes read
// plus bytes written. Measured once per process, then cached.
double copy_bandwidth_gbps();

// Evicts the L2 by writing a buffer of 4x the L2 size on `stream` (not timed).
void flush_l2(cudaStream_t stream);

struct Timing {
  double median_us = 0, min_us = 0, p90_us = 0;
  int samples = 0;
};

// Times `launch(stream)`: `warmup` untimed calls, then one event-timed call per benchmark
// iteration (each preceded by an L2 flush unless flush=false). Sets the manual iteration time,
// and the counters above from `bytes` and `flops` (per call). Returns the timing.
Timing run_timed(benchmark::State& state, const std::function<void(cudaStream_t)>& launch, double bytes,
                 double flops, bool flush = true, int warmup = 5);

// Same measurement outside Google Benchmark (for tools and scripts): median over `iters`.
Timing time_median(const std::function<void(cudaStream_t)>& launch, int iters, bool flush = true, int warmup = 5);

// Sets the standard counters on `state` from a timing.
void set_counters(benchmark::State& state, const Timing& t, double bytes, double flops);

// True when a device exists; otherwise marks the benchmark skipped with the reason.
bool require_gpu(benchmark::State& state);

// A default stream for benchmarks (non-blocking, created on first use).
cudaStream_t bench_stream();

// Device memory for benchmark inputs (cudaMalloc, at least one byte; freed on destruction).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// Inputs are never zeros (METHOD.md: zeros can time faster than real data): values hashed from
// (index, seed), uniform in [lo, hi), or integer classes in [0, classes).
void fill_uniform(bf16* p, std::size_t n, float lo, float hi, std::uint32_t seed);
void fill_uniform(float* p, std::size_t n, float lo, float hi, std::uint32_t seed);
void fill_classes(std::int32_t* p, std::size_t n, int classes, std::uint32_t seed);

// The body of every benchmark program's main: `register_all()` adds the benchmarks, then Google
// Benchmark runs those argv selects. Returns the exit code (1 for an unrecognized argument).
int run_benchmarks(int argc, char** argv, void (*register_all)());

}  // namespace cutrain::bench
