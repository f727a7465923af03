// Adam / AdamW in one grid-stride launch over the flat buffers, one template instance per
// (layout, gradient type, vector width), in two variants (adamw.cuh: AdamVariant): v1 (each
// thread 8 consecutive elements) and v2 (warp-coalesced chunks, cheaper SR bits, the default).
// Memory-bound: each thread moves 8 elements per iteration; the math is DeepSpeed's FusedAdam (apex multi_tensor_adam):
//   Adam  (L2):      g += wd * p;  m, v updated;  p -= lr * m_hat / (sqrt(v_hat) + eps)
//   AdamW (decoupled):              m, v updated;  p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)
#include "kernels/adamw.cuh"

#include <algorithm>
#include <cmath>
#include <type_traits>

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

struct AdamPtrs {
  bf16* params;
  const void* grads;
  float* master;
  void* m;
  void* v;
  std::size_t n;
  const float* device_scale;
  const int* skip;
};

// ---- width-generic loads/stores (W = 8: 16-byte vectors; W = 1: scalars) ----

template <int W>
__device__ __forceinline__ void load_w(const bf16* p, float f[W]) {
  if constexpr (W == 8) {
    load_bf16x8<Load::Streaming>(p, f);
  } else {
    f[0] = __bfloat162float(p[0]);
  }
}
template <int W>
__device__ __forceinline__ void load_w(const float* p, float f[W]) {
  if constexpr (W == 8) {
    load_f32x4<Load::Streaming>(p, f);
    load_f32x4<Load::Streaming>(p + 4, f + 4);
  } else {
    f[0] = p[0];
  }
}
template <int W>
__device__ __forceinline__ void store_w(float* p, const float f[W]) {
  if constexpr (W == 8) {
    store_f32x4<Store::Streaming>(p, f);
    store_f32x4<Store::Streaming>(p + 4, f + 4);
  } else {
    p[0] = f[0];
  }
}

// bf16 store, round-to-nearest-even or stochastic. `bits[i]` holds 32 random bits for element i;
// `half` picks which 16 of them this output uses (so two outputs can share one hash).
template <int W>
__device__ __forceinline__ void store_w(bf16* p, const float f[W], bool sr, const std::uint32_t bits[W], int half) {
  if constexpr (W == 8) {
    if (sr) {
      uint4 raw;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        h[i] = bf16x2_round_stochastic(f[2 * i], f[2 * i + 1], bits[2 * i] >> (16 * half), bits[2 * i + 1] >> (16 * half));
      store16<Store::Streaming>(p, raw);
    } else {
      store_bf16x8<Store::Streaming>(p, f);
    }
  } else {
    p[0] = sr ? bf16_round_stochastic(f[0], bits[0] >> (16 * half)) : __float2bfloat16_rn(f[0]);
  }
}

// Random bits for the W elements starting at `base` in SR stream `stream`; `key_hi`/`key` cache
// the key of the current 2^32-element window (recomputed only when it changes).
template <int W>
__device__ __forceinline__ void sr_fill(const AdamConsts& c, std::uint32_t stream, std::size_t base, std::uint32_t& key_hi,
                                        std::uint32_t& key, std::uint32_t bits[W]) {
  const std::uint32_t hi = static_cast<std::uint32_t>(base >> 32);
  if (hi != key_hi) {
    key = sr_key(c.seed, c.step, stream, hi);
    key_hi = hi;
  }
  // W elements from an aligned multiple of W never straddle a 2^32 boundary (W divides 2^32).
#pragma unroll
  for (int i = 0; i < W; ++i) bits[i] = sr_bits(key, static_cast<std::uint32_t>(base) + i);
}

__device__ __forceinline__ void adam_math(const AdamConsts& c, float g, float& p, float& m, float& v) {
  if (!c.decoupled) g = fmaf(c.wd, p, g);
  m = fmaf(c.beta1, m, c.one_minus_beta1 * g);
  v = fmaf(c.beta2, v, c.one_minus_beta2 * g * g);
  const float denom = sqrtf(v * c.inv_bc2) + c.eps;
  float update = __fdividef(m * c.inv_bc1, denom);
  if (c.decoupled) update = fmaf(c.wd, p, update);
  p = fmaf(-c.lr, update, p);
}

struct SrState {
  std::uint32_t hi0 = 0xffffffffu, key0 = 0, hi1 = 0xffffffffu, key1 = 0;
};

// One group of W consecutive elements starting at `base`.
template <OptimizerLayout L, typename G, int W>
__device__ __forceinline__ void adam_group(const AdamConsts& c, const AdamPtrs& a, float scale, std::size_t base,
                                           SrState& st) {
  using Moment = std::conditional_t<L == OptimizerLayout::Bf16Full, bf16, float>;
  float g[W], p[W], m[W], v[W];
  load_w<W>(static_cast<const G*>(a.grads) + base, g);
  if constexpr (L == OptimizerLayout::Baseline) load_w<W>(a.master + base, p);
  else load_w<W>(a.params + base, p);
  load_w<W>(static_cast<const Moment*>(a.m) + base, m);
  load_w<W>(static_cast<const Moment*>(a.v) + base, v);
#pragma unroll
  for (int i = 0; i < W; ++i) adam_math(c, g[i] * scale, p[i], m[i], v[i]);

  std::uint32_t bits0[W], bits1[W];
  if (c.sr) {
    sr_fill<W>(c, 0, base, st.hi0, st.key0, bits0);
    if constexpr (L == OptimizerLayout::Bf16Full) sr_fill<W>(c, 1, base, st.hi1, st.key1, bits1);
  }
  if constexpr (L == OptimizerLayout::Baseline) store_w<W>(a.master + base, p);
  store_w<W>(a.params + base, p, c.sr, bits0, 0);
  if constexpr (L == OptimizerLayout::Bf16Full) {
    store_w<W>(static_cast<bf16*>(a.m) + base, m, c.sr, bits0, 1);
    store_w<W>(static_cast<bf16*>(a.v) + base, v, c.sr, bits1, 0);
  } else {
    store_w<W>(static_cast<float*>(a.m) + base, m);
    store_w<W>(static_cast<float*>(a.v) + base, v);
  }
}

template <OptimizerLayout L, typename G, int W>
__global__ void __launch_bounds__(kThreads) adam_kernel(AdamConsts c, AdamPtrs a) {
  if (a.skip != nullptr && *a.skip != 0) return;
  const float scale = c.grad_scale * (a.device_scale != nullptr ? *a.device_scale : 1.f);
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t groups = a.n / W;
  SrState st;
  for (std::size_t gi = tid; gi < groups; gi += stride) adam_group<L, G, W>(c, a, scale, gi * W, st);
  if constexpr (W > 1) {
    const std::size_t t = groups * W + tid;  // the n % W tail: one element per leading thread
    if (t < a.n) adam_group<L, G, 1>(c, a, scale, t, st);
  }
}

// ---- v2: warp-coalesced chunks ----
// A warp handles a tile of 32 * C * U consecutive elements: lane l's chunk u is the C elements at
// tile + u * 32 * C + l * C, so every warp-wide access of every array is one contiguous run
// (v1's fp32 arrays were read as two half-used 1 KB spans per instruction). C = 4 when any array
// is fp32 (float4 per lane, bf16 as 8 bytes), else C = 8 (16-byte bf16); U = 8 / C chunks in
// flight per thread, so each thread still moves 8 elements per iteration (v1's register budget).

template <int C>
__device__ __forceinline__ void load_c(const bf16* p, float f[C]) {
  if constexpr (C == 8) {
    load_bf16x8<Load::Streaming>(p, f);
  } else if constexpr (C == 4) {
    const uint2 raw = __ldcs(reinterpret_cast<const uint2*>(p));
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  } else {
    f[0] = __bfloat162float(p[0]);
  }
}
template <int C>
__device__ __forceinline__ void load_c(const float* p, float f[C]) {
  if constexpr (C >= 4) {
#pragma unroll
    for (int i = 0; i < C; i += 4) load_f32x4<Load::Streaming>(p + i, f + i);
  } else {
    f[0] = p[0];
  }
}
template <int C>
__device__ __forceinline__ void store_c(float* p, const float f[C]) {
  if constexpr (C >= 4) {
#pragma unroll
    for (int i = 0; i < C; i += 4) store_f32x4<Store::Streaming>(p + i, f + i);
  } else {
    p[0] = f[0];
  }
}
// bf16 store of a chunk, nearest-even or stochastic with the 16-bit draws r[i].
template <int C>
__device__ __forceinline__ void store_c(bf16* p, const float f[C], bool sr, const std::uint32_t r[C]) {
  if constexpr (C >= 4) {
    std::uint32_t w[C / 2];
#pragma unroll
    for (int i = 0; i < C / 2; ++i) {
      const __nv_bfloat162 h = sr ? bf16x2_round_stochastic(f[2 * i], f[2 * i + 1], r[2 * i], r[2 * i + 1])
                                  : __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
      w[i] = *reinterpret_cast<const std::uint32_t*>(&h);
    }
    if constexpr (C == 8) store16<Store::Streaming>(p, make_uint4(w[0], w[1], w[2], w[3]));
    else __stcs(reinterpret_cast<uint2*>(p), make_uint2(w[0], w[1]));
  } else {
    p[0] = sr ? bf16_round_stochastic(f[0], r[0]) : __float2bfloat16_rn(f[0]);
  }
}

// The v2 draws (stochastic_round.cuh) for the C elements at `base` (C even and base a multiple
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
template <OptimizerLayout L, typename G, int C, int U>
__device__ __forceinline__ void adam_chunks(const AdamConsts& c, const AdamPtrs& a, float scale, std::size_t base,
                                            SrState& st) {
  constexpr bool kFull = L == OptimizerLayout::Bf16Full;
  using Moment = std::conditional_t<kFull, bf16, float>;
  constexpr std::size_t kStep = 32 * C;
  float g[U][C], p[U][C], m[U][C], v[U][C];
#pragma unroll
  for (int u = 0; u < U; ++u) {  // every load of every chunk issued before any math
    const std::size_t i = base + u * kStep;
    load_c<C>(static_cast<const G*>(a.grads) + i, g[u]);
    if constexpr (L == OptimizerLayout::Baseline) load_c<C>(a.master + i, p[u]);
    else load_c<C>(a.params + i, p[u]);
    load_c<C>(static_cast<const Moment*>(a.m) + i, m[u]);
    load_c<C>(static_cast<const Moment*>(a.v) + i, v[u]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int k = 0; k < C; ++k) adam_math(c, g[u][k] * scale, p[u][k], m[u][k], v[u][k]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::size_t i = base + u * kStep;
    std::uint32_t rp[C], rm[C], rv[C];
    if (c.sr) sr_chunk<C, kFull>(c, i, st, rp, rm, rv);
    if constexpr (L == OptimizerLayout::Baseline) store_c<C>(a.master + i, p[u]);
    store_c<C>(a.params + i, p[u], c.sr, rp);
    if constexpr (kFull) {
      store_c<C>(static_cast<bf16*>(a.m) + i, m[u], c.sr, rm);
      store_c<C>(static_cast<bf16*>(a.v) + i, v[u], c.sr, rv);
    } else {
      store_c<C>(static_cast<float*>(a.m) + i, m[u]);
      store_c<C>(static_cast<float*>(a.v) + i, v[u]);
    }
  }
}

template <OptimizerLayout L, typename G, int C, int U>
__global__ void __launch_bounds__(kThreads) adam_kernel_v2(AdamConsts c, AdamPtrs a) {
  if (a.skip != nullptr && *a.skip != 0) return;
  const float scale = c.grad_scale * (a.device_scale != nullptr ? *a.device_scale : 1.f);
  constexpr std::size_t kTile = 32 * C * U;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t warp = tid / 32, lane = tid % 32;
  const std::size_t nwarps = static_cast<std::size_t>(gridDim.x) * blockDim.x / 32;
  const std::size_t tiles = a.n / kTile;
  SrState st;
  for (std::size_t t = warp; t < tiles; t += nwarps) adam_chunks<L, G, C, U>(c, a, scale, t * kTile + lane * C, st);
  if constexpr (kTile > 1) {
    // The n % kTile tail (< 256 elements), one element per leading thread (the grid has >= 256).
    const std::size_t i = tiles * kTile + tid;
    if (i < a.n) adam_chunks<L, G, 1, 1>(c, a, scale, i, st);
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

template <OptimizerLayout L, typename G, int C, int U>
void launch_v2(cudaStream_t s, const AdamConsts& c, const AdamPtrs& a, const char* what) {
  auto kernel = adam_kernel_v2<L, G, C, U>;
  const unsigned blocks = resident_blocks(kernel, ceil_div<std::size_t>(a.n, C * U));
  kernel<<<blocks, kThreads, 0, s>>>(c, a);
  CUTRAIN_LAUNCH_CHECK(what);
}

template <OptimizerLayout L, typename G>
void launch_layout_v2(cudaStream_t s, const AdamConsts& c, const AdamPtrs& a, bool vec) {
  constexpr bool kAnyF32 = L != OptimizerLayout::Bf16Full || std::is_same_v<G, float>;
  if (!vec) launch_v2<L, G, 1, 1>(s, c, a, "adam_kernel_v2<scalar>");
  else if constexpr (kAnyF32) launch_v2<L, G, 4, 2>(s, c, a, "adam_kernel_v2<4x2>");
  else launch_v2<L, G, 8, 1>(s, c, a, "adam_kernel_v2<8x1>");
}

template <OptimizerLayout L, typename G>
void launch_layout(cudaStream_t s, const AdamConsts& c, const AdamPtrs& a, bool vec) {
  int dev = 0, sms = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // One wave of resident blocks (grid-stride): no second partial wave, no idle tail.
  auto kernel = vec ? adam_kernel<L, G, 8> : adam_kernel<L, G, 1>;
  int per_sm = 0;
  CUTRAIN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  per_sm = std::max(1, std::min(per_sm, kMaxBlocksPerSm));
  const std::size_t groups = vec ? a.n / 8 : a.n;
  const std::size_t want = ceil_div<std::size_t>(groups > 0 ? groups : 1, kThreads);
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(want, static_cast<std::size_t>(sms) * per_sm));
  kernel<<<blocks, kThreads, 0, s>>>(c, a);
  CUTRAIN_LAUNCH_CHECK(vec ? "adam_kernel<vec8>" : "adam_kernel<scalar>");
}

template <OptimizerLayout L>
void launch_grad_type(cudaStream_t s, DType gt, const AdamConsts& c, const AdamPtrs& a, bool vec, AdamVariant var) {
  if (var == AdamVariant::V1) {
    if (gt == DType::BF16) launch_layout<L, bf16>(s, c, a, vec);
    else launch_layout<L, float>(s, c, a, vec);
  } else {
    if (gt == DType::BF16) launch_layout_v2<L, bf16>(s, c, a, vec);
    else launch_layout_v2<L, float>(s, c, a, vec);
  }
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

double adam_bytes_per_param(OptimizerLayout layout, DType grad_type) {
  const double g = static_cast<double>(dtype_size(grad_type));
  switch (layout) {
    case OptimizerLayout::Baseline: return 2 + g + 8 + 8 + 8;  // write param; read grad; r/w master, m, v (fp32)
    case OptimizerLayout::Bf16MasterWG: return 4 + g + 8 + 8;  // r/w param; read grad; r/w m, v (fp32)
    case OptimizerLayout::Bf16Full: return 4 + g + 4 + 4;      // r/w param; read grad; r/w m, v (bf16)
  }
  return 0;
}

void adam_step(cudaStream_t s, OptimizerLayout layout, const AdamParams& p, bf16* params, const void* grads,
               DType grad_type, float* master, void* m, void* v, std::size_t n, const float* device_scale,
               const int* skip, AdamVariant variant) {
  CUTRAIN_CHECK(variant == AdamVariant::Default || variant == AdamVariant::V1, "adam_step: unknown variant ",
                static_cast<int>(variant));
  CUTRAIN_CHECK(grad_type == DType::BF16 || grad_type == DType::F32,
                "adam_step: grad_type must be bfloat16 or float32, got ", dtype_name(grad_type));
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
  const AdamPtrs a{params, grads, layout == OptimizerLayout::Baseline ? master : nullptr, m, v, n, device_scale, skip};

  // 16-byte accesses need every buffer aligned; a misaligned view (rare) takes the scalar path.
  const bool vec = is_aligned16(params) && is_aligned16(grads) && is_aligned16(m) && is_aligned16(v) &&
                   (layout != OptimizerLayout::Baseline || is_aligned16(master));
  switch (layout) {
    case OptimizerLayout::Baseline: launch_grad_type<OptimizerLayout::Baseline>(s, grad_type, c, a, vec, variant); break;
    case OptimizerLayout::Bf16MasterWG: launch_grad_type<OptimizerLayout::Bf16MasterWG>(s, grad_type, c, a, vec, variant); break;
    case OptimizerLayout::Bf16Full: launch_grad_type<OptimizerLayout::Bf16Full>(s, grad_type, c, a, vec, variant); break;
  }
}

}  // namespace cutrain::kernels
