// @brief Adam / AdamW in one grid-stride launch over the flat buffers, one template instance per
// (layout, gradient type, tile, compensated or not, parameter type: bf16, or fp16 with the Baseline
// layout's fp32 master only). Memory-bound: each thread moves 8 elements per iteration in
// warp-coalesced chunks; the math is DeepSpeed's FusedAdam (apex multi_tensor_adam):
//   Adam  (L2):      g += wd * p;  m, v updated;  p -= lr * m_hat / (sqrt(v_hat) + eps)
//   AdamW (decoupled):              m, v updated;  p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)
// Compensated bf16 master (Kahan): the weight is w + c (bf16 param + bf16 compensation), updated
// in fp32; w' = round(x), c' = rne(x - w') (x - w' is exact in fp32).
#include "kernels/adamw.cuh"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/common/chunk_io.cuh"
#include "kernels/common/stochastic_round.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerSm = 8;

struct AdamConsts {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2;
  float inv_bc1, inv_bc2;  // 1 / (1 - beta^step)
  float eps, wd;
  float grad_scale;
  bool decoupled;
  bool sr;
  std::uint64_t seed, step;
};

template <typename P>
struct AdamPtrs {
  P* params;  // the 16-bit model copy (bf16 or fp16)
  const void* grads;
  float* master;
  void* m;
  void* v;
  std::size_t n;
  const float* device_scale;
  const int* skip;
  P* comp;  // the compensation buffer (compensated bf16 instances only)
};

__device__ __forceinline__ void adam_math(const AdamConsts& c, float g, float& p, float& m, float& v) {
  if (!c.decoupled) g = fmaf(c.wd, p, g);
  m = fmaf(c.beta1, m, c.one_minus_beta1 * g);
  v = fmaf(c.beta2, v, c.one_minus_beta2 * g * g);
  const float denom = sqrtf(v * c.inv_bc2) + c.eps;
  float update = __fdividef(m * c.inv_bc1, denom);
  if (c.decoupled) update = fmaf(c.wd, p, update);
  p = fmaf(-c.lr, update, p);
}

// The SR keys of the current 2^32-element window (recomputed only when it changes).
struct SrState {
  std::uint32_t hi0 = 0xffffffffu, key0 = 0, key1 = 0;
};

// ---- warp-coalesced chunks ----
// A warp handles a tile of 32 * C * U consecutive elements: lane l's chunk u is the C elements at
// tile + u * 32 * C + l * C, so every warp-wide access of every array is one contiguous run.
// The tile table (AdamTile, chosen by dtype): C = 4 when any array is fp32 (float4 per lane, bf16
// as 8 bytes), else C = 8 (16-byte bf16); U = 8 / C chunks in flight per thread, so each thread
// moves 8 elements per iteration. Misaligned buffers take C = U = 1.
template <int C, int U>
struct AdamTile {
  static constexpr int kChunk = C, kChunks = U;
};
template <OptimizerLayout L, typename G>
using VectorTile = std::conditional_t<L != OptimizerLayout::Bf16Full || std::is_same_v<G, float>, AdamTile<4, 2>,
                                      AdamTile<8, 1>>;
using ScalarTile = AdamTile<1, 1>;

// The draws (stochastic_round.cuh: sr_draws) for the C elements at `base` (C even and base a multiple
// of C, or C = 1): one mix per element pair for the parameter, one per element for m and v.
template <int C, bool kMoments>
__device__ __forceinline__ void sr_chunk(const AdamConsts& c, std::size_t base, SrState& st, std::uint32_t rp[C],
                                         std::uint32_t rm[C], std::uint32_t rv[C]) {
  const std::uint32_t hi = static_cast<std::uint32_t>(base >> 32), lo = static_cast<std::uint32_t>(base);
  if (hi != st.hi0) {
    st.key0 = sr_key(c.seed, c.step, 0, hi);
    if constexpr (kMoments) st.key1 = sr_key(c.seed, c.step, 1, hi);
    st.hi0 = hi;
  }
  if constexpr (C == 1) {
    rp[0] = sr_pair_half(sr_bits(st.key0, lo >> 1), lo);
  } else {
#pragma unroll
    for (int i = 0; i < C / 2; ++i) {
      const std::uint32_t h = sr_bits(st.key0, (lo >> 1) + i);
      rp[2 * i] = h & 0xffffu;
      rp[2 * i + 1] = h >> 16;
    }
  }
  if constexpr (kMoments) {
#pragma unroll
    for (int i = 0; i < C; ++i) {
      const std::uint32_t h = sr_bits(st.key1, lo + i);
      rm[i] = h & 0xffffu;
      rv[i] = h >> 16;
    }
  }
}

// U chunks of C elements, the first at `base`, the next ones 32 * C further each.
template <OptimizerLayout L, typename G, bool K, int C, int U, typename P>
__device__ __forceinline__ void adam_chunks(const AdamConsts& c, const AdamPtrs<P>& a, float scale, std::size_t base,
                                            SrState& st) {
  constexpr bool kFull = L == OptimizerLayout::Bf16Full;
  using Moment = std::conditional_t<kFull, bf16, float>;
  constexpr std::size_t kStep = 32 * C;
  static_assert(!K || L != OptimizerLayout::Baseline, "the compensation belongs to bf16 master weights");
  float g[U][C], p[U][C], m[U][C], v[U][C], k_[K ? U : 1][C];
#pragma unroll
  for (int u = 0; u < U; ++u) {  // every load of every chunk issued before any math
    const std::size_t i = base + u * kStep;
    load_c<C>(static_cast<const G*>(a.grads) + i, g[u]);
    if constexpr (L == OptimizerLayout::Baseline) load_c<C>(a.master + i, p[u]);
    else load_c<C>(a.params + i, p[u]);
    if constexpr (K) load_c<C>(a.comp + i, k_[u]);
    load_c<C>(static_cast<const Moment*>(a.m) + i, m[u]);
    load_c<C>(static_cast<const Moment*>(a.v) + i, v[u]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int k = 0; k < C; ++k) {
      if constexpr (K) p[u][k] += k_[u][k];  // w + c: exact while |c| >= 2^-16 |w|, else fp32's rounding
      adam_math(c, g[u][k] * scale, p[u][k], m[u][k], v[u][k]);
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::size_t i = base + u * kStep;
    std::uint32_t rp[C], rm[C], rv[C];
    if (c.sr) sr_chunk<C, kFull>(c, i, st, rp, rm, rv);
    if constexpr (L == OptimizerLayout::Baseline) store_c<C>(a.master + i, p[u]);
    if constexpr (K) {
      // w' rounded (nearest or stochastic), then the residual x - w' (exact in fp32) to bf16.
#pragma unroll
      for (int k = 0; k < C; ++k) {
        const float x = p[u][k];
        p[u][k] = __bfloat162float(c.sr ? bf16_round_stochastic(x, rp[k]) : __float2bfloat16_rn(x));
        k_[u][k] = x - p[u][k];
      }
      store_c<C>(a.comp + i, k_[u], false, rp);
      store_c<C>(a.params + i, p[u], false, rp);  // already bf16 values: the store is exact
    } else {
      store_c<C>(a.params + i, p[u], c.sr, rp);
    }
    if constexpr (kFull) {
      store_c<C>(static_cast<bf16*>(a.m) + i, m[u], c.sr, rm);
      store_c<C>(static_cast<bf16*>(a.v) + i, v[u], c.sr, rv);
    } else {
      store_c<C>(static_cast<float*>(a.m) + i, m[u]);
      store_c<C>(static_cast<float*>(a.v) + i, v[u]);
    }
  }
}

template <OptimizerLayout L, typename G, bool K, class Tile, typename P>
__global__ void __launch_bounds__(kThreads) adam_kernel(AdamConsts c, AdamPtrs<P> a) {
  constexpr int C = Tile::kChunk, U = Tile::kChunks;
  if (a.skip != nullptr && *a.skip != 0) return;
  const float scale = c.grad_scale * (a.device_scale != nullptr ? *a.device_scale : 1.f);
  constexpr std::size_t kTile = 32 * C * U;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t warp = tid / 32, lane = tid % 32;
  const std::size_t nwarps = static_cast<std::size_t>(gridDim.x) * blockDim.x / 32;
  const std::size_t tiles = a.n / kTile;
  SrState st;
  for (std::size_t t = warp; t < tiles; t += nwarps) adam_chunks<L, G, K, C, U>(c, a, scale, t * kTile + lane * C, st);
  if constexpr (kTile > 1) {
    // The n % kTile tail (< 256 elements), one element per leading thread (the grid has >= 256).
    const std::size_t i = tiles * kTile + tid;
    if (i < a.n) adam_chunks<L, G, K, 1, 1>(c, a, scale, i, st);
  }
}

// Grid size: one wave of resident blocks (grid-stride), at most enough for `threads_needed`.
template <typename K>
unsigned resident_blocks(K kernel, std::size_t threads_needed) {
  int dev = 0, sms = 0, per_sm = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUTRAIN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  per_sm = std::max(1, std::min(per_sm, kMaxBlocksPerSm));
  const std::size_t want = ceil_div<std::size_t>(threads_needed > 0 ? threads_needed : 1, kThreads);
  return static_cast<unsigned>(std::min<std::size_t>(want, static_cast<std::size_t>(sms) * per_sm));
}

template <OptimizerLayout L, typename G, bool K, class Tile, typename P>
void launch(cudaStream_t s, const AdamConsts& c, const AdamPtrs<P>& a, const char* what) {
  auto kernel = adam_kernel<L, G, K, Tile, P>;
  const unsigned blocks = resident_blocks(kernel, ceil_div<std::size_t>(a.n, Tile::kChunk * Tile::kChunks));
  kernel<<<blocks, kThreads, 0, s>>>(c, a);
  CUTRAIN_LAUNCH_CHECK(what);
}

template <OptimizerLayout L, typename G, bool K, typename P>
void launch_layout(cudaStream_t s, const AdamConsts& c, const AdamPtrs<P>& a, bool vec) {
  if (vec) launch<L, G, K, VectorTile<L, G>>(s, c, a, "adam_kernel<vector>");
  else launch<L, G, K, ScalarTile>(s, c, a, "adam_kernel<scalar>");
}

// Gradients of the parameters' own type or fp32 (checked by adam_step).
template <OptimizerLayout L, bool K, typename P>
void launch_grad_type(cudaStream_t s, DType gt, const AdamConsts& c, const AdamPtrs<P>& a, bool vec) {
  if (gt == DType::F32) launch_layout<L, float, K>(s, c, a, vec);
  else launch_layout<L, P, K>(s, c, a, vec);
}

// The bf16-master layouts, plain or compensated (Baseline has no compensated instance).
template <OptimizerLayout L>
void launch_bf16_master(cudaStream_t s, DType gt, const AdamConsts& c, const AdamPtrs<bf16>& a, bool vec) {
  if (a.comp != nullptr) launch_grad_type<L, true>(s, gt, c, a, vec);
  else launch_grad_type<L, false>(s, gt, c, a, vec);
}

const char* layout_name(OptimizerLayout l) {
  switch (l) {
    case OptimizerLayout::Baseline: return "Baseline";
    case OptimizerLayout::Bf16MasterWG: return "Bf16MasterWG";
    case OptimizerLayout::Bf16Full: return "Bf16Full";
  }
  return "?";
}

}  // namespace

double adam_bytes_per_param(OptimizerLayout layout, DType grad_type, bool compensated) {
  const double g = static_cast<double>(dtype_size(grad_type));
  const double k = compensated && layout != OptimizerLayout::Baseline ? 4 : 0;  // r/w the bf16 compensation
  switch (layout) {
    case OptimizerLayout::Baseline: return 2 + g + 8 + 8 + 8;      // write param; read grad; r/w master, m, v (fp32)
    case OptimizerLayout::Bf16MasterWG: return 4 + g + 8 + 8 + k;  // r/w param; read grad; r/w m, v (fp32)
    case OptimizerLayout::Bf16Full: return 4 + g + 4 + 4 + k;      // r/w param; read grad; r/w m, v (bf16)
  }
  return 0;
}

template <typename P>
void adam_step(cudaStream_t s, OptimizerLayout layout, const AdamParams& p, P* params, const void* grads,
               DType grad_type, float* master, void* m, void* v, std::size_t n, const float* device_scale,
               const int* skip, nondeduced_t<P>* compensation) {
  constexpr DType kParamType = dtype_of<P>();
  CUTRAIN_CHECK(grad_type == kParamType || grad_type == DType::F32, "adam_step: grad_type must be ",
                dtype_name(kParamType), " (the parameters' type) or float32, got ", dtype_name(grad_type));
  CUTRAIN_CHECK(kParamType == DType::BF16 || layout == OptimizerLayout::Baseline, "adam_step: ",
                dtype_name(kParamType), " parameters need the fp32 master weights (layout Baseline), got layout ",
                layout_name(layout));
  CUTRAIN_CHECK(kParamType == DType::BF16 || !p.stochastic_rounding,
                "adam_step: stochastic rounding is for bf16 parameters, got ", dtype_name(kParamType));
  CUTRAIN_CHECK(p.step >= 1, "adam_step: step is 1-based (bias correction), got ", p.step);
  CUTRAIN_CHECK(p.beta1 >= 0.f && p.beta1 < 1.f && p.beta2 >= 0.f && p.beta2 < 1.f,
                "adam_step: betas must lie in [0, 1), got (", p.beta1, ", ", p.beta2, ")");
  CUTRAIN_CHECK(std::isfinite(p.lr) && std::isfinite(p.eps) && std::isfinite(p.weight_decay) && std::isfinite(p.grad_scale),
                "adam_step: lr, eps, weight_decay and grad_scale must be finite, got lr=", p.lr, " eps=", p.eps,
                " weight_decay=", p.weight_decay, " grad_scale=", p.grad_scale);
  if (n == 0) return;
  CUTRAIN_CHECK(params && grads && m && v, "adam_step (", layout_name(layout),
                "): params, grads, m and v must be non-null for n = ", n);
  CUTRAIN_CHECK(layout != OptimizerLayout::Baseline || master != nullptr,
                "adam_step: layout Baseline needs the fp32 master weights, got master = null");
  CUTRAIN_CHECK(layout != OptimizerLayout::Baseline || compensation == nullptr,
                "adam_step: a compensation buffer belongs to bf16 master weights (Bf16MasterWG, Bf16Full); layout "
                "Baseline keeps an fp32 master, pass compensation = null");
  NvtxRange range("adam_step");

  AdamConsts c{};
  c.lr = p.lr;
  c.beta1 = p.beta1;
  c.beta2 = p.beta2;
  c.one_minus_beta1 = 1.f - p.beta1;
  c.one_minus_beta2 = 1.f - p.beta2;
  c.inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(p.beta1), p.step)));
  c.inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(p.beta2), p.step)));
  c.eps = p.eps;
  c.wd = p.weight_decay;
  c.grad_scale = p.grad_scale;
  c.decoupled = p.decoupled;
  c.sr = p.stochastic_rounding;
  c.seed = p.seed;
  c.step = static_cast<std::uint64_t>(p.step);
  const AdamPtrs<P> a{params, grads, layout == OptimizerLayout::Baseline ? master : nullptr, m, v, n, device_scale, skip,
                   compensation};

  // 16-byte accesses need every buffer aligned; a misaligned view (rare) takes the scalar path.
  const bool vec = is_aligned16(params) && is_aligned16(grads) && is_aligned16(m) && is_aligned16(v) &&
                   (layout != OptimizerLayout::Baseline || is_aligned16(master)) &&
                   (compensation == nullptr || is_aligned16(compensation));
  if constexpr (kParamType != DType::BF16) {
    launch_grad_type<OptimizerLayout::Baseline, false>(s, grad_type, c, a, vec);  // the only layout (checked above)
  } else {
    switch (layout) {
      case OptimizerLayout::Baseline: launch_grad_type<OptimizerLayout::Baseline, false>(s, grad_type, c, a, vec); break;
      case OptimizerLayout::Bf16MasterWG: launch_bf16_master<OptimizerLayout::Bf16MasterWG>(s, grad_type, c, a, vec); break;
      case OptimizerLayout::Bf16Full: launch_bf16_master<OptimizerLayout::Bf16Full>(s, grad_type, c, a, vec); break;
    }
  }
}

template void adam_step<bf16>(cudaStream_t, OptimizerLayout, const AdamParams&, bf16*, const void*, DType, float*,
                              void*, void*, std::size_t, const float*, const int*, bf16*);
template void adam_step<f16>(cudaStream_t, OptimizerLayout, const AdamParams&, f16*, const void*, DType, float*, void*,
                             void*, std::size_t, const float*, const int*, f16*);

}  // namespace cutrain::kernels
