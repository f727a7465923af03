// @brief The MoE gate's multiplicative jitter (DeepSpeed's noisy_gate_policy "Jitter", from the Switch
// Transformer): the gate reads x · u with u uniform in [1 - eps, 1 + eps] per element, drawn from
// kernels/common/counter_uniform.cuh as u = 1 - eps + 2·eps·counter_uniform(seed, i), i = s·H + h.
// The backward multiplies the gate GEMM's input gradient by the same u and adds it to dx.
// `seed_word` non-null: the seed is *seed_word ^ seed, read on the device (a captured CUDA graph
// draws the word's value at each replay).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// xj[n] = x[n] · u(n), n elements (bf16).
void moe_jitter_forward(cudaStream_t s, const bf16* x, bf16* xj, std::size_t n, float eps, std::uint64_t seed,
                        const std::uint64_t* seed_word = nullptr);

// dx[n] += g[n] · u(n).
void moe_jitter_backward(cudaStream_t s, const bf16* g, bf16* dx, std::size_t n, float eps, std::uint64_t seed,
                         const std::uint64_t* seed_word = nullptr);

}  // namespace cutrain::kernels
