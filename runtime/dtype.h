// @brief Element types of tensors and host-side bf16 conversions (round-to-nearest-even).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cutrain {

using bf16 = __nv_bfloat16;

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

}  // namespace cutrain
