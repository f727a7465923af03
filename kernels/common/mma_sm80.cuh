// @brief Warp-level tensor-core primitives (sm_80+): mma.sync m16n8k16 bf16 or fp16 -> fp32, ldmatrix,
// cp.async with zero fill, and bf16 / fp16 packing. Fragment layouts (PTX ISA, "mma.m16n8k16"):
//   lane = 4*g + t (g = lane/4 in 0..7, t = lane%4)
//   A 16x16 (row major), 4 regs of bf16x2: a0 (row g, cols 2t,2t+1), a1 (row g+8, same cols),
//                                          a2 (row g, cols 2t+8,+9), a3 (row g+8, cols 2t+8,+9)
//   B 16x8  ("col"),     2 regs of bf16x2: b0 (k rows 2t,2t+1, col g), b1 (k rows 2t+8,+9, col g)
//   C 16x8  fp32,        4 regs:           c0,c1 (row g, cols 2t,2t+1), c2,c3 (row g+8, same cols)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace cutrain::kernels::mma {

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// D = A * B + D, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                               std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with fp16 inputs (the fragment layouts are those of bf16).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                              std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// By the 16-bit element type E (bf16 or fp16).
template <typename E>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (std::is_same_v<E, __half>) mma_f16_16816(d, a, b0, b1);
  else mma_bf16_16816(d, a, b0, b1);
}

// Four 8x8 16-bit matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives
// matrix i's (row g, elements 2t,2t+1).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Same, transposed: register i receives matrix i's (rows 2t,2t+1, column g).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte global -> shared copy that bypasses L1; when !valid nothing is read and the 16 bytes
// are zero-filled (rows past the sequence end must be finite zeros, not stale shared memory).
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// (lo, hi) -> bf16x2 with lo in the low half (the element with the smaller column index).
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

// (lo, hi) -> fp16x2, and by element type E.
__device__ __forceinline__ std::uint32_t pack_f16(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}
template <typename E>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<E, __half>) return pack_f16(lo, hi);
  else return pack_bf16(lo, hi);
}

}  // namespace cutrain::kernels::mma
