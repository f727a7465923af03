#include "bench/support/bench_support.h"

#include <algorithm>

#include "runtime/check.h"
#include "runtime/device.h"

namespace cutrain::bench {

namespace {
Timing summarize(std::vector<float>& ms) {
  Timing t;
  t.samples = static_cast<int>(ms.size());
  if (ms.empty()) return t;
  std::sort(ms.begin(), ms.end());
  t.median_us = 1e3 * ms[ms.size() / 2];
  t.min_us = 1e3 * ms.front();
  t.p90_us = 1e3 * ms[std::min(ms.size() - 1, ms.size() * 9 / 10)];
  return t;
}
}  // namespace

cudaStream_t bench_stream() {
  static Stream* s = new Stream(true);  // lives for the process
  return s->get();
}

void flush_l2(cudaStream_t stream) {
  static void* buf = nullptr;
  static std::size_t bytes = 0;
  if (!buf) {
    bytes = std::max<std::size_t>(4 * device_info().l2_bytes, 64u << 20);
    CUTRAIN_CUDA_CHECK(cudaMalloc(&buf, bytes));
  }
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(buf, 0x5A, bytes, stream));
}

Timing time_median(const std::function<void(cudaStream_t)>& launch, int iters, bool flush, int warmup) {
  cudaStream_t s = bench_stream();
  for (int i = 0; i < warmup; ++i) launch(s);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
  Event e0, e1;
  std::vector<float> ms;
  ms.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    if (flush) flush_l2(s);
    e0.record(s);
    launch(s);
    e1.record(s);
    e1.synchronize();
    ms.push_back(e1.elapsed_ms(e0));
  }
  return summarize(ms);
}

double copy_bandwidth_gbps() {
  static double cached = 0;
  if (cached > 0) return cached;
  const std::size_t bytes = std::size_t(2) << 30;
  void *a = nullptr, *b = nullptr;
  CUTRAIN_CUDA_CHECK(cudaMalloc(&a, bytes));
  CUTRAIN_CUDA_CHECK(cudaMalloc(&b, bytes));
  CUTRAIN_CUDA_CHECK(cudaMemset(a, 0x3C, bytes));
  Timing t = time_median([&](cudaStream_t s) { CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); },
                         15, false, 3);
  CUTRAIN_CUDA_CHECK(cudaFree(a));
  CUTRAIN_CUDA_CHECK(cudaFree(b));
  cached = 2.0 * bytes / (t.median_us * 1e-6) / 1e9;
  return cached;
}

void set_counters(benchmark::State& state, const Timing& t, double bytes, double flops) {
  state.counters["median_us"] = t.median_us;
  if (bytes > 0) {
    double gbps = bytes / (t.median_us * 1e-6) / 1e9;
    state.counters["GB/s"] = gbps;
    state.counters["frac_copy_bw"] = gbps / copy_bandwidth_gbps();
  }
  if (flops > 0) state.counters["TFLOP/s"] = flops / (t.median_us * 1e-6) / 1e12;
  state.counters["copy_bw_GB/s"] = copy_bandwidth_gbps();
}

Timing run_timed(benchmark::State& state, const std::function<void(cudaStream_t)>& launch, double bytes, double flops,
                 bool flush, int warmup) {
  copy_bandwidth_gbps();  // measure the anchor before timing, not in the middle
  cudaStream_t s = bench_stream();
  for (int i = 0; i < warmup; ++i) launch(s);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
  Event e0, e1;
  std::vector<float> ms;
  for (auto _ : state) {
    if (flush) flush_l2(s);
    e0.record(s);
    launch(s);
    e1.record(s);
    e1.synchronize();
    float m = e1.elapsed_ms(e0);
    ms.push_back(m);
    state.SetIterationTime(m * 1e-3);
  }
  Timing t = summarize(ms);
  set_counters(state, t, bytes, flops);
  return t;
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) { CUTRAIN_CUDA_CHECK(cudaMalloc(&p_, bytes ? bytes : 1)); }
DeviceBuffer::~DeviceBuffer() { cudaFree(p_); }

namespace {
__device__ std::uint32_t hash32(std::uint32_t x) {
  x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;
  return x;
}
template <typename T>
__global__ void fill_uniform_kernel(T* p, std::size_t n, float lo, float hi, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const float u = (hash32(static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ seed) >> 8) * (1.f / 16777216.f);
    p[i] = static_cast<T>(lo + (hi - lo) * u);
  }
}
__global__ void fill_classes_kernel(std::int32_t* p, std::size_t n, int classes, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<std::int32_t>(hash32(static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ seed) % static_cast<unsigned>(classes));
}
}  // namespace

void fill_uniform(bf16* p, std::size_t n, float lo, float hi, std::uint32_t seed) {
  fill_uniform_kernel<bf16><<<2048, 256, 0, bench_stream()>>>(p, n, lo, hi, seed);
  CUTRAIN_LAUNCH_CHECK("fill_uniform_kernel<bf16>");
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(bench_stream()));
}
void fill_uniform(float* p, std::size_t n, float lo, float hi, std::uint32_t seed) {
  fill_uniform_kernel<float><<<2048, 256, 0, bench_stream()>>>(p, n, lo, hi, seed);
  CUTRAIN_LAUNCH_CHECK("fill_uniform_kernel<float>");
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(bench_stream()));
}
void fill_classes(std::int32_t* p, std::size_t n, int classes, std::uint32_t seed) {
  CUTRAIN_CHECK(classes > 0, "fill_classes: classes must be positive, got ", classes);
  fill_classes_kernel<<<256, 256, 0, bench_stream()>>>(p, n, classes, seed);
  CUTRAIN_LAUNCH_CHECK("fill_classes_kernel");
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(bench_stream()));
}

bool require_gpu(benchmark::State& state) {
  std::string why;
  if (gpu_available(&why)) return true;
  state.SkipWithError(("no CUDA device: " + why).c_str());
  return false;
}

int run_benchmarks(int argc, char** argv, void (*register_all)()) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace cutrain::bench
