// @brief fast_ex2: 2^x in one MUFU.EX2 (ex2.approx.ftz.f32). exp2f without --use_fast_math keeps
// subnormal results and compiles to four instructions (a compare, two predicated multiplies around
// the MUFU); softmax-style kernels, whose exponent arguments are max-subtracted (<= 0) and whose
// results below 2^-126 are negligible against the row's largest term (1), take the one.
// 2^-inf = +0, 2^x for x < -126 flushes to +0.
#pragma once

namespace cutrain::kernels {

__device__ __forceinline__ float fast_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace cutrain::kernels
