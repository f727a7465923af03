// @brief Benchmarks of kernels/attention (the sm90 pair, kernels/attention_sm90/, with the schedule
// table's choice per shape): forward, backward (bwd: the fast mode with atomic dQ, as
// FlashAttention's own backward; bwd_det: the deterministic mode) and forward+backward (fast), full
// and causal, on the BF16 example's shape and the shapes the PyTorch peer
// (bench/peers/attention_peer.py) times under the same names.
// Names: "attention/<fwd|bwd|bwd_det|fwdbwd>[_causal]/B4H16S512D64". TFLOP/s from 4·B·H·S²·D forward, 2.5x that backward, halved causal;
// bytes = what each pass must read and write once.
// BERT's shapes (B64H16S128D64, B16H16S512D64, non-causal) also run with its options:
// "attention/<pass>_mask/..." (a key mask of random per-sequence lengths, uniform in [S/4, S]) and
// "attention/<pass>_mask_drop/..." (the same mask and dropout 0.1 on the probabilities). Their
// TFLOP/s count the full S² work, so padding shows up as a higher rate.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <utility>
#include <string>
#include <vector>

#include "bench/support/bench_support.h"
#include "kernels/attention.cuh"
#include "runtime/check.h"

using namespace cutrain;
using kernels::AttentionShape;

namespace {

using DevBuf = bench::DeviceBuffer;
std::unique_ptr<DevBuf> random_bf16(std::size_t n, std::uint32_t seed) {
  auto b = std::make_unique<DevBuf>(n * sizeof(bf16));
  bench::fill_uniform(b->as<bf16>(), n, -1.f, 1.f, seed);
  return b;
}

std::string shape_name(const AttentionShape& s) {
  return "B" + std::to_string(s.batch) + "H" + std::to_string(s.heads) + "S" + std::to_string(s.seq) + "D" +
         std::to_string(s.head_dim);
}

enum class Pass { Fwd, Bwd, BwdDet, FwdBwd };
enum class Opts { Plain, Mask, MaskDrop };

// Key mask bytes [B, S]: sequence b valid up to a length uniform in [S/4, S] (fixed seed).
std::vector<std::uint8_t> padding_mask(const AttentionShape& sh) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> len(sh.seq / 4, sh.seq);
  std::vector<std::uint8_t> m(std::size_t(sh.batch) * sh.seq);
  for (int b = 0; b < sh.batch; ++b) {
    const int n = len(rng);
    for (int j = 0; j < sh.seq; ++j) m[std::size_t(b) * sh.seq + j] = j < n;
  }
  return m;
}

void bench_attention(benchmark::State& state, AttentionShape sh, Pass pass, Opts opts = Opts::Plain) {
  if (!bench::require_gpu(state)) return;
  const std::size_t n_o = std::size_t(sh.batch) * sh.seq * sh.heads * sh.head_dim, n_qkv = 3 * n_o;
  const std::size_t n_l = std::size_t(sh.batch) * sh.heads * sh.seq;
  auto qkv = random_bf16(n_qkv, 1), dout = random_bf16(n_o, 2);
  const bool det = pass == Pass::BwdDet;
  DevBuf out(n_o * 2), lse(n_l * 4), dqkv(n_qkv * 2), scratch(kernels::attention_backward_scratch_bytes(sh, det));
  DevBuf mask(std::size_t(sh.batch) * sh.seq);
  cudaStream_t st0 = bench::bench_stream();
  kernels::AttentionOptions opt;
  if (opts != Opts::Plain) {
    const auto m = padding_mask(sh);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(mask.as<std::uint8_t>(), m.data(), m.size(), cudaMemcpyHostToDevice));
    opt.key_mask = mask.as<std::uint8_t>();
  }
  if (opts == Opts::MaskDrop) {
    opt.dropout = {1234, 1, 0, nullptr};
    opt.dropout_p = 0.1f;
  }
  // The backward needs a real O and lse.
  kernels::attention_forward(st0, qkv->as<bf16>(), out.as<bf16>(), lse.as<float>(), sh, opt);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(st0));

  const double fwd_bytes = 2.0 * (n_qkv + n_o) + 4.0 * n_l;
  const double bwd_bytes = 2.0 * (n_qkv + 2 * n_o + n_qkv) + 4.0 * n_l;
  auto fwd = [&](cudaStream_t st) {
    kernels::attention_forward(st, qkv->as<bf16>(), out.as<bf16>(), lse.as<float>(), sh, opt);
  };
  auto bwd = [&](cudaStream_t st) {
    kernels::attention_backward(st, qkv->as<bf16>(), out.as<bf16>(), dout->as<bf16>(), lse.as<float>(),
                                dqkv.as<bf16>(), scratch.as<void>(), sh, det, opt);
  };
  switch (pass) {
    case Pass::Fwd: bench::run_timed(state, fwd, fwd_bytes, kernels::attention_forward_flops(sh)); break;
    case Pass::Bwd:
    case Pass::BwdDet: bench::run_timed(state, bwd, bwd_bytes, kernels::attention_backward_flops(sh)); break;
    case Pass::FwdBwd:
      bench::run_timed(state, [&](cudaStream_t st) { fwd(st); bwd(st); }, fwd_bytes + bwd_bytes,
                       kernels::attention_forward_flops(sh) + kernels::attention_backward_flops(sh));
      break;
  }
}

// A median of 100 flushed samples.
void reg(const std::string& name, std::function<void(benchmark::State&)> fn) { bench::reg(name, fn, 100); }

void register_all() {
  const std::vector<AttentionShape> shapes = {
      {4, 512, 16, 64, false}, {4, 2048, 16, 64, false}, {2, 8192, 16, 64, false}, {4, 2048, 16, 128, false}};
  for (AttentionShape s : shapes)
    for (bool causal : {false, true}) {
      s.causal = causal;
      const std::string suffix = std::string(causal ? "_causal/" : "/") + shape_name(s);
      reg("attention/fwd" + suffix, [=](benchmark::State& st) { bench_attention(st, s, Pass::Fwd); });
      reg("attention/bwd" + suffix, [=](benchmark::State& st) { bench_attention(st, s, Pass::Bwd); });
      reg("attention/bwd_det" + suffix, [=](benchmark::State& st) { bench_attention(st, s, Pass::BwdDet); });
      reg("attention/fwdbwd" + suffix, [=](benchmark::State& st) { bench_attention(st, s, Pass::FwdBwd); });
    }
  // BERT: plain, key mask, key mask + dropout 0.1.
  const std::vector<AttentionShape> bert = {{64, 128, 16, 64, false}, {16, 512, 16, 64, false}};
  const std::pair<Opts, const char*> variants[] = {{Opts::Plain, ""}, {Opts::Mask, "_mask"}, {Opts::MaskDrop, "_mask_drop"}};
  const std::pair<Pass, const char*> passes[] = {
      {Pass::Fwd, "fwd"}, {Pass::Bwd, "bwd"}, {Pass::BwdDet, "bwd_det"}, {Pass::FwdBwd, "fwdbwd"}};
  for (const AttentionShape& s : bert)
    for (const auto& v : variants)
      for (const auto& ps : passes) {
        const Opts o = v.first;
        const Pass p = ps.first;
        reg("attention/" + std::string(ps.second) + v.second + "/" + shape_name(s),
            [=](benchmark::State& st) { bench_attention(st, s, p, o); });
      }
}

}  // namespace

int main(int argc, char** argv) { return cutrain::bench::run_benchmarks(argc, argv, register_all); }
