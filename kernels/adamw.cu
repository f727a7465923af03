// Adam / AdamW in one grid-stride launch over the flat buffers, one template instance per
// (layout, gradient type, vector width). Memory-bound: each thread moves 8 elements per
// iteration with 16-byte accesses; the math is DeepSpeed's FusedAdam (apex multi_tensor_adam):
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
void launch_grad_type(cudaStream_t s, DType gt, const AdamConsts& c, const AdamPtrs& a, bool vec) {
  if (gt == DType::BF16) launch_layout<L, bf16>(s, c, a, vec);
  else launch_layout<L, float>(s, c, a, vec);
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
               const int* skip) {
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
    case OptimizerLayout::Baseline: launch_grad_type<OptimizerLayout::Baseline>(s, grad_type, c, a, vec); break;
    case OptimizerLayout::Bf16MasterWG: launch_grad_type<OptimizerLayout::Bf16MasterWG>(s, grad_type, c, a, vec); break;
    case OptimizerLayout::Bf16Full: launch_grad_type<OptimizerLayout::Bf16Full>(s, grad_type, c, a, vec); break;
  }
}

}  // namespace cutrain::kernels
