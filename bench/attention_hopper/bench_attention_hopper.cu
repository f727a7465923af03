// @brief Issue #24's comparison: the sm90 attention pair (wgmma + TMA, kernels/attention_sm90/, the
// production kernels), each backward schedule, against the mma.sync pair it replaced
// (bench/attention_mma/, this benchmark's baseline) on the same inputs, in the same process, at S
// 512-8192 with B*S = 16384 tokens, 16 heads, d64 / d128, full and causal.
// Forward rows, kernels::attention_forward (the sm90 forward with its production tile):
// "attention_hopper/fwd[_causal]/B<b>H16S<s>D<d>", and at d64 each query tile named
// ("attention_hopper/fwd[_causal|_mask]_rows128|_rows192/<shape>"), on the sweep plus the peer's shapes it lacks
// (B4H16S512D64, B4H16S2048D64, B4H16S2048D128; compare.py pairs them with the peer's SDPA rows). Manual time and TFLOP/s
// (4·B·H·S²·D, halved causal) are the sm90 kernel's; mma_us / mma_TFLOP/s the mma.sync baseline's
// (median of 100 flushed calls, once per shape, before that shape's first row); speedup =
// mma_us / median_us. out_rel_diff / lse_rel_diff: ||sm90 - mma|| / ||mma|| of one call each (both
// within 1e-2 / 1e-4 of the references in the tests), so a wrong-but-fast kernel shows here too.
// Backward rows, "attention_hopper/bwd[_causal][_lockstep]/<shape>" (the whole backward: the
// production entry kernels::attention_backward without a determinism request, its plan for the
// shape, or with _lockstep the one-pass lockstep schedule: row_dot, the wgmma pass, the dQ
// convert; from the production forward's O and lse) and "attention_hopper/fwdbwd[_causal][_lockstep]/<shape>"
// (the production forward kernels::attention_forward, then the sm90 backward), on the
// same sweep plus bench/peers/attention_peer.py's shapes (B4H16S512D64, B4H16S2048D64,
// B4H16S2048D128; its B2H16S8192D64 is in the sweep), so compare.py pairs these rows with the
// peer's SDPA rows of the same pass and shape. TFLOP/s:
// 2.5x the forward's FLOPs for bwd, 3.5x for fwdbwd (halved causal); mma_us / mma_TFLOP/s: the
// mma.sync pair on the same inputs (median of 100 flushed calls, once per shape and pass, before
// its first row); dq/dk/dv_rel_diff: ||sm90 - mma|| / ||mma|| of one call.
// BERT's shapes (B64H16S128D64, B16H16S512D64, non-causal), every pass, plain and with
// its options as bench/bench_attention.cu runs them (the same mask of per-sequence lengths uniform
// in [S/4, S], the same dropout key, p 0.1), both sides given the same options:
// "attention_hopper/<pass>[_mask[_drop]][_lockstep]/<shape>", so compare.py pairs the
// production entry's rows (no schedule suffix) with the peer's "attention/<pass>_mask[_drop]/<shape>" SDPA rows (cuDNN
// among them). Their TFLOP/s count the full S^2 work, as bench_attention's do.
// Deterministic backward rows (the mode the models call: the dK/dV pass without atomics, then the
// dQ pass; the baseline's deterministic mode is its mma.sync dK/dV and dQ passes),
// "attention_hopper/bwd_det[_causal|_mask[_drop]]/<shape>": the production entry (its plan) at
// S 512-2048 of the sweep, the peer's shapes and BERT's shapes with its options.
// The backward schedules at the peer's shapes (B2H16S8192D64, B4H16S2048D64, B4H16S2048D128,
// B4H16S512D64; full and causal): "attention_hopper/bwd[_causal]_producer/<shape>" (fast mode)
// and "attention_hopper/bwd_det[_causal](_lockstep|_producer|_producer_overlap|_dqoverlap)/<shape>"
// (deterministic: the lockstep dK/dV pass with the serial dQ pass; the producer dK/dV pass with
// the serial dQ pass; its overlap loop with the overlap dQ pass; the lockstep dK/dV pass with the
// overlap dQ pass).
// At d128 the producer schedules run lockstep's kernel and the overlap dQ pass the serial one
// (registers: kernels/attention_sm90/), so those rows time the fallbacks.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/attention_mma/attention_mma.h"
#include "bench/support/bench_support.h"
#include "kernels/attention.cuh"
#include "kernels/attention_sm90/attention_sm90.h"
#include "kernels/attention_sm90/production.h"
#include "runtime/check.h"

using namespace cutrain;
using kernels::AttentionShape;

namespace {

using DevBuf = bench::DeviceBuffer;

std::string shape_name(const AttentionShape& s) {
  return "B" + std::to_string(s.batch) + "H" + std::to_string(s.heads) + "S" + std::to_string(s.seq) + "D" +
         std::to_string(s.head_dim);
}

template <typename T>
std::vector<float> download(const DevBuf& b, std::size_t n) {
  std::vector<T> h(n);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (std::size_t i = 0; i < n; ++i) f[i] = static_cast<float>(h[i]);
  return f;
}

// BERT's options as bench_attention's rows use them.
enum class Opts { Plain, Mask, MaskDrop };
const char* opts_suffix(Opts o) { return o == Opts::Plain ? "" : o == Opts::Mask ? "_mask" : "_mask_drop"; }

// bench_attention's key mask [B, S]: sequence b valid up to a length uniform in [S/4, S] (fixed seed).
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

// The options of a row and the device mask they point at.
struct RowOptions {
  DevBuf mask;
  kernels::AttentionOptions opt;
  RowOptions(const AttentionShape& sh, Opts o) : mask(std::size_t(sh.batch) * sh.seq) {
    if (o != Opts::Plain) {
      const auto m = padding_mask(sh);
      CUTRAIN_CUDA_CHECK(cudaMemcpy(mask.as<std::uint8_t>(), m.data(), m.size(), cudaMemcpyHostToDevice));
      opt.key_mask = mask.as<std::uint8_t>();
    }
    if (o == Opts::MaskDrop) {
      opt.dropout = {1234, 1, 0, nullptr};
      opt.dropout_p = 0.1f;
    }
  }
};

double rel_diff(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) && a[i] == ref[i]) continue;  // lse -inf of a row with no key, on both sides
    if (!std::isfinite(a[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den == 0 ? (num == 0 ? 0.0 : INFINITY) : std::sqrt(num / den);
}

// The mma.sync baseline forward's time and outputs for the last shape measured: the rows of a shape
// run back to back (register_all's order) on the same inputs, so it runs once per shape.
struct Baseline {
  std::string shape;
  double median_us = 0;
  std::vector<float> out, lse;
};

// tile: an sm90 forward query tile, or none: the production entry kernels::attention_forward.
void bench_forward(benchmark::State& state, AttentionShape sh, Opts opts = Opts::Plain,
                   std::optional<kernels::sm90::FwdTile> tile = std::nullopt) {
  if (!bench::require_gpu(state)) return;
  static Baseline prod;
  const std::size_t n_o = std::size_t(sh.batch) * sh.seq * sh.heads * sh.head_dim, n_qkv = 3 * n_o;
  const std::size_t n_l = std::size_t(sh.batch) * sh.heads * sh.seq;
  DevBuf qkv(n_qkv * 2), out_h(n_o * 2), lse_h(n_l * 4);
  bench::fill_uniform(qkv.as<bf16>(), n_qkv, -1.f, 1.f, 1);  // same seed: same inputs for every row of a shape
  const RowOptions ro(sh, opts);
  cudaStream_t st0 = bench::bench_stream();
  const std::string key = shape_name(sh) + (sh.causal ? "_causal" : "") + opts_suffix(opts);
  if (prod.shape != key) {
    DevBuf out_p(n_o * 2), lse_p(n_l * 4);
    auto prod_fwd = [&](cudaStream_t st) {
      bench::mma_attention::attention_forward(st, qkv.as<bf16>(), out_p.as<bf16>(), lse_p.as<float>(), sh, ro.opt);
    };
    prod_fwd(st0);
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(st0));
    prod.out = download<bf16>(out_p, n_o);
    prod.lse = download<float>(lse_p, n_l);
    prod.median_us = bench::time_median(prod_fwd, 100).median_us;
    prod.shape = key;
  }
  auto hopper_fwd = [&](cudaStream_t st) {
    if (tile)
      kernels::sm90::attention_forward(st, qkv.as<bf16>(), out_h.as<bf16>(), lse_h.as<float>(), sh, ro.opt, *tile);
    else
      kernels::attention_forward(st, qkv.as<bf16>(), out_h.as<bf16>(), lse_h.as<float>(), sh, ro.opt);
  };
  hopper_fwd(st0);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(st0));
  const double out_diff = rel_diff(download<bf16>(out_h, n_o), prod.out);
  const double lse_diff = rel_diff(download<float>(lse_h, n_l), prod.lse);

  const double flops = kernels::attention_forward_flops(sh), bytes = 2.0 * (n_qkv + n_o) + 4.0 * n_l;
  const bench::Timing mine = bench::run_timed(state, hopper_fwd, bytes, flops);
  state.counters["mma_us"] = prod.median_us;
  state.counters["mma_TFLOP/s"] = prod.median_us > 0 ? flops / (prod.median_us * 1e-6) / 1e12 : 0.0;
  state.counters["speedup"] = mine.median_us > 0 ? prod.median_us / mine.median_us : 0.0;
  state.counters["out_rel_diff"] = out_diff;
  state.counters["lse_rel_diff"] = lse_diff;
}

// The backward rows. O and lse come from the production forward on the same qkv, dO is fixed: both
// backward calls see the same inputs. fwdbwd: each side's forward then its backward.
// The mma.sync side of the last backward shape and pass measured: a shape's two schedules run
// back to back (register_all's order) on the same inputs, so it runs once per shape and pass.
struct BaselineBwd {
  std::string key;
  double median_us = 0;
  std::vector<float> dqkv;
};

// schedule: an sm90 dK/dV schedule, or none: the production entry kernels::attention_backward (its
// plan for the shape and `det`; dq_schedule unused).
void bench_backward(benchmark::State& state, AttentionShape sh, bool with_forward,
                    std::optional<kernels::sm90::BackwardSchedule> schedule, Opts opts = Opts::Plain, bool det = false,
                    kernels::sm90::DqSchedule dq_schedule = kernels::sm90::DqSchedule::Serial) {
  if (!bench::require_gpu(state)) return;
  const std::size_t n_o = std::size_t(sh.batch) * sh.seq * sh.heads * sh.head_dim, n_qkv = 3 * n_o;
  const std::size_t n_l = std::size_t(sh.batch) * sh.heads * sh.seq;
  const std::size_t n_scratch = kernels::attention_backward_scratch_bytes(sh, false);
  DevBuf qkv(n_qkv * 2), dout(n_o * 2), out(n_o * 2), lse(n_l * 4), out_h(n_o * 2), lse_h(n_l * 4);
  DevBuf dqkv_p(n_qkv * 2), dqkv_h(n_qkv * 2), scratch_p(n_scratch), scratch_h(n_scratch);
  bench::fill_uniform(qkv.as<bf16>(), n_qkv, -1.f, 1.f, 1);
  bench::fill_uniform(dout.as<bf16>(), n_o, -1.f, 1.f, 2);
  const RowOptions ro(sh, opts);
  const kernels::AttentionOptions& opt = ro.opt;
  cudaStream_t st0 = bench::bench_stream();
  kernels::attention_forward(st0, qkv.as<bf16>(), out.as<bf16>(), lse.as<float>(), sh, opt);

  static BaselineBwd prod_cache;
  auto prod = [&](cudaStream_t st) {
    if (with_forward)
      bench::mma_attention::attention_forward(st, qkv.as<bf16>(), out.as<bf16>(), lse.as<float>(), sh, opt);
    bench::mma_attention::attention_backward(st, qkv.as<bf16>(), out.as<bf16>(), dout.as<bf16>(), lse.as<float>(),
                                             dqkv_p.as<bf16>(), scratch_p.get(), sh, det, opt);
  };
  // Ours reads its own forward's O and lse in fwdbwd, the production forward's in bwd.
  const bf16* o_in = with_forward ? out_h.as<bf16>() : out.as<bf16>();
  const float* l_in = with_forward ? lse_h.as<float>() : lse.as<float>();
  auto hopper = [&](cudaStream_t st) {
    if (with_forward) kernels::attention_forward(st, qkv.as<bf16>(), out_h.as<bf16>(), lse_h.as<float>(), sh, opt);
    if (schedule)
      kernels::sm90::attention_backward(st, qkv.as<bf16>(), o_in, dout.as<bf16>(), l_in, dqkv_h.as<bf16>(),
                                        scratch_h.get(), sh, *schedule, opt, det, dq_schedule);
    else
      kernels::attention_backward(st, qkv.as<bf16>(), o_in, dout.as<bf16>(), l_in, dqkv_h.as<bf16>(), scratch_h.get(),
                                  sh, det, opt);
  };
  const std::string key =
      shape_name(sh) + (sh.causal ? "_causal" : "") + opts_suffix(opts) + (with_forward ? "_fwdbwd" : "_bwd") +
      (det ? "_det" : "");
  if (prod_cache.key != key) {
    prod(st0);
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(st0));
    prod_cache.dqkv = download<bf16>(dqkv_p, n_qkv);
    prod_cache.median_us = bench::time_median(prod, 100).median_us;
    prod_cache.key = key;
  }
  hopper(st0);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(st0));
  const std::vector<float>& g_p = prod_cache.dqkv;
  const std::vector<float> g_h = download<bf16>(dqkv_h, n_qkv);
  const double prod_us = prod_cache.median_us;

  const double flops = kernels::attention_backward_flops(sh) + (with_forward ? kernels::attention_forward_flops(sh) : 0);
  const double bwd_bytes = 2.0 * (2 * n_qkv + 2 * n_o) + 4.0 * n_l, fwd_bytes = 2.0 * (n_qkv + n_o) + 4.0 * n_l;
  const bench::Timing mine = bench::run_timed(state, hopper, bwd_bytes + (with_forward ? fwd_bytes : 0), flops);
  state.counters["mma_us"] = prod_us;
  state.counters["mma_TFLOP/s"] = prod_us > 0 ? flops / (prod_us * 1e-6) / 1e12 : 0.0;
  state.counters["speedup"] = mine.median_us > 0 ? prod_us / mine.median_us : 0.0;
  // dqkv per slot (q, k, v) of [B, S, 3, H, D].
  const std::size_t row = std::size_t(sh.heads) * sh.head_dim;
  const char* names[3] = {"dq_rel_diff", "dk_rel_diff", "dv_rel_diff"};
  for (int w = 0; w < 3; ++w) {
    std::vector<float> a, r;
    a.reserve(n_o);
    r.reserve(n_o);
    for (std::size_t t = 0; t < std::size_t(sh.batch) * sh.seq; ++t) {
      a.insert(a.end(), g_h.begin() + (3 * t + w) * row, g_h.begin() + (3 * t + w + 1) * row);
      r.insert(r.end(), g_p.begin() + (3 * t + w) * row, g_p.begin() + (3 * t + w + 1) * row);
    }
    state.counters[names[w]] = rel_diff(a, r);
  }
}

// The plain backward rows: the production entry (no suffix: compare.py pairs it with the peer's)
// and the one-pass lockstep schedule ("_lockstep").
const std::optional<kernels::sm90::BackwardSchedule> kBwdRows[] = {std::nullopt,
                                                                   kernels::sm90::BackwardSchedule::Lockstep};

void register_all() {
  // The forward sweep (B*S = 16384), then the shapes of bench_attention's SDPA comparison that the
  // sweep lacks (B2H16S8192D64 is in it), so that one filter ('attention_hopper/fwd') times every
  // compared shape; BERT's shapes follow with the options below.
  std::vector<AttentionShape> fwd_shapes;
  for (int d : {64, 128})
    for (bool causal : {false, true})
      for (int s : {512, 1024, 2048, 4096, 8192}) fwd_shapes.push_back({16384 / s, s, 16, d, causal});
  for (bool causal : {false, true})
    for (const AttentionShape sh : {AttentionShape{4, 512, 16, 64}, AttentionShape{4, 2048, 16, 64},
                                    AttentionShape{4, 2048, 16, 128}})
      fwd_shapes.push_back({sh.batch, sh.seq, sh.heads, sh.head_dim, causal});
  // "attention_hopper/fwd<variant>[_rows128|_rows192]/<shape>": the production entry, then at d64
  // each query tile (with dropout both run Rows128, so no tile rows there).
  using kernels::sm90::FwdTile;
  auto add_forward_rows = [](const AttentionShape& sh, Opts o, const std::string& variant) {
    const std::string tail = "/" + shape_name(sh);
    auto add = [&](const std::string& name, std::optional<FwdTile> tile) {
      benchmark::RegisterBenchmark(name.c_str(), [sh, o, tile](benchmark::State& st) { bench_forward(st, sh, o, tile); })
          ->UseManualTime()
          ->Iterations(100)  // a median of 100 flushed samples
          ->Unit(benchmark::kMicrosecond);
    };
    add("attention_hopper/fwd" + variant + tail, std::nullopt);
    if (sh.head_dim != 64 || o == Opts::MaskDrop) return;
    add("attention_hopper/fwd" + variant + "_rows128" + tail, FwdTile::Rows128);
    add("attention_hopper/fwd" + variant + "_rows192" + tail, FwdTile::Rows192);
  };
  for (const AttentionShape& sh : fwd_shapes) add_forward_rows(sh, Opts::Plain, sh.causal ? "_causal" : "");
  // The backward sweep, then the peer's shapes that the sweep lacks.
  std::vector<AttentionShape> bwd_shapes;
  for (int d : {64, 128})
    for (bool causal : {false, true})
      for (int s : {512, 1024, 2048, 4096, 8192}) bwd_shapes.push_back({16384 / s, s, 16, d, causal});
  for (bool causal : {false, true})
    for (const AttentionShape sh : {AttentionShape{4, 512, 16, 64}, AttentionShape{4, 2048, 16, 64},
                                    AttentionShape{4, 2048, 16, 128}})
      bwd_shapes.push_back({sh.batch, sh.seq, sh.heads, sh.head_dim, causal});
  using kernels::sm90::BackwardSchedule;
  for (bool with_forward : {false, true})  // every bwd row, then every fwdbwd row (filters split them)
    for (const AttentionShape& sh : bwd_shapes)
      for (std::optional<BackwardSchedule> schedule : kBwdRows) {
        const std::string name = std::string("attention_hopper/") + (with_forward ? "fwdbwd" : "bwd") +
                                 (sh.causal ? "_causal" : "") + (schedule ? "_lockstep/" : "/") + shape_name(sh);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [sh, with_forward, schedule](benchmark::State& st) {
                                       bench_backward(st, sh, with_forward, schedule);
                                     })
            ->UseManualTime()
            ->Iterations(100)
            ->Unit(benchmark::kMicrosecond);
      }
  // The deterministic mode (the models'): the production entry, d64 / d128 at S 512-2048 and
  // BERT's shapes with its options.
  for (const AttentionShape& sh : bwd_shapes) {
    if (sh.seq > 2048) continue;
    const std::string name =
        std::string("attention_hopper/bwd_det") + (sh.causal ? "_causal/" : "/") + shape_name(sh);
    benchmark::RegisterBenchmark(name.c_str(),
                                 [sh](benchmark::State& st) {
                                   bench_backward(st, sh, false, std::nullopt, Opts::Plain, true);
                                 })
        ->UseManualTime()
        ->Iterations(100)
        ->Unit(benchmark::kMicrosecond);
  }
  for (const AttentionShape sh : {AttentionShape{64, 128, 16, 64, false}, AttentionShape{16, 512, 16, 64, false}})
    for (Opts o : {Opts::Plain, Opts::Mask, Opts::MaskDrop}) {
      const std::string name = std::string("attention_hopper/bwd_det") + opts_suffix(o) + "/" + shape_name(sh);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [sh, o](benchmark::State& st) {
                                     bench_backward(st, sh, false, std::nullopt, o, true);
                                   })
          ->UseManualTime()
          ->Iterations(100)
          ->Unit(benchmark::kMicrosecond);
    }
  // The warp-specialized schedules (issue #24's long-S gap to cuDNN) at the peer's shapes, causal
  // or not: fast mode "bwd[_causal]_producer"; deterministic mode "bwd_det[_causal]_lockstep"
  // (lockstep dK/dV pass, serial dQ pass), "bwd_det[_causal]_producer" (producer dK/dV pass, serial
  // dQ pass), "bwd_det[_causal]_producer_overlap" (its overlap loop, overlap dQ pass),
  // "bwd_det[_causal]_dqoverlap" (lockstep dK/dV pass, overlap dQ pass), and the production
  // "bwd_det[_causal]" row at S8192, which the deterministic rows above skip.
  using kernels::sm90::DqSchedule;
  struct WsRow {
    const char* suffix;
    bool det;
    std::optional<BackwardSchedule> schedule;  // none: the production entry
    DqSchedule dq;
  };
  const WsRow ws_rows[] = {{"_producer", false, BackwardSchedule::Producer, DqSchedule::Serial},
                           {"", true, std::nullopt, DqSchedule::Serial},
                           {"_lockstep", true, BackwardSchedule::Lockstep, DqSchedule::Serial},
                           {"_producer", true, BackwardSchedule::Producer, DqSchedule::Serial},
                           {"_producer_overlap", true, BackwardSchedule::ProducerOverlap, DqSchedule::Overlap},
                           {"_dqoverlap", true, BackwardSchedule::Lockstep, DqSchedule::Overlap}};
  for (bool causal : {false, true})
    for (const AttentionShape base : {AttentionShape{2, 8192, 16, 64}, AttentionShape{4, 2048, 16, 64},
                                      AttentionShape{4, 2048, 16, 128}, AttentionShape{4, 512, 16, 64}}) {
      const AttentionShape sh{base.batch, base.seq, base.heads, base.head_dim, causal};
      for (const WsRow& r : ws_rows) {
        if (!r.schedule && sh.seq <= 2048) continue;  // registered above
        const std::string name = std::string("attention_hopper/") + (r.det ? "bwd_det" : "bwd") +
                                 (causal ? "_causal" : "") + r.suffix + "/" + shape_name(sh);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [sh, r](benchmark::State& st) {
                                       bench_backward(st, sh, false, r.schedule, Opts::Plain, r.det, r.dq);
                                     })
            ->UseManualTime()
            ->Iterations(100)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  // BERT's shapes, plain and with its options: each pass.
  const std::vector<AttentionShape> bert = {{64, 128, 16, 64, false}, {16, 512, 16, 64, false}};
  for (const AttentionShape& sh : bert)
    for (Opts o : {Opts::Plain, Opts::Mask, Opts::MaskDrop}) {
      const std::string tail = std::string("/") + shape_name(sh);
      add_forward_rows(sh, o, opts_suffix(o));
      for (bool with_forward : {false, true})
        for (std::optional<BackwardSchedule> schedule : kBwdRows) {
          const std::string name = std::string("attention_hopper/") + (with_forward ? "fwdbwd" : "bwd") +
                                   opts_suffix(o) + (schedule ? "_lockstep" : "") + tail;
          benchmark::RegisterBenchmark(name.c_str(),
                                       [sh, with_forward, schedule, o](benchmark::State& st) {
                                         bench_backward(st, sh, with_forward, schedule, o);
                                       })
              ->UseManualTime()
              ->Iterations(100)
              ->Unit(benchmark::kMicrosecond);
        }
    }
}

}  // namespace

int main(int argc, char** argv) { return cutrain::bench::run_benchmarks(argc, argv, register_all); }
