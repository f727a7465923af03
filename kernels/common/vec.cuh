// @brief Device helpers shared by kernel families: ceil_div, 16-byte vector loads/stores of
// 8 16-bit values (bf16 or fp16) or 4 fp32 with conversion to and from fp32, and alignment tests.
//
// A 16-byte access is the widest a thread can issue to global memory; memory-bound kernels use
// these so each warp moves 512 contiguous bytes per instruction. The pointer passed to any
// *_vec function must be 16-byte aligned (see is_aligned16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace cutrain::kernels {

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// True when `p` may be used with the 16-byte vector accessors below.
__host__ __device__ inline bool is_aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

constexpr int kBf16PerVec = 8;  // bf16 elements in one 16-byte access
constexpr int kF32PerVec = 4;   // fp32 elements in one 16-byte access

// Eight bf16 values in one 16-byte register bundle.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

// Cache policy of a vector load: Default (L1/L2 cached), ReadOnly (__ldg: non-coherent read-only
// path, for data the kernel never writes), Streaming (__ldcs: evict-first, for data read once).
enum class Load { Default, ReadOnly, Streaming };
// Store policy: Default, or Streaming (__stcs: evict-first, for outputs not re-read soon).
enum class Store { Default, Streaming };

template <Load L = Load::Default>
__device__ __forceinline__ uint4 load16(const void* p) {
  const uint4* q = static_cast<const uint4*>(p);
  if constexpr (L == Load::ReadOnly) return __ldg(q);
  else if constexpr (L == Load::Streaming) return __ldcs(q);
  else return *q;
}

template <Store S = Store::Default>
__device__ __forceinline__ void store16(void* p, uint4 v) {
  uint4* q = static_cast<uint4*>(p);
  if constexpr (S == Store::Streaming) __stcs(q, v);
  else *q = v;
}

// One 16-byte store to global memory by PTX st.global.v4: where the compiler cannot follow the
// address (an index through divisions, a shared-memory source), a plain uint4 store through an
// element pointer may be split into four 4-byte stores. p: 16-byte aligned, global.
__device__ __forceinline__ void st_global_v4(void* p, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// 8 bf16 at p (16-byte aligned) -> f[0..7] as fp32.
template <Load L = Load::Default>
__device__ __forceinline__ void load_bf16x8(const __nv_bfloat16* p, float f[8]) {
  uint4 raw = load16<L>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

// f[0..7] rounded to nearest-even bf16 -> 8 bf16 at p (16-byte aligned).
template <Store S = Store::Default>
__device__ __forceinline__ void store_bf16x8(__nv_bfloat16* p, const float f[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  store16<S>(p, raw);
}

// 4 fp32 at p (16-byte aligned) -> f[0..3], and back.
template <Load L = Load::Default>
__device__ __forceinline__ void load_f32x4(const float* p, float f[4]) {
  uint4 raw = load16<L>(p);
  f[0] = __uint_as_float(raw.x);
  f[1] = __uint_as_float(raw.y);
  f[2] = __uint_as_float(raw.z);
  f[3] = __uint_as_float(raw.w);
}
template <Store S = Store::Default>
__device__ __forceinline__ void store_f32x4(float* p, const float f[4]) {
  uint4 raw = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  store16<S>(p, raw);
}

// Scalar conversions by element type, so a kernel templated on its storage type (bf16 or fp16
// activations, bf16 / fp16 / fp32 gradients) can read and write any of them.
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// The two-element register type of a 16-bit storage type and its conversions.
template <typename T>
struct Pair16;
template <>
struct Pair16<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
template <>
struct Pair16<__half> {
  using type = __half2;
};
template <typename T>
using pair16_t = typename Pair16<T>::type;
__device__ __forceinline__ float2 to_f32x2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 to_f32x2(__half2 v) { return __half22float2(v); }
// (lo, hi) rounded to nearest-even into one pair, lo in the low half.
template <typename T>
__device__ __forceinline__ pair16_t<T> pack2_rn(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) return __floats2half2_rn(lo, hi);
  else return __floats2bfloat162_rn(lo, hi);
}

// 8 values of a 16-bit type T (bf16 or fp16) at p (16-byte aligned) -> f[0..7] as fp32, and back
// (nearest-even). For T = bf16 these are load_bf16x8 / store_bf16x8.
template <typename T, Load L = Load::Default>
__device__ __forceinline__ void load_x8(const T* p, float f[8]) {
  uint4 raw = load16<L>(p);
  const pair16_t<T>* h = reinterpret_cast<const pair16_t<T>*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 v = to_f32x2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}
// f[0..7] rounded to nearest-even T as one 16-byte register bundle (the bytes store_x8 writes).
template <typename T>
__device__ __forceinline__ uint4 pack_x8(const float f[8]) {
  uint4 raw;
  pair16_t<T>* h = reinterpret_cast<pair16_t<T>*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = pack2_rn<T>(f[2 * i], f[2 * i + 1]);
  return raw;
}
template <typename T, Store S = Store::Default>
__device__ __forceinline__ void store_x8(T* p, const float f[8]) {
  store16<S>(p, pack_x8<T>(f));
}

}  // namespace cutrain::kernels
