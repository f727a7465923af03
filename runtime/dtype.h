// @brief Element types of tensors, host-side bf16 and fp16 conversions (round-to-nearest-even), and
// the DType of each 16-bit storage type (the compute dtype of the model: bf16 or fp16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace cutrain {

using bf16 = __nv_bfloat16;
using f16 = __half;

enum class DType : std::uint8_t { F32, BF16, F16, I32, U16, U8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: case DType::U16: return 2;
    case DType::U8: return 1;
  }
  return 0;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::I32: return "int32";
    case DType::U16: return "uint16";
    case DType::U8: return "uint8";
  }
  return "?";
}

// Host conversions, bit-exact with the device's __float2bfloat16_rn (NaN stays NaN).
inline std::uint16_t f32_to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_bits_to_f32(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16 to_bf16(float f) {
  __nv_bfloat16_raw r;
  r.x = f32_to_bf16_bits(f);
  return bf16(r);
}
inline std::uint16_t bits(bf16 h) { return static_cast<__nv_bfloat16_raw>(h).x; }
inline float to_float(bf16 h) { return bf16_bits_to_f32(bits(h)); }
// Rounds through bf16 and back: what a bf16 store would keep of `f`.
inline float round_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

// fp16 on the host through cuda_fp16.h's host conversions (round-to-nearest-even, overflow to inf).
inline f16 to_f16(float f) { return __float2half_rn(f); }
inline float to_float(f16 h) { return __half2float(h); }
inline std::uint16_t bits(f16 h) { return static_cast<__half_raw>(h).x; }
// Rounds through fp16 and back: what an fp16 store would keep of `f`.
inline float round_f16(float f) { return __half2float(__float2half_rn(f)); }

// T in a parameter position that does not take part in deduction: a kernel templated on its
// storage type deduces T from its main pointers, and its optional ones still accept nullptr.
template <typename T>
struct NonDeduced {
  using type = T;
};
template <typename T>
using nondeduced_t = typename NonDeduced<T>::type;

// The DType of a storage type (bf16, fp16, fp32), for kernels and buffers templated on it.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::F32; }
template <>
constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <>
constexpr DType dtype_of<f16>() { return DType::F16; }

// Host conversions by storage type, for tests and references templated on it.
template <typename T>
inline T from_float(float f);
template <>
inline bf16 from_float<bf16>(float f) { return to_bf16(f); }
template <>
inline f16 from_float<f16>(float f) { return to_f16(f); }
// What a store of `f` into T keeps (fp32 for float).
template <typename T>
inline float round_to(float f) {
  if constexpr (std::is_same_v<T, bf16>) return round_bf16(f);
  else if constexpr (std::is_same_v<T, f16>) return round_f16(f);
  else return f;
}

}  // namespace cutrain
