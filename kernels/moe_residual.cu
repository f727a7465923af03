// @brief kernels/moe_residual.cuh: one block per token, 16-byte vectors of 8 bf16 when hidden % 8 == 0
// and the bases are 16-byte aligned (template flag kVec), single elements otherwise; the two dot
// products of the backward reduce over the block in a fixed order.
#include "kernels/moe_residual.cuh"

#include <cmath>
#include <initializer_list>

#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {
namespace {

constexpr int kThreads = 128;

template <int kVec>
__device__ __forceinline__ void load(const bf16* p, float f[kVec]) {
  if constexpr (kVec == 8) load_bf16x8(p, f);
  else f[0] = __bfloat162float(*p);
}
template <int kVec>
__device__ __forceinline__ void store(bf16* p, const float f[kVec]) {
  if constexpr (kVec == 8) store_bf16x8(p, f);
  else *p = __float2bfloat16_rn(f[0]);
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) mix_forward_kernel(const bf16* __restrict__ ym,
                                                                const bf16* __restrict__ yr,
                                                                const float* __restrict__ logits,
                                                                const bf16* __restrict__ bias, bf16* __restrict__ y,
                                                                float* __restrict__ coef, int H) {
  const int s = blockIdx.x;
  const float l0 = logits[2 * s] + __bfloat162float(bias[0]), l1 = logits[2 * s + 1] + __bfloat162float(bias[1]);
  const float m = fmaxf(l0, l1), e0 = expf(l0 - m), e1 = expf(l1 - m);
  const float c0 = e0 / (e0 + e1), c1 = e1 / (e0 + e1);
  if (threadIdx.x == 0) {
    coef[2 * s] = c0;
    coef[2 * s + 1] = c1;
  }
  const std::int64_t base = std::int64_t(s) * H;
  for (int c = threadIdx.x * kVec; c < H; c += kThreads * kVec) {
    float a[kVec], b[kVec], o[kVec];
    load<kVec>(ym + base + c, a);
    load<kVec>(yr + base + c, b);
    for (int j = 0; j < kVec; ++j) o[j] = c0 * a[j] + c1 * b[j];
    store<kVec>(y + base + c, o);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) mix_backward_kernel(const bf16* __restrict__ dy,
                                                                 const bf16* __restrict__ ym,
                                                                 const bf16* __restrict__ yr,
                                                                 const float* __restrict__ coef,
                                                                 bf16* __restrict__ dym, bf16* __restrict__ dyr,
                                                                 bf16* __restrict__ dlogits, int H) {
  __shared__ float red[32];
  const int s = blockIdx.x;
  const float c0 = coef[2 * s], c1 = coef[2 * s + 1];
  const std::int64_t base = std::int64_t(s) * H;
  float d0 = 0.f, d1 = 0.f;
  for (int c = threadIdx.x * kVec; c < H; c += kThreads * kVec) {
    float g[kVec], a[kVec], b[kVec], oa[kVec], ob[kVec];
    load<kVec>(dy + base + c, g);
    load<kVec>(ym + base + c, a);
    load<kVec>(yr + base + c, b);
    for (int j = 0; j < kVec; ++j) {
      d0 += g[j] * a[j];
      d1 += g[j] * b[j];
      oa[j] = c0 * g[j];
      ob[j] = c1 * g[j];
    }
    store<kVec>(dym + base + c, oa);
    store<kVec>(dyr + base + c, ob);
  }
  d0 = block_sum(d0, red);
  d1 = block_sum(d1, red);
  if (threadIdx.x == 0) {  // softmax of two: dl0 = c0·(d0 - (c0·d0 + c1·d1)) = c0·c1·(d0 - d1)
    const float t = c0 * c1 * (d0 - d1);
    dlogits[2 * s] = __float2bfloat16_rn(t);
    dlogits[2 * s + 1] = __float2bfloat16_rn(-t);
  }
}

bool vec_ok(int hidden, std::initializer_list<const void*> ptrs) {
  if (hidden % kBf16PerVec != 0) return false;
  for (const void* p : ptrs)
    if (!is_aligned16(p)) return false;
  return true;
}

void check(const char* fn, int tokens, int hidden, std::initializer_list<const void*> ptrs) {
  CUTRAIN_CHECK(tokens > 0 && hidden > 0, fn, ": tokens and hidden must be > 0, got tokens=", tokens, " hidden=",
                hidden);
  for (const void* p : ptrs) CUTRAIN_CHECK(p != nullptr, fn, ": every pointer must be non-null");
}

}  // namespace

void moe_residual_mix_forward(cudaStream_t s, const bf16* y_moe, const bf16* y_mlp, const float* logits,
                              const bf16* bias, bf16* y, float* coef, int tokens, int hidden) {
  check("moe_residual_mix_forward", tokens, hidden, {y_moe, y_mlp, logits, bias, y, coef});
  NvtxRange range("moe_residual_fwd");
  if (vec_ok(hidden, {y_moe, y_mlp, y}))
    mix_forward_kernel<8><<<tokens, kThreads, 0, s>>>(y_moe, y_mlp, logits, bias, y, coef, hidden);
  else mix_forward_kernel<1><<<tokens, kThreads, 0, s>>>(y_moe, y_mlp, logits, bias, y, coef, hidden);
  CUTRAIN_LAUNCH_CHECK("mix_forward_kernel");
}

void moe_residual_mix_backward(cudaStream_t s, const bf16* dy, const bf16* y_moe, const bf16* y_mlp,
                               const float* coef, bf16* dy_moe, bf16* dy_mlp, bf16* dlogits, int tokens, int hidden) {
  check("moe_residual_mix_backward", tokens, hidden, {dy, y_moe, y_mlp, coef, dy_moe, dy_mlp, dlogits});
  NvtxRange range("moe_residual_bwd");
  if (vec_ok(hidden, {dy, y_moe, y_mlp, dy_moe, dy_mlp}))
    mix_backward_kernel<8><<<tokens, kThreads, 0, s>>>(dy, y_moe, y_mlp, coef, dy_moe, dy_mlp, dlogits, hidden);
  else mix_backward_kernel<1><<<tokens, kThreads, 0, s>>>(dy, y_moe, y_mlp, coef, dy_moe, dy_mlp, dlogits, hidden);
  CUTRAIN_LAUNCH_CHECK("mix_backward_kernel");
}

}  // namespace cutrain::kernels
