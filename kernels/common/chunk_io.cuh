// @brief Loads and stores of C consecutive elements (C = 8, 4 or 1) as fp32 registers: bf16 or fp16
// as 16-byte (C = 8) or 8-byte (C = 4) accesses, fp32 as float4, one element for C = 1; bf16 stores
// round to nearest or stochastically with 16 random bits per element, fp16 stores to nearest. All streaming (evict-first):
// the optimizers read and write each element once. Pointers must be aligned to the access width.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/stochastic_round.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/dtype.h"

namespace cutrain::kernels {

template <int C, typename T, typename = std::enable_if_t<sizeof(T) == 2>>
__device__ __forceinline__ void load_c(const T* p, float f[C]) {
  if constexpr (C == 8) {
    load_x8<T, Load::Streaming>(p, f);
  } else if constexpr (C == 4) {
    const uint2 raw = __ldcs(reinterpret_cast<const uint2*>(p));
    const float2 a = to_f32x2(*reinterpret_cast<const pair16_t<T>*>(&raw.x));
    const float2 b = to_f32x2(*reinterpret_cast<const pair16_t<T>*>(&raw.y));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  } else {
    f[0] = to_f32(p[0]);
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
// 16-bit store of a chunk, nearest-even or (bf16 only) stochastic with the 16-bit draws r[i]; an fp16
// store always rounds to nearest (its copies of the fp32 master are not the master: nothing to keep).
template <int C, typename T, typename = std::enable_if_t<sizeof(T) == 2>>
__device__ __forceinline__ void store_c(T* p, const float f[C], bool sr, const std::uint32_t r[C]) {
  constexpr bool kSr = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (C >= 4) {
    std::uint32_t w[C / 2];
#pragma unroll
    for (int i = 0; i < C / 2; ++i) {
      pair16_t<T> h;
      if constexpr (kSr)
        h = sr ? bf16x2_round_stochastic(f[2 * i], f[2 * i + 1], r[2 * i], r[2 * i + 1])
               : __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
      else
        h = pack2_rn<T>(f[2 * i], f[2 * i + 1]);
      w[i] = *reinterpret_cast<const std::uint32_t*>(&h);
    }
    if constexpr (C == 8) store16<Store::Streaming>(p, make_uint4(w[0], w[1], w[2], w[3]));
    else __stcs(reinterpret_cast<uint2*>(p), make_uint2(w[0], w[1]));
  } else {
    if constexpr (kSr) p[0] = sr ? bf16_round_stochastic(f[0], r[0]) : __float2bfloat16_rn(f[0]);
    else p[0] = from_f32<T>(f[0]);
  }
}

}  // namespace cutrain::kernels
