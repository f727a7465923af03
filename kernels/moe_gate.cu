// @brief The MoE gate of kernels/moe_gate.cuh in three launches:
//   route     one block per chunk of 64 tokens, a warp per token: softmax, top-1 / top-2, the
//             chunk's per-expert counts and probability sums, each route's rank among the chunk's
//             earlier tokens with the same expert (so positions need no atomics);
//   scan      one block, a thread per expert: exclusive scans of the chunk counts over chunks
//             (route 1 after all of route 0), counts, capacity, kept counts, offsets, ce, l_aux;
//   finalize  a thread per token: position = chunk base + rank, the capacity test, the weights.
// The backward is one warp per token: the weights' normalization, the aux loss's constant term,
// then the softmax Jacobian.
#include "kernels/moe_gate.cuh"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/common/counter_uniform.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {
namespace {

constexpr int kChunk = 64;     // tokens per route block
constexpr int kThreads = 256;  // route / backward block
constexpr int kWarps = kThreads / 32;

std::size_t align16(std::size_t b) { return (b + 15) & ~std::size_t(15); }

// The workspace: chunk counts and chunk bases [k][chunks][E], chunk probability sums [chunks][E],
// ranks [T,k], the random token selection's key thresholds [E].
struct Workspace {
  std::int32_t* counts;
  std::int32_t* base;
  float* psum;
  std::int32_t* rank;
  std::uint64_t* thresh;
};
Workspace carve(void* ws, int tokens, int experts, int k) {
  const std::size_t chunks = ceil_div(tokens, kChunk);
  char* p = static_cast<char*>(ws);
  Workspace w{};
  w.counts = reinterpret_cast<std::int32_t*>(p);
  p += align16(sizeof(std::int32_t) * k * chunks * experts);
  w.base = reinterpret_cast<std::int32_t*>(p);
  p += align16(sizeof(std::int32_t) * k * chunks * experts);
  w.psum = reinterpret_cast<float*>(p);
  p += align16(sizeof(float) * chunks * experts);
  w.rank = reinterpret_cast<std::int32_t*>(p);
  p += align16(sizeof(std::int32_t) * std::size_t(tokens) * k);
  w.thresh = reinterpret_cast<std::uint64_t*>(p);
  return w;
}

// Arg-max over a warp: the larger value, the lower index on ties (NaN never wins).
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

template <int K>
__global__ void __launch_bounds__(kThreads) gate_route_kernel(const float* __restrict__ logits, int T, int E,
                                                               int chunks, MoeGateNoise noise,
                                                               float* __restrict__ probs,
                                                               std::int32_t* __restrict__ expert, Workspace ws) {
  __shared__ int sel[K][kChunk];
  const int chunk = blockIdx.x, t0 = chunk * kChunk, n = min(kChunk, T - t0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::uint64_t seed = noise.rsample || noise.second_sampling ? moe_noise_seed(noise.seed, noise.seed_word) : 0;
  for (int i = warp; i < n; i += kWarps) {
    const std::size_t s = std::size_t(t0 + i);
    const float* row = logits + s * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, row[e]);
    mx = warp_max(mx);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) sum += expf(row[e] - mx);
    const float inv = 1.f / warp_sum(sum);
    float best = -INFINITY;
    int best_e = E;
    for (int e = lane; e < E; e += 32) {
      const float p = expf(row[e] - mx) * inv;
      probs[s * E + e] = p;
      const float key = noise.rsample ? row[e] + counter_gumbel(seed, s * E + e) : p;
      if (key > best) {  // lanes visit e in increasing order: the first maximum stays
        best = key;
        best_e = e;
      }
    }
    warp_argmax(best, best_e);
    if (best_e == E) best_e = 0;  // an all-NaN row routes to expert 0
    if (lane == 0) {
      sel[0][i] = best_e;
      expert[s * K] = best_e;
    }
    if constexpr (K == 2) {
      float b2 = -INFINITY;
      int e2 = E;
      for (int e = lane; e < E; e += 32) {
        const float key = noise.second_sampling ? row[e] + counter_gumbel(seed, s * E + e) : row[e];
        if (e != best_e && key > b2) {
          b2 = key;
          e2 = e;
        }
      }
      warp_argmax(b2, e2);
      if (e2 == E) e2 = best_e == 0 ? 1 : 0;  // all other logits -inf/NaN: the lowest other index
      if (lane == 0) {
        sel[1][i] = e2;
        expert[s * K + 1] = e2;
      }
    }
  }
  __syncthreads();  // sel and this block's probs rows are visible to the whole block
  for (int e = threadIdx.x; e < E; e += kThreads) {
    for (int r = 0; r < K; ++r) {
      int c = 0;
      for (int i = 0; i < n; ++i) c += sel[r][i] == e;
      ws.counts[(std::size_t(r) * chunks + chunk) * E + e] = c;
    }
    float ps = 0.f;
    for (int i = 0; i < n; ++i) ps += probs[std::size_t(t0 + i) * E + e];
    ws.psum[std::size_t(chunk) * E + e] = ps;
  }
  for (int idx = threadIdx.x; idx < K * kChunk; idx += kThreads) {
    const int r = idx / kChunk, i = idx % kChunk;
    if (i >= n) continue;
    const int e = sel[r][i];
    int c = 0;
    for (int j = 0; j < i; ++j) c += sel[r][j] == e;
    ws.rank[std::size_t(t0 + i) * K + r] = c;
  }
}

__global__ void gate_scan_kernel(Workspace ws, int T, int E, int K, int chunks, bool drop, int capacity,
                                 MoeGateOutputs out) {
  __shared__ int s_count[kMoeMaxExperts];
  __shared__ double s_prod[kMoeMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = 0, total0 = 0;
    for (int r = 0; r < K; ++r) {
      for (int c = 0; c < chunks; ++c) {
        const std::size_t at = (std::size_t(r) * chunks + c) * E + e;
        ws.base[at] = run;
        run += ws.counts[at];
      }
      if (r == 0) total0 = run;
    }
    out.expert_counts[e] = run;
    s_count[e] = run;
    double me = 0;
    for (int c = 0; c < chunks; ++c) me += ws.psum[std::size_t(c) * E + e];
    me /= T;
    const double ce = double(total0) / T;
    out.ce[e] = float(ce);
    s_prod[e] = me * ce;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int cap = capacity;
  if (!drop) {
    cap = 0;
    for (int e = 0; e < E; ++e) cap = max(cap, s_count[e]);
  }
  double l = 0;
  int off = 0, dropped = 0;
  for (int e = 0; e < E; ++e) {
    l += s_prod[e];
    const int kept = min(s_count[e], cap);
    out.kept_counts[e] = kept;
    out.offsets[e] = off;
    off += kept;
    dropped += s_count[e] - kept;
  }
  out.offsets[E] = off;
  *out.l_aux = float(E * l);
  out.stats[0] = cap;
  out.stats[1] = dropped;
}

// ---- random token selection (top-1): the capacity-th largest key of each expert over capacity,
// by an MSB-first radix select over the 56-bit keys (8 bits a pass, integer histogram), then the
// chunk counts, ranks and bases of the kept tokens only ----

constexpr int kRtsThreads = 256;
constexpr int kRtsKeyBits = 56;  // moe_rts_key: 24 draw bits above 32 index bits

__global__ void __launch_bounds__(kRtsThreads) rts_select_kernel(const std::int32_t* __restrict__ expert, int T, int E,
                                                                  const std::int32_t* __restrict__ counts,
                                                                  const std::int32_t* __restrict__ stats,
                                                                  std::uint64_t seed_xor, const std::uint64_t* seed_word,
                                                                  std::uint64_t* __restrict__ thresh) {
  __shared__ int hist[256];
  const std::uint64_t seed = moe_noise_seed(seed_xor, seed_word);
  __shared__ std::uint64_t s_prefix;
  __shared__ int s_need;
  const int e = blockIdx.x;
  const int cap = stats[0];
  if (counts[e] <= cap) {  // block-uniform: every token of e is kept
    if (threadIdx.x == 0) thresh[e] = 0;
    return;
  }
  std::uint64_t prefix = 0;
  int need = cap;  // the rank (from the top) of the key sought among those matching `prefix`
  for (int shift = kRtsKeyBits - 8; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kRtsThreads) hist[b] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < T; s += kRtsThreads) {
      if (expert[s] != e) continue;
      const std::uint64_t key = moe_rts_key(seed, s, e, E);
      if ((key >> (shift + 8)) == (prefix >> (shift + 8))) atomicAdd(&hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int acc = 0;
      for (int b = 255; b >= 0; --b) {
        if (acc + hist[b] >= need) {
          s_prefix = prefix | (std::uint64_t(b) << shift);
          s_need = need - acc;
          break;
        }
        acc += hist[b];
      }
    }
    __syncthreads();
    prefix = s_prefix;
    need = s_need;
    __syncthreads();  // s_prefix / hist are rewritten by the next pass
  }
  if (threadIdx.x == 0) thresh[e] = prefix;  // keys are distinct: exactly the capacity-th largest
}

constexpr int kDroppedRank = 1 << 29;  // beyond any capacity: finalize drops the route

__global__ void __launch_bounds__(kRtsThreads) rts_rank_kernel(const std::int32_t* __restrict__ expert, int T, int E,
                                                                int chunks, std::uint64_t seed_xor,
                                                                const std::uint64_t* seed_word, Workspace ws) {
  __shared__ int sel[kChunk];
  const std::uint64_t seed = moe_noise_seed(seed_xor, seed_word);
  const int chunk = blockIdx.x, t0 = chunk * kChunk, n = min(kChunk, T - t0);
  if (threadIdx.x < n) {
    const int s = t0 + threadIdx.x, e = expert[s];
    sel[threadIdx.x] = moe_rts_key(seed, s, e, E) >= ws.thresh[e] ? e : -1;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kRtsThreads) {
    int c = 0;
    for (int i = 0; i < n; ++i) c += sel[i] == e;
    ws.counts[std::size_t(chunk) * E + e] = c;
  }
  if (threadIdx.x < n) {
    const int e = sel[threadIdx.x];
    int c = 0;
    for (int j = 0; j < int(threadIdx.x); ++j) c += sel[j] == e;
    ws.rank[t0 + threadIdx.x] = e < 0 ? kDroppedRank : c;
  }
}

__global__ void rts_base_kernel(Workspace ws, int E, int chunks) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = 0;
    for (int c = 0; c < chunks; ++c) {
      const std::size_t at = std::size_t(c) * E + e;
      ws.base[at] = run;
      run += ws.counts[at];
    }
  }
}

template <int K>
__global__ void gate_finalize_kernel(Workspace ws, int T, int E, int chunks, MoeGateOutputs out) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= T) return;
  const int cap = out.stats[0], chunk = s / kChunk;
  float p[K];
  bool kept[K];
  for (int r = 0; r < K; ++r) {
    const std::size_t at = std::size_t(s) * K + r;
    const int e = out.expert[at];
    const int pos = ws.base[(std::size_t(r) * chunks + chunk) * E + e] + ws.rank[at];
    kept[r] = pos < cap;
    out.position[at] = kept[r] ? pos : -1;
    p[r] = out.probs[std::size_t(s) * E + e];
  }
  if constexpr (K == 1) {
    out.weight[s] = kept[0] ? p[0] : 0.f;
  } else {
    const float a = kept[0] ? p[0] : 0.f, b = kept[1] ? p[1] : 0.f;
    const float d = fmaxf(a + b, FLT_EPSILON);
    out.weight[std::size_t(s) * 2] = a / d;
    out.weight[std::size_t(s) * 2 + 1] = b / d;
  }
}

template <int K>
__global__ void __launch_bounds__(kThreads) gate_backward_kernel(const float* __restrict__ probs,
                                                                  const std::int32_t* __restrict__ expert,
                                                                  const std::int32_t* __restrict__ position,
                                                                  const float* __restrict__ dweight,
                                                                  const float* __restrict__ ce, float aux_scale,
                                                                  int T, int E, bf16* __restrict__ dlogits) {
  const int s = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (s >= T) return;
  const float* p = probs + std::size_t(s) * E;
  int e_r[K];
  float g_r[K];
  if constexpr (K == 1) {
    e_r[0] = expert[s];
    g_r[0] = position[s] >= 0 ? dweight[s] : 0.f;
  } else {
    const std::size_t at = std::size_t(s) * 2;
    e_r[0] = expert[at];
    e_r[1] = expert[at + 1];
    const bool k0 = position[at] >= 0, k1 = position[at + 1] >= 0;
    const float a = k0 ? p[e_r[0]] : 0.f, b = k1 ? p[e_r[1]] : 0.f, d = a + b;
    const float dw0 = dweight[at], dw1 = dweight[at + 1];
    float da, db;
    if (d >= FLT_EPSILON) {  // w0 = a/d, w1 = b/d
      const float inv2 = 1.f / (d * d);
      da = (dw0 - dw1) * b * inv2;
      db = (dw1 - dw0) * a * inv2;
    } else {  // the denominator is the clamp's constant
      da = dw0 / FLT_EPSILON;
      db = dw1 / FLT_EPSILON;
    }
    g_r[0] = k0 ? da : 0.f;
    g_r[1] = k1 ? db : 0.f;
  }
  auto dp = [&](int e) {
    float v = aux_scale * ce[e];
    for (int r = 0; r < K; ++r) v += e == e_r[r] ? g_r[r] : 0.f;
    return v;
  };
  float dot = 0.f;
  for (int e = lane; e < E; e += 32) dot += p[e] * dp(e);
  dot = warp_sum(dot);
  for (int e = lane; e < E; e += 32)
    dlogits[std::size_t(s) * E + e] = __float2bfloat16_rn(p[e] * (dp(e) - dot));
}

void check_gate_dims(const char* fn, int tokens, int experts, int k) {
  CUTRAIN_CHECK(tokens > 0, fn, ": tokens must be > 0, got ", tokens);
  CUTRAIN_CHECK(experts >= 1 && experts <= kMoeMaxExperts, fn, ": experts must be in [1, ", kMoeMaxExperts,
                "], got ", experts);
  CUTRAIN_CHECK(k == 1 || k == 2, fn, ": k (routes per token) must be 1 or 2, got ", k);
  CUTRAIN_CHECK(k <= experts, fn, ": k = ", k, " routes per token need at least k experts, got ", experts);
}

}  // namespace

int moe_capacity(int tokens, int experts, int k, double capacity_factor, int min_capacity) {
  check_gate_dims("moe_capacity", tokens, experts, k);
  CUTRAIN_CHECK(capacity_factor > 0 && std::isfinite(capacity_factor),
                "moe_capacity: capacity_factor must be a finite number > 0, got ", capacity_factor);
  CUTRAIN_CHECK(min_capacity >= 0, "moe_capacity: min_capacity must be >= 0, got ", min_capacity);
  const double exact = double(tokens) / experts * (capacity_factor * k);
  CUTRAIN_CHECK(exact <= 2e9, "moe_capacity: capacity ", std::ceil(exact), " does not fit an int (at most 2e9)");
  // DeepSpeed's _capacity, torch.ceil((tokens / experts) * torch.tensor(factor · k)): a Python float
  // times an fp32 tensor, so tokens / experts and the factor are rounded to fp32 and so is their
  // product. Double arithmetic differs where the factor has no short binary form (100 / 2 · 1.1:
  // 50 · fp32(1.1) = 55.0000012 rounds to 55 in fp32, ceil 55; 55.00000000000001 in double, ceil 56),
  // which changes the [E, C] slots and the routes dropped.
  const float product = static_cast<float>(double(tokens) / experts) * static_cast<float>(capacity_factor * k);
  return std::max(static_cast<int>(std::ceil(product)), min_capacity);
}

std::size_t moe_gate_workspace_bytes(int tokens, int experts, int k) {
  check_gate_dims("moe_gate_workspace_bytes", tokens, experts, k);
  const std::size_t chunks = ceil_div(tokens, kChunk);
  return 2 * align16(sizeof(std::int32_t) * k * chunks * experts) + align16(sizeof(float) * chunks * experts) +
         align16(sizeof(std::int32_t) * std::size_t(tokens) * k) + align16(sizeof(std::uint64_t) * experts);
}

void moe_gate_forward(cudaStream_t s, const float* logits, const MoeGateShape& shape, const MoeGateOutputs& out,
                      void* workspace) {
  const char* fn = "moe_gate_forward";
  const int T = shape.tokens, E = shape.experts, K = shape.k;
  check_gate_dims(fn, T, E, K);
  CUTRAIN_CHECK(!shape.drop_tokens || shape.capacity > 0, fn, ": with drop_tokens the capacity must be > 0, got ",
                shape.capacity);
  CUTRAIN_CHECK(logits && out.probs && out.expert && out.position && out.weight && out.expert_counts &&
                    out.kept_counts && out.offsets && out.ce && out.l_aux && out.stats && workspace,
                fn, ": logits, every output and the workspace must be non-null");
  CUTRAIN_CHECK(is_aligned16(workspace), fn, ": the workspace must be 16-byte aligned, got ", workspace);
  NvtxRange range("moe_gate_fwd");
  const int chunks = ceil_div(T, kChunk);
  const Workspace ws = carve(workspace, T, E, K);
  CUTRAIN_CHECK(!shape.noise.rsample || K == 1, fn, ": RSample noise is top-1's (DeepSpeed ignores it under top-2)");
  CUTRAIN_CHECK(!shape.noise.second_sampling || K == 2, fn, ": second-expert sampling needs k = 2");
  CUTRAIN_CHECK(!shape.noise.rts || K == 1, fn, ": random token selection (rts) is top-1's (DeepSpeed's top-2 has none)");
  if (K == 1)
    gate_route_kernel<1><<<chunks, kThreads, 0, s>>>(logits, T, E, chunks, shape.noise, out.probs, out.expert, ws);
  else gate_route_kernel<2><<<chunks, kThreads, 0, s>>>(logits, T, E, chunks, shape.noise, out.probs, out.expert, ws);
  CUTRAIN_LAUNCH_CHECK("gate_route_kernel");
  const int scan_threads = std::min(kMoeMaxExperts, ceil_div(E, 32) * 32);
  gate_scan_kernel<<<1, scan_threads, 0, s>>>(ws, T, E, K, chunks, shape.drop_tokens, shape.capacity, out);
  CUTRAIN_LAUNCH_CHECK("gate_scan_kernel");
  if (shape.noise.rts && shape.drop_tokens) {  // without dropping every token fits: nothing to select
    rts_select_kernel<<<E, kRtsThreads, 0, s>>>(out.expert, T, E, out.expert_counts, out.stats, shape.noise.seed,
                                                shape.noise.seed_word, ws.thresh);
    CUTRAIN_LAUNCH_CHECK("rts_select_kernel");
    rts_rank_kernel<<<chunks, kRtsThreads, 0, s>>>(out.expert, T, E, chunks, shape.noise.seed, shape.noise.seed_word,
                                                   ws);
    CUTRAIN_LAUNCH_CHECK("rts_rank_kernel");
    rts_base_kernel<<<1, scan_threads, 0, s>>>(ws, E, chunks);
    CUTRAIN_LAUNCH_CHECK("rts_base_kernel");
  }
  const int blocks = ceil_div(T, 256);
  if (K == 1) gate_finalize_kernel<1><<<blocks, 256, 0, s>>>(ws, T, E, chunks, out);
  else gate_finalize_kernel<2><<<blocks, 256, 0, s>>>(ws, T, E, chunks, out);
  CUTRAIN_LAUNCH_CHECK("gate_finalize_kernel");
}

void moe_gate_backward(cudaStream_t s, const float* probs, const std::int32_t* expert, const std::int32_t* position,
                       const float* dweight, const float* ce, float aux_grad, int tokens, int experts, int k,
                       bf16* dlogits) {
  const char* fn = "moe_gate_backward";
  check_gate_dims(fn, tokens, experts, k);
  CUTRAIN_CHECK(probs && expert && position && dweight && ce && dlogits, fn, ": every pointer must be non-null");
  NvtxRange range("moe_gate_bwd");
  const float aux_scale = aux_grad * float(experts) / float(tokens);  // d l_aux / d p[s,e] = this · ce[e]
  const int blocks = ceil_div(tokens, kWarps);
  if (k == 1)
    gate_backward_kernel<1><<<blocks, kThreads, 0, s>>>(probs, expert, position, dweight, ce, aux_scale, tokens,
                                                         experts, dlogits);
  else
    gate_backward_kernel<2><<<blocks, kThreads, 0, s>>>(probs, expert, position, dweight, ce, aux_scale, tokens,
                                                         experts, dlogits);
  CUTRAIN_LAUNCH_CHECK("gate_backward_kernel");
}

namespace {

__global__ void step_figures_merge_kernel(const std::int32_t* __restrict__ kept, const std::int32_t* __restrict__ stats,
                                          const float* __restrict__ l_aux, int E, MoeStepFigures* __restrict__ acc,
                                          bool first) {
  int lo = 0x7fffffff, hi = -1;
  for (int e = threadIdx.x; e < E; e += kWarpSize) {
    lo = min(lo, kept[e]);
    hi = max(hi, kept[e]);
  }
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    lo = min(lo, __shfl_xor_sync(kFullMask, lo, o));
    hi = max(hi, __shfl_xor_sync(kFullMask, hi, o));
  }
  if (threadIdx.x != 0) return;
  MoeStepFigures f = first ? MoeStepFigures{} : *acc;
  f.l_aux_sum += *l_aux;
  f.capacity = stats[0];
  f.dropped += stats[1];
  f.min_load = first ? lo : min(f.min_load, lo);
  f.max_load = first ? hi : max(f.max_load, hi);
  f.forwards += 1;
  *acc = f;
}

}  // namespace

void moe_step_figures_merge(cudaStream_t s, const std::int32_t* kept_counts, const std::int32_t* stats,
                            const float* l_aux, int experts, MoeStepFigures* acc, bool first) {
  CUTRAIN_CHECK(experts >= 1 && experts <= kMoeMaxExperts, "moe_step_figures_merge: experts must be in [1, ",
                kMoeMaxExperts, "], got ", experts);
  CUTRAIN_CHECK(kept_counts && stats && l_aux && acc, "moe_step_figures_merge: every pointer must be non-null");
  step_figures_merge_kernel<<<1, kWarpSize, 0, s>>>(kept_counts, stats, l_aux, experts, acc, first);
  CUTRAIN_LAUNCH_CHECK("step_figures_merge_kernel");
}

}  // namespace cutrain::kernels
