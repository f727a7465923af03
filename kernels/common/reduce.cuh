// @brief Warp and block reductions (sum, max) in fp32 with a fixed combination order, so the
// same inputs give the same bits on every run (no atomics).
#pragma once

#include <cuda_runtime.h>

#include <cmath>  // INFINITY

namespace cutrain::kernels {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// The combining operators: `Op{}(a, b)` and the identity `Op::identity()`.
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  __device__ __forceinline__ static float identity() { return 0.f; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ __forceinline__ static float identity() { return -INFINITY; }
};

// Butterfly reduction: every lane ends with Op over all 32 lanes (same order, same bits in every
// lane).
template <class Op>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op{}(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<SumOp>(v); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<MaxOp>(v); }

// Op over all threads of the block; every thread gets the result. `smem` holds at least
// blockDim.x / 32 floats; blockDim.x must be a multiple of 32. Contains __syncthreads, so every
// thread of the block must call it; it may be called repeatedly with the same `smem` (it
// synchronizes before returning so the buffer can be reused).
template <class Op>
__device__ __forceinline__ float block_reduce(float v, float* smem) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int nwarps = blockDim.x / kWarpSize;
  v = warp_reduce<Op>(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? smem[lane] : Op::identity();
  t = warp_reduce<Op>(t);
  __syncthreads();
  return t;
}
__device__ __forceinline__ float block_sum(float v, float* smem) { return block_reduce<SumOp>(v, smem); }
__device__ __forceinline__ float block_max(float v, float* smem) { return block_reduce<MaxOp>(v, smem); }

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
