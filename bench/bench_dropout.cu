// @brief Benchmarks of the dropout kernels (kernels/dropout.cuh) against copy bandwidth: the mask
// is regenerated from Philox (10 rounds per 4 elements) instead of read, so the question is
// whether the generator hides under the memory traffic.
//   dropout/fwd/<bf16|fp32>/<n>: read x, write out;
//   bias_dropout_residual/fwd/bf16/<rows>x<cols>: read x and the residual, write out (BERT-Large's
//   hidden dropout: 64 x 128 or 16 x 512 tokens by 1024).
// Counter frac_copy_bw: the bytes over the median against the process's device-to-device copy.
#include <benchmark/benchmark.h>

#include <functional>
#include <string>

#include "bench/support/bench_support.h"
#include "kernels/dropout.cuh"

using namespace cutrain;

namespace {

using DevBuf = bench::DeviceBuffer;

using bench::reg;

void bench_dropout(benchmark::State& state, DType dt, std::size_t n) {
  if (!bench::require_gpu(state)) return;
  const std::size_t es = dtype_size(dt);
  DevBuf x(n * es), out(n * es);
  if (dt == DType::BF16) bench::fill_uniform(x.as<bf16>(), n, -1.f, 1.f, 1);
  else bench::fill_uniform(x.as<float>(), n, -1.f, 1.f, 1);
  kernels::DropoutParams p;
  p.p = 0.1f;
  p.key = {1234, 0, 3};
  bench::run_timed(
      state,
      [&](cudaStream_t s) {
        ++p.key.step;  // a new mask every call, as every training step draws one
        kernels::dropout_forward(s, p, x.get(), out.get(), n, dt);
      },
      2.0 * n * es, 0);
}

void bench_bias_dropout_residual(benchmark::State& state, std::size_t rows, std::size_t cols) {
  if (!bench::require_gpu(state)) return;
  const std::size_t n = rows * cols;
  DevBuf x(n * 2), b(cols * 2), r(n * 2), out(n * 2);
  bench::fill_uniform(x.as<bf16>(), n, -1.f, 1.f, 1);
  bench::fill_uniform(b.as<bf16>(), cols, -1.f, 1.f, 2);
  bench::fill_uniform(r.as<bf16>(), n, -1.f, 1.f, 3);
  kernels::DropoutParams p;
  p.p = 0.1f;
  p.key = {1234, 0, 5};
  bench::run_timed(
      state,
      [&](cudaStream_t s) {
        ++p.key.step;
        kernels::bias_dropout_residual_forward(s, p, x.get(), b.get(), r.get(), out.get(), rows, cols, DType::BF16);
      },
      3.0 * n * 2 + cols * 2, 0);
}

void register_all() {
  for (std::size_t n : {std::size_t(8388608), std::size_t(134217728)}) {
    reg("dropout/fwd/bf16/" + std::to_string(n), [=](benchmark::State& st) { bench_dropout(st, DType::BF16, n); });
    reg("dropout/fwd/fp32/" + std::to_string(n), [=](benchmark::State& st) { bench_dropout(st, DType::F32, n); });
  }
  for (auto [rows, cols] : {std::pair<std::size_t, std::size_t>{8192, 1024}, {65536, 1024}})
    reg("bias_dropout_residual/fwd/bf16/" + std::to_string(rows) + "x" + std::to_string(cols),
        [=](benchmark::State& st) { bench_bias_dropout_residual(st, rows, cols); });
}

}  // namespace

int main(int argc, char** argv) { return cutrain::bench::run_benchmarks(argc, argv, register_all); }
