// @brief Token + position embedding, forward and deterministic backward.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]   (tokens int32 [B,T], tables [vocab,C], [>=T,C]).
// A token id outside [0, vocab) is not read: its row is written as zeros and the first bad
// flat index + 1 is stored into *status (device int, 0 when all ids were valid; the caller reads
// it when convenient and reports). `status` may be null.
// TS: the storage type of the tables and activations, bf16 or fp16 (instances of both).
template <typename TS>
void embedding_forward(cudaStream_t s, const int32_t* tokens, const TS* wte, const nondeduced_t<TS>* wpe, TS* out,
                       int B, int T, int C, int vocab, int* status);

// dwte[v,:] (+)= Σ_{(b,t): tokens=v} dout[b,t,:],  dwpe[t,:] (+)= Σ_b dout[b,t,:].
// Deterministic (fixed order, no float atomics), correct with repeated tokens; tables of type
// `grad_type` (bf16, fp16 or fp32); rows of dwte for tokens absent from the batch are left untouched
// when accumulate, zeroed otherwise. `scratch`: embedding_backward_scratch_bytes(B, T, C, vocab).
// Token ids outside [0, vocab) contribute nothing (the forward reports them); rows t >= T of
// dwpe are never touched. embedding_backward_scratch_bytes needs a CUDA device (it asks CUB).
// Runs a CUB radix sort by token, then a warp per distinct token.
std::size_t embedding_backward_scratch_bytes(int B, int T, int C, int vocab);
template <typename TS>
void embedding_backward(cudaStream_t s, const TS* dout, const int32_t* tokens, void* dwte, void* dwpe,
                        DType grad_type, bool accumulate, int B, int T, int C, int vocab, void* scratch);

}  // namespace cutrain::kernels
