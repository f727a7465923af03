// @brief GELU forward (optionally with the bias add) and backward, erf or tanh kind (see gelu.cuh).
//
// Templated on the storage type T (bf16 or fp16; the math is fp32 either way), one instance each.
// Elementwise and memory-bound: each thread moves 16-byte vectors of 8 16-bit values in a grid-stride
// loop, several vectors loaded before any is stored (GeluTile). The vector path needs 16-byte
// aligned pointers and, with a bias, cols % 8 == 0 (so a vector never straddles two rows); it
// uses the fast math below (the erf kind's fitted Φ, the tanh kind's __fdividef). Otherwise a
// scalar kernel computes the exact math (erff / IEEE division).
#include "kernels/gelu.cuh"

#include <algorithm>

#include "kernels/common/vec.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {
namespace {

// The tile of the vector kernels: threads per block and 16-byte vectors in flight per thread
// (forward: of `in`; backward: of each of dout and pre).
struct GeluTile {
  static constexpr int kThreads = 256, kFwdVecs = 4, kBwdVecs = 2;
};
constexpr int kThreads = GeluTile::kThreads;
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kTanhCoef = 0.044715f;

// Φ(x) = 0.5·(1 + erf(x/√2)), exact to fp32 rounding. 1 + erf cancels in the negative tail, so
// below x = -3 it is 0.5·erfc(-x/√2). Not erfc everywhere: erfcf costs about twice erff's
// instructions, enough to make GELU issue-bound. At x >= -3, Φ >= 1.3e-3 and erff's absolute
// error (~6e-8) is under 1e-4 of Φ, far below bf16's step. With random data the branch is
// warp-uniform almost always (0.13% of normal samples lie below -3).
__device__ __forceinline__ float phi_exact(float x) {
  return x >= -3.f ? 0.5f * (1.f + erff(x * kInvSqrt2)) : 0.5f * erfcf(-x * kInvSqrt2);
}

// a / b: IEEE (about ten instructions and a slow-path branch) or, with kFast (the vector path's
// tanh kind), __fdividef: rcp.approx and a multiply, 2 ulp. Where b > 2^126 (the tanh form's
// e^(-2u) there: x < -10.0) __fdividef returns 0, as the IEEE x / inf does a little further out;
// |gelu| there is < 1e-36.
template <bool kFast>
__device__ __forceinline__ float divide(float a, float b) {
  if constexpr (kFast) return __fdividef(a, b);
  else return a / b;
}

// The exact math (scalar path); the tanh kind also with the fast division (vector path). The erf
// kind's fast form is gelu_fast below.
template <GeluKind K, bool kFastDiv = false>
__device__ __forceinline__ float gelu(float x) {
  // The tanh form's 0.5·(1 + tanh(u)) is the logistic 1/(1 + e^(-2u)), which does not cancel.
  if constexpr (K == GeluKind::Erf) {
    return x * phi_exact(x);
  } else {
    const float u = kSqrt2OverPi * (x + kTanhCoef * x * x * x);
    return divide<kFastDiv>(x, 1.f + __expf(-2.f * u));
  }
}

// d gelu(x) / dx
template <GeluKind K, bool kFastDiv = false>
__device__ __forceinline__ float gelu_grad(float x) {
  if constexpr (K == GeluKind::Erf) {
    const float cdf = phi_exact(x);
    const float pdf = kInvSqrt2Pi * __expf(-0.5f * x * x);
    return cdf + x * pdf;
  } else {
    // With s = 0.5·(1 + tanh u) = 1/(1 + e^(-2u)): 0.5·(1 - tanh²u) = 2·s·(1 - s).
    const float u = kSqrt2OverPi * (x + kTanhCoef * x * x * x);
    const float sg = divide<kFastDiv>(1.f, 1.f + __expf(-2.f * u));
    const float du = kSqrt2OverPi * (1.f + 3.f * kTanhCoef * x * x);
    return sg + 2.f * x * sg * (1.f - sg) * du;
  }
}

// Fast Φ (the vector path's erf kind): Φ(t) = 2^S(t) for t <= 0, S the degree-8 Chebyshev interpolant of
// log2 Φ on [-10, 0] in u = t/5 + 1 (monomial coefficients below), and Φ(x) = 1 - Φ(-x) for x > 0.
// Relative error of Φ <= 3e-5 everywhere (checked in fp32 against erfc on 2e5 points), so also in
// the negative tail, where 0.5 (1 + erff) loses its relative precision; 12 instructions against
// erff's ~25, which matters because GELU at copy bandwidth is close to the SM's issue limit.
// Below t = -10 the clamp returns Φ(-10) = 7.6e-24 (gelu(x) there is < 1e-22 in magnitude).
__device__ __forceinline__ float ex2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
__device__ __forceinline__ float phi_fast(float x) {
  constexpr float kPhiC[9] = {-21.73419761657715f,  37.412445068359375f, -17.44406509399414f,
                              0.32911452651023865f, 0.1914231777191162f, 0.09919418394565582f,
                              0.06421393901109695f, 0.05749339610338211f, 0.024385787546634674f};
  const float u = fmaf(fmaxf(-fabsf(x), -10.f), 0.2f, 1.f);
  float sv = kPhiC[8];
#pragma unroll
  for (int k = 7; k >= 0; --k) sv = fmaf(sv, u, kPhiC[k]);
  const float p = ex2_approx(sv);  // Φ(-|x|)
  return x > 0.f ? 1.f - p : p;
}
__device__ __forceinline__ float gelu_fast(float x) { return x * phi_fast(x); }
// Φ(x) + x φ(x), φ(x) = 2^(-x² log2(e)/2 - log2(√(2π))).
__device__ __forceinline__ float gelu_grad_fast(float x) {
  const float pdf = ex2_approx(fmaf(x * x, -0.72134752044448170f, -1.3257480647361594f));
  return fmaf(x, pdf, phi_fast(x));
}

// The vector path's math: the erf fit above, the tanh kind with the fast division.
template <GeluKind K>
__device__ __forceinline__ float gelu_v(float x) {
  if constexpr (K == GeluKind::Erf) return gelu_fast(x);
  else return gelu<K, true>(x);
}
template <GeluKind K>
__device__ __forceinline__ float gelu_grad_v(float x) {
  if constexpr (K == GeluKind::Erf) return gelu_grad_fast(x);
  else return gelu_grad<K, true>(x);
}

int sm_count() {
  static const int sms = [] {
    int dev = 0, n = 0;
    CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
    CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

// Grid of a grid-stride kernel: exactly the blocks that fit on the device at once (a second,
// partial wave would leave SMs idle at the end), fewer when there is less work.
template <typename Kernel>
int grid_for(Kernel kernel, std::size_t work_items) {
  int per_sm = 0;
  CUTRAIN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  const std::size_t need = ceil_div<std::size_t>(work_items, kThreads);
  const std::size_t fit = static_cast<std::size_t>(sm_count()) * std::max(per_sm, 1);
  return static_cast<int>(std::max<std::size_t>(1, std::min(need, fit)));
}

// Vector path: n elements, nvec = n / 8 full vectors, the last n % 8 done by thread 0 of block 0.
// One element of the forward: the bias added and rounded to T (backward differentiates at the
// stored pre-activation), written to pre_out if asked, then f of it. The vector path's tail and the
// scalar path both go through it.
template <typename T, class F>
__device__ __forceinline__ void fwd_element(const T* in, const T* __restrict__ bias, T* pre_out, T* out,
                                            std::size_t i, int cols, F f) {
  float x = to_f32(in[i]);
  if (bias) {
    x = to_f32(from_f32<T>(x + to_f32(bias[i % cols])));
    if (pre_out) pre_out[i] = from_f32<T>(x);
  }
  out[i] = from_f32<T>(f(x));
}

// `in` and `out` may alias (no __restrict__); bias has cols % 8 == 0 here.
// kU vectors per iteration, all loaded before any is stored: kU times the bytes in flight (in/out
// may alias, so the compiler would not hoist a load over an earlier store).
template <typename T, GeluKind K, class Tile>
__global__ void __launch_bounds__(Tile::kThreads)
    gelu_fwd_vec(const T* in, const T* __restrict__ bias, T* pre_out, T* out, std::size_t n, int cols) {
  constexpr int kU = Tile::kFwdVecs;
  const std::size_t nvec = n / kBf16PerVec;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t v0 = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; v0 < nvec;
       v0 += kU * stride) {
    float x[kU][8];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::size_t v = v0 + u * stride;
      if (v < nvec) load_x8<T, Load::Streaming>(in + v * kBf16PerVec, x[u]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::size_t v = v0 + u * stride;
      if (v >= nvec) break;
      const std::size_t off = v * kBf16PerVec;
      if (bias) {
        float b[8];
        load_x8<T, Load::ReadOnly>(bias + off % cols, b);
        // Backward differentiates at the stored (16-bit) pre-activation, so use exactly that here.
#pragma unroll
        for (int k = 0; k < 8; ++k) x[u][k] = to_f32(from_f32<T>(x[u][k] + b[k]));
        if (pre_out) store_x8(pre_out + off, x[u]);
      }
      float y[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) y[k] = gelu_v<K>(x[u][k]);
      store_x8(out + off, y);  // default policy: the next GEMM reads it soon
    }
  }
  if (blockIdx.x == 0 && threadIdx.x < n % kBf16PerVec)
    fwd_element(in, bias, pre_out, out, nvec * kBf16PerVec + threadIdx.x, cols, gelu_v<K>);
}

template <typename T, GeluKind K>
__global__ void __launch_bounds__(kThreads)
    gelu_fwd_scalar(const T* in, const T* __restrict__ bias, T* pre_out, T* out, std::size_t n, int cols) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    fwd_element(in, bias, pre_out, out, i, cols, gelu<K>);
}

// Backward, scalar path. `dout` and `din` may alias.
template <typename T, GeluKind K>
__global__ void __launch_bounds__(kThreads)
    gelu_bwd_scalar(const T* dout, const T* __restrict__ pre, T* din, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::size_t i = tid; i < n; i += stride)
    din[i] = from_f32<T>(to_f32(dout[i]) * gelu_grad<K>(to_f32(pre[i])));
}

// Backward, vector path: kU vectors of each of dout and pre loaded per iteration before any
// store, the n % 8 tail by the first threads of block 0. `dout` and `din` may alias.
template <typename T, GeluKind K, class Tile>
__global__ void __launch_bounds__(Tile::kThreads)
    gelu_bwd_vec(const T* dout, const T* __restrict__ pre, T* din, std::size_t n) {
  constexpr int kU = Tile::kBwdVecs;
  const std::size_t nvec = n / kBf16PerVec;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t v0 = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; v0 < nvec;
       v0 += kU * stride) {
    uint4 d[kU], x[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::size_t v = v0 + u * stride;
      if (v < nvec) {
        d[u] = load16<Load::Streaming>(dout + v * kBf16PerVec);
        x[u] = load16<Load::Streaming>(pre + v * kBf16PerVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::size_t v = v0 + u * stride;
      if (v >= nvec) break;
      float df[8], xf[8], o[8];
      load_x8(reinterpret_cast<const T*>(&d[u]), df);  // register unpack
      load_x8(reinterpret_cast<const T*>(&x[u]), xf);
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = df[k] * gelu_grad_v<K>(xf[k]);
      store_x8<T, Store::Streaming>(din + v * kBf16PerVec, o);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x < n % kBf16PerVec) {
    const std::size_t i = nvec * kBf16PerVec + threadIdx.x;
    din[i] = from_f32<T>(to_f32(dout[i]) * gelu_grad_v<K>(to_f32(pre[i])));
  }
}

template <typename T, GeluKind K>
void launch_forward(cudaStream_t s, const T* in, const T* bias, T* pre_out, T* out, std::size_t n,
                    int cols) {
  const bool vec = is_aligned16(in) && is_aligned16(out) && (!pre_out || is_aligned16(pre_out)) &&
                   (!bias || (is_aligned16(bias) && cols % kBf16PerVec == 0));
  if (vec) {
    gelu_fwd_vec<T, K, GeluTile><<<grid_for(gelu_fwd_vec<T, K, GeluTile>, n / kBf16PerVec), kThreads, 0, s>>>(
        in, bias, pre_out, out, n, cols);
    CUTRAIN_LAUNCH_CHECK("gelu_fwd_vec");
  } else {
    gelu_fwd_scalar<T, K><<<grid_for(gelu_fwd_scalar<T, K>, n), kThreads, 0, s>>>(in, bias, pre_out, out, n, cols);
    CUTRAIN_LAUNCH_CHECK("gelu_fwd_scalar");
  }
}

template <typename T, GeluKind K>
void launch_backward(cudaStream_t s, const T* dout, const T* pre, T* din, std::size_t n) {
  const bool vec = is_aligned16(dout) && is_aligned16(pre) && is_aligned16(din);
  if (vec) {
    gelu_bwd_vec<T, K, GeluTile><<<grid_for(gelu_bwd_vec<T, K, GeluTile>, n / kBf16PerVec), kThreads, 0, s>>>(dout, pre,
                                                                                                      din, n);
    CUTRAIN_LAUNCH_CHECK("gelu_bwd_vec");
  } else {
    gelu_bwd_scalar<T, K><<<grid_for(gelu_bwd_scalar<T, K>, n), kThreads, 0, s>>>(dout, pre, din, n);
    CUTRAIN_LAUNCH_CHECK("gelu_bwd_scalar");
  }
}

}  // namespace

template <typename T>
void gelu_forward(cudaStream_t s, const T* in, const nondeduced_t<T>* bias, nondeduced_t<T>* pre_out, T* out, std::size_t rows,
                  int cols, GeluKind kind) {
  CUTRAIN_CHECK(rows > 0 && cols > 0, "gelu_forward: rows and cols must be positive, got ", rows, "x", cols);
  CUTRAIN_CHECK(in && out, "gelu_forward: in and out must be non-null");
  CUTRAIN_CHECK(!pre_out || (pre_out != in && pre_out != out),
                "gelu_forward: pre_out must not alias in or out");
  const std::size_t n = rows * static_cast<std::size_t>(cols);
  if (kind == GeluKind::Erf) launch_forward<T, GeluKind::Erf>(s, in, bias, pre_out, out, n, cols);
  else launch_forward<T, GeluKind::Tanh>(s, in, bias, pre_out, out, n, cols);
}

template <typename T>
void gelu_backward(cudaStream_t s, const T* dout, const nondeduced_t<T>* pre, T* din, std::size_t n, GeluKind kind) {
  CUTRAIN_CHECK(n > 0, "gelu_backward: n must be positive, got ", n);
  CUTRAIN_CHECK(dout && pre && din, "gelu_backward: dout, pre and din must be non-null");
  CUTRAIN_CHECK(din != pre, "gelu_backward: din must not alias pre");
  if (kind == GeluKind::Erf) launch_backward<T, GeluKind::Erf>(s, dout, pre, din, n);
  else launch_backward<T, GeluKind::Tanh>(s, dout, pre, din, n);
}

template void gelu_forward<bf16>(cudaStream_t, const bf16*, const bf16*, bf16*, bf16*, std::size_t, int, GeluKind);
template void gelu_forward<f16>(cudaStream_t, const f16*, const f16*, f16*, f16*, std::size_t, int, GeluKind);
template void gelu_backward<bf16>(cudaStream_t, const bf16*, const bf16*, bf16*, std::size_t, GeluKind);
template void gelu_backward<f16>(cudaStream_t, const f16*, const f16*, f16*, std::size_t, GeluKind);

}  // namespace cutrain::kernels
