// @brief Counter-based uniform and Gumbel draws for the MoE gate's noise: draw i of stream `seed`
// depends only on (seed, i), so the CPU references reproduce the GPU's draws (and a resumed run
// its noise). __host__ __device__, fp32 math on both sides.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/stochastic_round.cuh"

namespace cutrain::kernels {

// 24 random bits: the top of a splitmix64 mix of (seed, i).
__host__ __device__ __forceinline__ std::uint32_t counter_bits24(std::uint64_t seed, std::uint64_t i) {
  const std::uint64_t h = sr_mix64(sr_mix64(seed ^ 0x452821e638d01377ULL) ^ (i * 0x9e3779b97f4a7c15ULL));
  return static_cast<std::uint32_t>(h >> 40);
}

// Uniform in (0, 1): counter_bits24 centred in its bin.
__host__ __device__ __forceinline__ float counter_uniform(std::uint64_t seed, std::uint64_t i) {
  return (float(counter_bits24(seed, i)) + 0.5f) * (1.f / 16777216.f);
}

// Standard Gumbel: -log(-log(u)).
__host__ __device__ __forceinline__ float counter_gumbel(std::uint64_t seed, std::uint64_t i) {
#ifdef __CUDA_ARCH__
  return -logf(-logf(counter_uniform(seed, i)));
#else
  return -std::log(-std::log(counter_uniform(seed, i)));
#endif
}

}  // namespace cutrain::kernels
