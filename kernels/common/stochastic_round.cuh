// @brief Stochastic rounding fp32 -> bf16 from a counter-based hash of (seed, step, stream, index).
//
// Why counter-based: the random bits of element i at step s depend only on (seed, s, stream, i),
// never on thread order or on how many numbers were drawn before, so a resumed run (same seed, same
// step) rounds to the same bits, and the CPU reference (tests/reference/adamw_ref.cpp) can reproduce
// them exactly. Everything here is __host__ __device__ for that reason.
//
// Cost: one 64-bit mix per (stream, index >> 32) "key" (hoisted out of loops by callers) and
// 32-bit mixes per element; each mix yields 32 bits, i.e. two 16-bit roundings (the assignment of
// bits to outputs: sr_draws below).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cutrain::kernels {

// The xor-shift-multiply finalizer shape: x ^= x >> S1; x *= M1; x ^= x >> S2; x *= M2;
// x ^= x >> S3 (every step is a bijection for odd M, so the whole mix is one).
template <typename T, int S1, T M1, int S2, T M2, int S3>
__host__ __device__ __forceinline__ T sr_xsm_mix(T x) {
  x ^= x >> S1;
  x *= M1;
  x ^= x >> S2;
  x *= M2;
  x ^= x >> S3;
  return x;
}

// 32-bit finalizer with low bias (a bijection on uint32).
__host__ __device__ __forceinline__ std::uint32_t sr_mix32(std::uint32_t x) {
  return sr_xsm_mix<std::uint32_t, 16, 0x7feb352dU, 15, 0x846ca68bU, 16>(x);
}

// splitmix64 finalizer.
__host__ __device__ __forceinline__ std::uint64_t sr_mix64(std::uint64_t x) {
  return sr_xsm_mix<std::uint64_t, 30, 0xbf58476d1ce4e5b9ULL, 27, 0x94d049bb133111ebULL, 31>(x);
}

// The per-(seed, step, stream, high index bits) key. `stream` tells apart the several bf16
// outputs of one kernel (parameter, first moment, second moment) so they use independent bits.
__host__ __device__ __forceinline__ std::uint32_t sr_key(std::uint64_t seed, std::uint64_t step, std::uint32_t stream,
                                                         std::uint32_t index_hi) {
  std::uint64_t k = sr_mix64(seed ^ 0x243f6a8885a308d3ULL);
  k = sr_mix64(k ^ (step * 0x9e3779b97f4a7c15ULL));
  k = sr_mix64(k ^ ((static_cast<std::uint64_t>(stream) << 32) | index_hi));
  return static_cast<std::uint32_t>(k ^ (k >> 32));
}

// 32 random bits for element `index_lo` under `key`: one bijective mix of index ^ key (about 8
// integer instructions, so the optimizer stays memory-bound with three rounded outputs).
__host__ __device__ __forceinline__ std::uint32_t sr_bits(std::uint32_t key, std::uint32_t index_lo) {
  return sr_mix32(index_lo ^ key);
}

// One call for all of it: 32 random bits for element `index` of `stream` at `step`.
__host__ __device__ __forceinline__ std::uint32_t sr_random(std::uint64_t seed, std::uint64_t step, std::uint32_t stream,
                                                            std::uint64_t index) {
  return sr_bits(sr_key(seed, step, stream, static_cast<std::uint32_t>(index >> 32)),
                 static_cast<std::uint32_t>(index));
}

// ---- The optimizer's bit assignment: 1.5 mixes per element with three rounded outputs, 0.5 with
// one. The bits of element `index` depend only on (seed, step, index).
//   parameter: one mix per element PAIR of stream 0, sr_bits(key0, lo >> 1); the even element
//              takes the low 16 bits, the odd one the high 16 bits;
//   m, v (bf16 moments only): one mix per element of stream 1, sr_bits(key1, lo); m low, v high.
// Pairs never straddle a 2^32 window (lo >> 1 stays inside it), so the key hoisting still works.

// The parameter's 16 bits for element `index_lo` from its pair's hash `pair_hash`.
__host__ __device__ __forceinline__ std::uint32_t sr_pair_half(std::uint32_t pair_hash, std::uint32_t index_lo) {
  return (pair_hash >> ((index_lo & 1u) * 16u)) & 0xffffu;
}

// Host-side convenience (CPU reference, tests): the three 16-bit draws of element `index`.
struct SrDraws {
  std::uint32_t param, m, v;
};
__host__ __device__ __forceinline__ SrDraws sr_draws(std::uint64_t seed, std::uint64_t step, std::uint64_t index) {
  const std::uint32_t hi = static_cast<std::uint32_t>(index >> 32), lo = static_cast<std::uint32_t>(index);
  const std::uint32_t hp = sr_bits(sr_key(seed, step, 0, hi), lo >> 1);
  const std::uint32_t hmv = sr_bits(sr_key(seed, step, 1, hi), lo);
  return SrDraws{sr_pair_half(hp, lo), hmv & 0xffffu, hmv >> 16};
}

// Rounds the fp32 bit pattern `u` to bf16 bits: up (away from zero in magnitude) with probability
// equal to the dropped fraction of an ulp, using the 16 random bits `r`. NaN/Inf go through
// unchanged (NaN kept quiet); finite values near the top may round to Inf, as they should.
__host__ __device__ __forceinline__ std::uint16_t sr_round_bits(std::uint32_t u, std::uint32_t r16) {
  if ((u & 0x7f800000u) == 0x7f800000u) {
    return static_cast<std::uint16_t>((u >> 16) | ((u & 0x007fffffu) ? 0x40u : 0u));
  }
  return static_cast<std::uint16_t>((u + (r16 & 0xffffu)) >> 16);
}

#ifdef __CUDACC__
// Device convenience: fp32 -> bf16 with stochastic rounding from 16 random bits.
__device__ __forceinline__ __nv_bfloat16 bf16_round_stochastic(float f, std::uint32_t r16) {
  __nv_bfloat16_raw raw;
  raw.x = sr_round_bits(__float_as_uint(f), r16);
  return __nv_bfloat16(raw);
}
// Packs two roundings into one __nv_bfloat162 (lo -> .x).
__device__ __forceinline__ __nv_bfloat162 bf16x2_round_stochastic(float lo, float hi, std::uint32_t r_lo,
                                                                  std::uint32_t r_hi) {
  const std::uint32_t packed = static_cast<std::uint32_t>(sr_round_bits(__float_as_uint(lo), r_lo)) |
                               (static_cast<std::uint32_t>(sr_round_bits(__float_as_uint(hi), r_hi)) << 16);
  return *reinterpret_cast<const __nv_bfloat162*>(&packed);
}
#endif

}  // namespace cutrain::kernels
