// Offload round trips through the StateOffloader (offload + reload, blocking, including the
// device free / empty_cache and the reallocation) against raw cudaMemcpyAsync D2H + H2D between
// the same kind of buffers. Host-timed (the calls are synchronous), median of the iterations.
// Names: offload/roundtrip_<pinned|pageable|pageable_driver>/<bytes> (pageable: through the staged
// copier; pageable_driver: the driver's pageable cudaMemcpyAsync) and offload/raw_<pinned|pageable>/<bytes>;
// bench/peers/offload_peer.py times PyTorch's (DeepSpeed's) way under the same names.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/support/bench_support.h"
#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/offload.h"

namespace cutrain::bench {
namespace {

void time_host(benchmark::State& state, double bytes, const std::function<void()>& once) {
  once();  // warm-up: host buffers, driver state
  std::vector<double> us;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    once();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(dt);
    us.push_back(dt * 1e6);
  }
  std::sort(us.begin(), us.end());
  Timing t;
  t.samples = int(us.size());
  t.median_us = us[us.size() / 2];
  t.min_us = us.front();
  t.p90_us = us[std::min(us.size() - 1, us.size() * 9 / 10)];
  set_counters(state, t, bytes, 0);
}

void BM_roundtrip(benchmark::State& state, std::size_t bytes, bool pin, bool staging = true) {
  if (!require_gpu(state)) return;
  CachingAllocator& a = device_allocator();
  Stream s;
  Buffer buf(a, bytes, s.get());
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(buf.get(), 0x5A, bytes, s.get()));
  s.synchronize();
  StateOffloader off(a, s.get());
  off.add("state", &buf);
  OffloadOptions o;
  o.pin_memory = pin;
  o.pageable_staging = staging;
  time_host(state, 2.0 * double(bytes), [&] {
    off.offload({}, o);
    off.reload(false);
  });
}

void BM_raw(benchmark::State& state, std::size_t bytes, bool pin) {
  if (!require_gpu(state)) return;
  Stream s;
  Buffer dev(device_allocator(), bytes, s.get());
  void* host = nullptr;
  if (pin) CUTRAIN_CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocPortable));
  else host = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  CUTRAIN_CHECK(host != nullptr, "bench_offload: host allocation of ", bytes, " bytes failed");
  std::memset(host, 0x5A, bytes);  // touched, like the offloader's reused buffers
  time_host(state, 2.0 * double(bytes), [&] {
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(host, dev.get(), bytes, cudaMemcpyDeviceToHost, s.get()));
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(dev.get(), host, bytes, cudaMemcpyHostToDevice, s.get()));
    s.synchronize();
  });
  if (pin) cudaFreeHost(host);
  else std::free(host);
}

void register_all() {
  for (std::size_t bytes : {std::size_t{256} << 20, std::size_t{1} << 30, std::size_t{4} << 30}) {
    for (bool pin : {true, false}) {
      const std::string kind = pin ? "pinned" : "pageable";
      const int iters = pin ? 10 : 3;
      benchmark::RegisterBenchmark(("offload/roundtrip_" + kind + "/" + std::to_string(bytes)).c_str(),
                                   [=](benchmark::State& st) { BM_roundtrip(st, bytes, pin); })
          ->UseManualTime()->Iterations(iters)->Unit(benchmark::kMillisecond);
      if (!pin)  // the driver's own pageable path instead of the staged copier
        benchmark::RegisterBenchmark(("offload/roundtrip_pageable_driver/" + std::to_string(bytes)).c_str(),
                                     [=](benchmark::State& st) { BM_roundtrip(st, bytes, false, false); })
            ->UseManualTime()->Iterations(iters)->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("offload/raw_" + kind + "/" + std::to_string(bytes)).c_str(),
                                   [=](benchmark::State& st) { BM_raw(st, bytes, pin); })
          ->UseManualTime()->Iterations(iters)->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace cutrain::bench

int main(int argc, char** argv) { return cutrain::bench::run_benchmarks(argc, argv, cutrain::bench::register_all); }
