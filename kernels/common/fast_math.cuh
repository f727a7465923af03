// @brief fast_ex2: 2^x in one MUFU.EX2 (ex2.approx.ftz.f32). exp2f without --use_fast_math keeps
// subnormal results and compiles to four instructions (a compare, two predicated multiplies around
// the MUFU); softmax-style kernels, whose exponent arguments are max-subtracted (<= 0) and whose
// results below 2^-126 are negligible against the row's largest term (1), take the one.
// 2^-inf = +0, 2^x for x < -126 flushes to +0.
// poly_ex2: 2^x for x <= 0 on the FMA and integer pipes instead of the MUFU (16 results per clock
// per SM, shared by every warp of the SM), for kernels whose exponentials compete with the tensor
// cores for time: a share of them moves off the MUFU at 8 issue slots each.
#pragma once

namespace cutrain::kernels {

__device__ __forceinline__ float fast_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^x = 2^j * 2^f with j = round(x) (adding 1.5 * 2^23 rounds x to an integer in the low
// mantissa bits) and f = x - j in [-0.5, 0.5]; 2^f by a degree-3 polynomial (coefficients fitted
// here for the least maximum relative error on [-0.5, 0.5]: 7.5e-5, against bf16's 3.9e-3 step),
// 2^j by adding j to the exponent field. x is clamped at -125 so the exponent field stays
// positive: results there are 2^-125 (2.4e-38) where fast_ex2 gives 0, which a row sum of at least
// 1 cannot see; a caller whose row may have no term at all (every score -inf) needs fast_ex2.
__device__ __forceinline__ float poly_ex2(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23
  x = fmaxf(x, -125.f);
  const float t = x + kRound;
  const float f = x - (t - kRound);
  float p = fmaf(0.0551716648f, f, 0.242611170f);
  p = fmaf(p, f, 0.693260968f);
  p = fmaf(p, f, 0.999928057f);
  // t's low bits hold j (two's complement); j << 23 added to p's bits scales p by 2^j.
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

}  // namespace cutrain::kernels
