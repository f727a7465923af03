// @brief GELU forward and backward: exact erf (nn.GELU() default) or the tanh approximation,
// optionally fused with a bias add.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "runtime/dtype.h"

namespace cutrain::kernels {

enum class GeluKind { Erf, Tanh };

// pre = in + bias[col] (bias may be null); out = gelu(pre). `pre_out` (may be null) receives pre
// when a bias is added, for backward. `in` and `out` may alias. in/out are [rows, cols].
// Both directions: with 16-byte aligned pointers, the erf kind's Φ comes from a degree-8 fit of
// log2 Φ (relative error <= 3e-5, well under bf16's 2e-3: not bit-identical to erff, about half
// the instructions) and the tanh kind divides by __fdividef (2 ulp); misaligned pointers take a
// scalar path with the exact math (erff / IEEE division). Both kinds are checked on every bf16
// input in [-12, 12] to stay within one bf16 step of the fp64 GELU.
// T is the storage type: bf16 or fp16 (instances of both), the math fp32.
template <typename T>
void gelu_forward(cudaStream_t s, const T* in, const nondeduced_t<T>* bias, nondeduced_t<T>* pre_out, T* out,
                  std::size_t rows, int cols, GeluKind kind = GeluKind::Erf);

// din = dout ⊙ gelu'(pre); din may alias dout. n elements.
template <typename T>
void gelu_backward(cudaStream_t s, const T* dout, const nondeduced_t<T>* pre, T* din, std::size_t n,
                   GeluKind kind = GeluKind::Erf);

}  // namespace cutrain::kernels
