// @brief Philox-4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11), the
// counter-based generator of dropout: four 32-bit words from a 128-bit counter and a 64-bit key,
// a pure function of both. __host__ __device__, so the CPU reference draws the very same bits.
//
// Dropout's keying (dropout_bits): key = the run's seed; counter = (element / 4 as 64 bits, step,
// layer); word element % 4 is that element's 32 random bits. A mask is then a function of
// (seed, step, layer, element) alone: forward and backward regenerate it, resumes repeat it, and
// no thread order or launch shape changes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cutrain::kernels {

struct PhiloxWords {
  std::uint32_t w[4];
};

__host__ __device__ __forceinline__ void philox_mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi,
                                                        std::uint32_t& lo) {
#ifdef __CUDA_ARCH__
  hi = __umulhi(a, b);
  lo = a * b;
#else
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
#endif
}

// Ten rounds: each multiplies words 0 and 2 by the round constants, mixes the high halves with
// words 1 and 3 and the key, and the key is bumped by the Weyl constants between rounds.
__host__ __device__ __forceinline__ PhiloxWords philox4x32_10(PhiloxWords c, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // multipliers
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key increments
#ifdef __CUDA_ARCH__  // (host compilers warn on the pragma)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    std::uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c.w[0], hi0, lo0);
    philox_mulhilo(kM1, c.w[2], hi1, lo1);
    c = PhiloxWords{{hi1 ^ c.w[1] ^ k0, lo1, hi0 ^ c.w[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// Where a dropout mask lives: the run's seed, the optimizer step, and the dropout site (a layer,
// or a layer's attention / hidden dropout: the caller numbers the sites).
// `step_ptr` (device memory, kernels only): when set, the step is read from there instead of
// `step`, so a captured CUDA graph draws each replay's step's mask (the engine writes the step
// before the replay). The CPU reference leaves it null.
struct DropoutKey {
  std::uint64_t seed = 0;
  std::uint32_t step = 0, layer = 0;
  const std::uint32_t* step_ptr = nullptr;
};

// The step a kernel draws with: *step_ptr when set (read once per kernel is enough), else step.
__host__ __device__ __forceinline__ std::uint32_t dropout_step(const DropoutKey& k) {
#ifdef __CUDA_ARCH__
  return k.step_ptr ? __ldg(k.step_ptr) : k.step;
#else
  return k.step;
#endif
}

// The 32 random bits of elements 4g .. 4g + 3 (one Philox call).
__host__ __device__ __forceinline__ PhiloxWords dropout_bits(const DropoutKey& k, std::uint64_t group) {
  return philox4x32_10(PhiloxWords{{static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                                    dropout_step(k), k.layer}},
                       static_cast<std::uint32_t>(k.seed), static_cast<std::uint32_t>(k.seed >> 32));
}

// An element is kept when its bits are >= the threshold round(p * 2^32) (P = 1 - p to 2^-32).
__host__ __device__ __forceinline__ bool dropout_keep(std::uint32_t bits, std::uint32_t threshold) {
  return bits >= threshold;
}

}  // namespace cutrain::kernels
