// @brief Warp and block reductions (sum, max) in fp32 with a fixed combination order, so the
// same inputs give the same bits on every run (no atomics).
#pragma once

#include <cuda_runtime.h>

#include <cmath>  // INFINITY

namespace cutrain::kernels {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly reduction: every lane ends with the sum over all 32 lanes (same order, same bits
// in every lane).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over all threads of the block; every thread gets the result. `smem` holds at least
// blockDim.x / 32 floats; blockDim.x must be a multiple of 32. Contains __syncthreads, so every
// thread of the block must call it; it may be called repeatedly with the same `smem` (it
// synchronizes before returning so the buffer can be reused).
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int nwarps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? smem[lane] : 0.f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}
__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int nwarps = blockDim.x / kWarpSize;
  v = warp_max(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? smem[lane] : -INFINITY;
  t = warp_max(t);
  __syncthreads();
  return t;
}

}  // namespace cutrain::kernels

namespace cutrain::kernels {

// Two sums at once (one shared-memory round trip): block_sum of a.x and of a.y. `smem` holds at
// least 2 * blockDim.x / 32 floats. Same rules as block_sum.
__device__ __forceinline__ float2 block_sum2(float2 a, float* smem) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int nwarps = blockDim.x / kWarpSize;
  a.x = warp_sum(a.x);
  a.y = warp_sum(a.y);
  if (lane == 0) {
    smem[2 * warp] = a.x;
    smem[2 * warp + 1] = a.y;
  }
  __syncthreads();
  float2 t = lane < nwarps ? make_float2(smem[2 * lane], smem[2 * lane + 1]) : make_float2(0.f, 0.f);
  t.x = warp_sum(t.x);
  t.y = warp_sum(t.y);
  __syncthreads();
  return t;
}

}  // namespace cutrain::kernels
