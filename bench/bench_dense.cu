// @brief bench_dense: LayerNorm (fused residual), GELU and embedding, forward / backward / both, at the
// BF16 example's shapes (2048 tokens, hidden 1024, FF 4096, vocab 50000) and large ones. Bytes are
// what each kernel must move; frac_copy_bw compares with the device's copy bandwidth.
// Names match bench/peers/dense_peer.py.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "bench/support/bench_support.h"
#include "kernels/embedding.cuh"
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "runtime/check.h"

using namespace cutrain;
namespace k = cutrain::kernels;

namespace {

using Buf = bench::DeviceBuffer;

std::unique_ptr<Buf> bf16_buf(std::size_t n, std::uint32_t seed, float mean = 0.f, float scale = 1.f) {
  auto b = std::make_unique<Buf>(n * sizeof(bf16));
  bench::fill_uniform(b->as<bf16>(), n, mean - scale, mean + scale, seed);
  return b;
}

std::string shape(long a, long b) { return std::to_string(a) + "x" + std::to_string(b); }

// ---- LayerNorm ----
// BwdFromOutput: LayerNorm only, the backward from the output (layernorm_backward_from_output,
// DeepSpeed's normalize_invertible) beside "bwd"; PyTorch has no such op, so no peer row.
enum class Dir { Fwd, Bwd, FwdBwd, BwdFromOutput };
const char* dir_name(Dir d) {
  switch (d) {
    case Dir::Fwd: return "fwd";
    case Dir::Bwd: return "bwd";
    case Dir::FwdBwd: return "fwdbwd";
    default: return "bwd_from_output";
  }
}

void bench_layernorm(benchmark::State& state, int rows, int cols, Dir dir) {
  if (!bench::require_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  auto x = bf16_buf(n, 1), res = bf16_buf(n, 2), dy = bf16_buf(n, 3);
  auto g = bf16_buf(cols, 4, 1.f, 0.2f), b = bf16_buf(cols, 5, 0.f, 0.2f);  // gamma in [0.8, 1.2]: non-zero
  Buf sum(n * 2), y(n * 2), dsum(n * 2), mean(rows * 4), rstd(rows * 4), dg(cols * 4), db(cols * 4);
  Buf scratch(k::layernorm_backward_scratch_bytes(rows, cols));
  auto fwd = [&](cudaStream_t s) {
    k::layernorm_residual_forward(s, x->as<bf16>(), res->as<bf16>(), sum.as<bf16>(), y.as<bf16>(), mean.as<float>(),
                                  rstd.as<float>(), g->as<bf16>(), b->as<bf16>(), rows, cols);
  };
  auto bwd = [&](cudaStream_t s) {
    k::layernorm_backward(s, dy->as<bf16>(), sum.as<bf16>(), mean.as<float>(), rstd.as<float>(), g->as<bf16>(),
                          nullptr, dsum.as<bf16>(), dg.as<void>(), db.as<void>(), DType::F32, false,
                          scratch.as<void>(), rows, cols);
  };
  auto bwd_from_output = [&](cudaStream_t s) {
    k::layernorm_backward_from_output(s, dy->as<bf16>(), y.as<bf16>(), rstd.as<float>(), g->as<bf16>(),
                                      b->as<bf16>(), nullptr, dsum.as<bf16>(), dg.as<void>(), db.as<void>(),
                                      DType::F32, false, scratch.as<void>(), rows, cols);
  };
  fwd(bench::bench_stream());  // backward reads the forward's sum (or y) / mean / rstd
  // Bytes: forward reads x, residual, writes sum, y (+ stats); backward reads dy, sum, writes d_sum
  // (+ stats, parameter gradients); from the output: dy, y, d_sum, rstd only, gamma and beta.
  // The partials round trip is ours, not counted.
  const double fwd_bytes = 8.0 * n + 8.0 * rows + 4.0 * cols;
  const double bwd_bytes = 6.0 * n + 8.0 * rows + 2.0 * cols + 8.0 * cols;
  const double bwd_out_bytes = 6.0 * n + 4.0 * rows + 4.0 * cols + 8.0 * cols;
  if (dir == Dir::Fwd) bench::run_timed(state, fwd, fwd_bytes, 0);
  else if (dir == Dir::Bwd) bench::run_timed(state, bwd, bwd_bytes, 0);
  else if (dir == Dir::BwdFromOutput) bench::run_timed(state, bwd_from_output, bwd_out_bytes, 0);
  else bench::run_timed(state, [&](cudaStream_t s) { fwd(s); bwd(s); }, fwd_bytes + bwd_bytes, 0);
}

// ---- GELU (exact erf, no bias: what F.gelu is compared on) ----
void bench_gelu(benchmark::State& state, int rows, int cols, Dir dir) {
  if (!bench::require_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  auto in = bf16_buf(n, 6, 0.f, 3.f), dout = bf16_buf(n, 7);
  Buf out(n * 2), din(n * 2);
  auto fwd = [&](cudaStream_t s) {
    k::gelu_forward(s, in->as<bf16>(), nullptr, nullptr, out.as<bf16>(), rows, cols, k::GeluKind::Erf);
  };
  auto bwd = [&](cudaStream_t s) {
    k::gelu_backward(s, dout->as<bf16>(), in->as<bf16>(), din.as<bf16>(), n, k::GeluKind::Erf);
  };
  if (dir == Dir::Fwd) bench::run_timed(state, fwd, 4.0 * n, 0);
  else if (dir == Dir::Bwd) bench::run_timed(state, bwd, 6.0 * n, 0);
  else bench::run_timed(state, [&](cudaStream_t s) { fwd(s); bwd(s); }, 10.0 * n, 0);
}

// ---- Embedding: B*T tokens of width C, vocabulary V; bf16 gradient tables accumulated ----
void bench_embedding(benchmark::State& state, int B, int T, int C, int V, Dir dir) {
  if (!bench::require_gpu(state)) return;
  const int N = B * T;
  const std::size_t nc = static_cast<std::size_t>(N) * C;
  Buf tok(N * 4), status(4);
  bench::fill_classes(tok.as<int32_t>(), N, V, 8);
  auto wte = bf16_buf(static_cast<std::size_t>(V) * C, 9), wpe = bf16_buf(static_cast<std::size_t>(T) * C, 10);
  auto dout = bf16_buf(nc, 11);
  Buf out(nc * 2), dwte(static_cast<std::size_t>(V) * C * 2), dwpe(static_cast<std::size_t>(T) * C * 2);
  CUTRAIN_CUDA_CHECK(cudaMemset(dwte.as<void>(), 0, static_cast<std::size_t>(V) * C * 2));
  CUTRAIN_CUDA_CHECK(cudaMemset(dwpe.as<void>(), 0, static_cast<std::size_t>(T) * C * 2));
  Buf scratch(k::embedding_backward_scratch_bytes(B, T, C, V));
  auto fwd = [&](cudaStream_t s) {
    k::embedding_forward(s, tok.as<int32_t>(), wte->as<bf16>(), wpe->as<bf16>(), out.as<bf16>(), B, T, C, V,
                         status.as<int>());
  };
  auto bwd = [&](cudaStream_t s) {
    k::embedding_backward(s, dout->as<bf16>(), tok.as<int32_t>(), dwte.as<void>(), dwpe.as<void>(), DType::BF16,
                          true, B, T, C, V, scratch.as<void>());
  };
  // Forward: token ids, N wte rows, the T wpe rows once, N output rows. Backward (accumulate):
  // dout, read+write of <= N dwte rows, read+write of the T dwpe rows.
  const double fwd_bytes = 4.0 * N + 2.0 * nc + 2.0 * T * C + 2.0 * nc;
  const double bwd_bytes = 4.0 * N + 2.0 * nc + 4.0 * nc + 4.0 * T * C;
  if (dir == Dir::Fwd) bench::run_timed(state, fwd, fwd_bytes, 0);
  else bench::run_timed(state, bwd, bwd_bytes, 0);
}

template <typename F>
void reg(const std::string& name, F fn) {
  benchmark::RegisterBenchmark(name.c_str(), [fn](benchmark::State& st) { fn(st); })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  struct Shape2 { int rows, cols; };
  for (Shape2 sh : {Shape2{2048, 1024}, Shape2{16384, 4096}})
    for (Dir d : {Dir::Fwd, Dir::Bwd, Dir::BwdFromOutput, Dir::FwdBwd})
      reg(std::string("layernorm/") + dir_name(d) + "/" + shape(sh.rows, sh.cols),
          [=](benchmark::State& st) { bench_layernorm(st, sh.rows, sh.cols, d); });
  for (Shape2 sh : {Shape2{2048, 4096}, Shape2{16384, 16384}})
    for (Dir d : {Dir::Fwd, Dir::Bwd, Dir::FwdBwd})
      reg(std::string("gelu/") + dir_name(d) + "/" + shape(sh.rows, sh.cols),
          [=](benchmark::State& st) { bench_gelu(st, sh.rows, sh.cols, d); });
  // (B, T): 4 x 512 = 2048 tokens (the example), 32 x 512 = 16384 tokens at width 4096.
  struct Shape3 { int B, T, C; };
  for (Shape3 sh : {Shape3{4, 512, 1024}, Shape3{32, 512, 4096}})
    for (Dir d : {Dir::Fwd, Dir::Bwd})
      reg(std::string("embedding/") + dir_name(d) + "/" + shape(long(sh.B) * sh.T, sh.C),
          [=](benchmark::State& st) { bench_embedding(st, sh.B, sh.T, sh.C, 50000, d); });
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
