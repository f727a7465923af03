// @brief Global gradient norm in two deterministic passes: (1) a fixed grid (a function of n only, not
// of the device, so every run and every H100/H200 gives the same bits) where each thread sums
// squares in fp32 into 8 independent accumulators (one per vector lane: short sums, small
// rounding error even at 1.3e9 elements), then the block combines them in double in a fixed
// tree; (2) one block adds the block partials in a fixed order and derives the clip coefficient.
#include "kernels/reduce.cuh"

#include <algorithm>
#include <type_traits>

#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kMaxBlocks = 1024;  // pass 2 reduces these with one block of kMaxBlocks threads
constexpr int kW = 8;             // elements per thread per group (16 bytes of bf16)
constexpr int kUnroll = 4;        // groups loaded before any is summed

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block in a fixed order; the result is valid in thread 0.
__device__ __forceinline__ double block_sum_f64(double v) {
  __shared__ double warp_part[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum_f64(v);
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  double t = 0;
  if (warp == 0) {
    t = lane < static_cast<int>(blockDim.x / 32) ? warp_part[lane] : 0.0;
    t = warp_sum_f64(t);
  }
  return t;
}

// A group's raw bits: loaded first (kUnroll groups in flight), converted when summed.
template <typename G, int W>
struct Raw {
  uint4 u[W == 8 ? (sizeof(G) == 2 ? 1 : 2) : 1];
};
template <typename G, int W>
__device__ __forceinline__ Raw<G, W> load_raw(const G* p) {
  Raw<G, W> r;
  if constexpr (W == 8) {
    r.u[0] = load16<Load::Streaming>(p);
    if constexpr (sizeof(G) == 4) r.u[1] = load16<Load::Streaming>(p + 4);
  } else {
    if constexpr (std::is_same_v<G, __half>) r.u[0].x = __float_as_uint(__half2float(*p));
    else
      r.u[0].x = sizeof(G) == 2 ? static_cast<unsigned>(__bfloat16_as_ushort(*reinterpret_cast<const bf16*>(p))) << 16
                                : __float_as_uint(*reinterpret_cast<const float*>(p));
  }
  return r;
}
template <typename G, int W>
__device__ __forceinline__ void accumulate(const Raw<G, W>& r, float acc[W]) {
  if constexpr (W == 8 && std::is_same_v<G, __half>) {
    const __half2* h = reinterpret_cast<const __half2*>(&r.u[0]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      acc[2 * i] = fmaf(f.x, f.x, acc[2 * i]);
      acc[2 * i + 1] = fmaf(f.y, f.y, acc[2 * i + 1]);
    }
  } else if constexpr (W == 8 && sizeof(G) == 2) {
    const unsigned w[4] = {r.u[0].x, r.u[0].y, r.u[0].z, r.u[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float lo = __uint_as_float(w[i] << 16), hi = __uint_as_float(w[i] & 0xffff0000u);
      acc[2 * i] = fmaf(lo, lo, acc[2 * i]);
      acc[2 * i + 1] = fmaf(hi, hi, acc[2 * i + 1]);
    }
  } else if constexpr (W == 8) {
    const unsigned w[8] = {r.u[0].x, r.u[0].y, r.u[0].z, r.u[0].w, r.u[1].x, r.u[1].y, r.u[1].z, r.u[1].w};
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = fmaf(__uint_as_float(w[i]), __uint_as_float(w[i]), acc[i]);
  } else {
    const float f = __uint_as_float(r.u[0].x);  // bf16 / fp16 was widened to fp32 bits at load
    acc[0] = fmaf(f, f, acc[0]);
  }
}

template <typename G, int W>
__global__ void __launch_bounds__(kThreads) sumsq_partials_kernel(const G* __restrict__ g, std::size_t n,
                                                                 double* __restrict__ partials) {
  float acc[W];
#pragma unroll
  for (int i = 0; i < W; ++i) acc[i] = 0.f;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t groups = n / W;
  // kUnroll independent loads in flight per thread (a thread's share is fixed by n: deterministic).
  for (std::size_t g0 = tid; g0 < groups; g0 += kUnroll * stride) {
    Raw<G, W> r[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t gi = g0 + k * stride;
      if (gi < groups) r[k] = load_raw<G, W>(g + gi * W);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
      if (g0 + k * stride < groups) accumulate<G, W>(r[k], acc);
  }
  if constexpr (W > 1) {
    const std::size_t t = groups * W + tid;  // the n % W tail, one element per leading thread
    if (t < n) {
      const float f = to_f32(g[t]);
      acc[0] = fmaf(f, f, acc[0]);
    }
  }
  double s = 0;
#pragma unroll
  for (int i = 0; i < W; ++i) s += static_cast<double>(acc[i]);
  s = block_sum_f64(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// The norm and clip coefficient from the total sum of squares (one formula for both entry points,
// so the split sum-of-squares path gives the same bits as grad_norm_clip).
// With a loss scale S (fp16), the sum is of the scaled gradients: the norm is sqrt(total) / S and the
// clip coefficient also carries 1 / S (the one factor the optimizer applies to the stored gradients).
__device__ __forceinline__ void norm_from_total(double total, float max_norm, float* norm, float* clip_scale,
                                                int* nonfinite, const float* loss_scale) {
  const float r = loss_scale ? static_cast<float>(sqrt(total) / static_cast<double>(*loss_scale))
                             : static_cast<float>(sqrt(total));
  const bool bad = !isfinite(r);
  *norm = r;
  if (nonfinite) *nonfinite = bad ? 1 : 0;
  if (clip_scale) {
    const float c = (max_norm > 0.f && !bad) ? fminf(1.f, max_norm / (r + 1e-6f)) : 1.f;
    *clip_scale = loss_scale ? c / *loss_scale : c;
  }
}

__global__ void __launch_bounds__(kMaxBlocks) norm_finish_kernel(const double* __restrict__ partials, int nparts,
                                                                float max_norm, float* norm, float* clip_scale,
                                                                int* nonfinite, const float* loss_scale) {
  const double v = static_cast<int>(threadIdx.x) < nparts ? partials[threadIdx.x] : 0.0;
  const double total = block_sum_f64(v);
  if (threadIdx.x == 0) norm_from_total(total, max_norm, norm, clip_scale, nonfinite, loss_scale);
}

__global__ void __launch_bounds__(kMaxBlocks) sumsq_finish_kernel(const double* __restrict__ partials, int nparts,
                                                                 double* __restrict__ sumsq) {
  const double v = static_cast<int>(threadIdx.x) < nparts ? partials[threadIdx.x] : 0.0;
  const double total = block_sum_f64(v);
  if (threadIdx.x == 0) *sumsq = total;
}

__global__ void norm_from_sumsq_kernel(const double* __restrict__ sumsq, float max_norm, float* norm,
                                       float* clip_scale, int* nonfinite, const float* loss_scale) {
  norm_from_total(*sumsq, max_norm, norm, clip_scale, nonfinite, loss_scale);
}

template <typename G>
void launch_partials(cudaStream_t s, const G* g, std::size_t n, double* partials, int blocks, bool vec) {
  if (vec) {
    sumsq_partials_kernel<G, kW><<<blocks, kThreads, 0, s>>>(g, n, partials);
    CUTRAIN_LAUNCH_CHECK("sumsq_partials_kernel<vec8>");
  } else {
    sumsq_partials_kernel<G, 1><<<blocks, kThreads, 0, s>>>(g, n, partials);
    CUTRAIN_LAUNCH_CHECK("sumsq_partials_kernel<scalar>");
  }
}

}  // namespace

std::size_t grad_norm_scratch_bytes(std::size_t /*n*/) { return kMaxBlocks * sizeof(double); }

namespace {
// Pass 1 into `scratch`; returns the number of block partials written.
int enqueue_partials(const char* who, cudaStream_t s, const void* grads, DType grad_type, std::size_t n, void* scratch) {
  CUTRAIN_CHECK(grad_type == DType::BF16 || grad_type == DType::F16 || grad_type == DType::F32, who,
                ": grad_type must be bfloat16, float16 or float32, got ", dtype_name(grad_type));
  CUTRAIN_CHECK(scratch != nullptr, who, ": scratch of grad_norm_scratch_bytes(n) = ", grad_norm_scratch_bytes(n),
                " bytes must be non-null");
  CUTRAIN_CHECK(is_aligned16(scratch), who, ": scratch must be 16-byte aligned");
  CUTRAIN_CHECK(n == 0 || grads != nullptr, who, ": grads must be non-null for n = ", n);
  double* partials = static_cast<double*>(scratch);
  int blocks = 0;
  if (n > 0) {
    const bool vec = is_aligned16(grads);
    const std::size_t groups = vec ? n / kW : n;
    blocks = static_cast<int>(std::min<std::size_t>(kMaxBlocks, ceil_div<std::size_t>(groups > 0 ? groups : 1, kThreads)));
    if (grad_type == DType::BF16) launch_partials(s, static_cast<const bf16*>(grads), n, partials, blocks, vec);
    else if (grad_type == DType::F16) launch_partials(s, static_cast<const f16*>(grads), n, partials, blocks, vec);
    else launch_partials(s, static_cast<const float*>(grads), n, partials, blocks, vec);
  }
  return blocks;
}
}  // namespace

void grad_norm_clip(cudaStream_t s, const void* grads, DType grad_type, std::size_t n, float max_norm, float* norm,
                    float* clip_scale, int* nonfinite, void* scratch, const float* loss_scale) {
  CUTRAIN_CHECK(norm != nullptr, "grad_norm_clip: norm (device fp32 output) must be non-null");
  NvtxRange range("grad_norm_clip");
  const int blocks = enqueue_partials("grad_norm_clip", s, grads, grad_type, n, scratch);
  norm_finish_kernel<<<1, kMaxBlocks, 0, s>>>(static_cast<double*>(scratch), blocks, max_norm, norm, clip_scale,
                                              nonfinite, loss_scale);
  CUTRAIN_LAUNCH_CHECK("norm_finish_kernel");
}

void grad_sumsq(cudaStream_t s, const void* grads, DType grad_type, std::size_t n, double* sumsq, void* scratch) {
  CUTRAIN_CHECK(sumsq != nullptr, "grad_sumsq: sumsq (device fp64 output) must be non-null");
  NvtxRange range("grad_sumsq");
  const int blocks = enqueue_partials("grad_sumsq", s, grads, grad_type, n, scratch);
  sumsq_finish_kernel<<<1, kMaxBlocks, 0, s>>>(static_cast<double*>(scratch), blocks, sumsq);
  CUTRAIN_LAUNCH_CHECK("sumsq_finish_kernel");
}

void grad_norm_from_sumsq(cudaStream_t s, const double* sumsq, float max_norm, float* norm, float* clip_scale,
                          int* nonfinite, const float* loss_scale) {
  CUTRAIN_CHECK(sumsq != nullptr && norm != nullptr, "grad_norm_from_sumsq: sumsq and norm must be non-null");
  norm_from_sumsq_kernel<<<1, 1, 0, s>>>(sumsq, max_norm, norm, clip_scale, nonfinite, loss_scale);
  CUTRAIN_LAUNCH_CHECK("norm_from_sumsq_kernel");
}

}  // namespace cutrain::kernels
