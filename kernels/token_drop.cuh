// @brief random-LTD's token gather and scatter: the kept tokens of each sequence out of the
// residual stream [B, S, hidden] into a dense [B, K, hidden] buffer before a dropping block, and
// the block's output back into their rows after it (the dropped rows are left as they are: those
// tokens bypass the block). The same pair moves the gradients the other way in backward. The
// forward's bypass and scatter are one kernel (token_merge): the block's output stream written
// once, every row, from the kept rows or from the input stream.
// idx: int32 [B, K], each sequence's kept positions (ascending, distinct, in [0, S): the caller's
// draw, model/token_drop_plan.h; not checked on the device).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// T: bf16 or fp16 (instances of both).
// kept[b, j, :] = x[b, idx[b, j], :] (a bit-exact copy).
template <typename T>
void token_gather(cudaStream_t s, const T* x, const std::int32_t* idx, T* kept, int B, int S, int K, int hidden);

// out[b, idx[b, j], :] = kept[b, j, :] + add[b, j, :] (add may be null: a bit-exact copy; with it,
// the sum in fp32 rounded once to T). The other rows of out are not touched.
template <typename T>
void token_scatter(cudaStream_t s, const T* kept, const nondeduced_t<T>* add, const std::int32_t* idx, T* out, int B,
                   int S, int K, int hidden);

// out[b, p, :] = kept[b, j, :] + add[b, j, :] where p = idx[b, j] (add may be null: a copy; with
// it, the sum in fp32 rounded once to T), else x[b, p, :] (a bit-exact copy): every row of out
// written, x [B, S, hidden] unchanged. The kept slot of a position is a binary search of its
// sequence's ascending idx. out must not overlap x, kept or add.
template <typename T>
void token_merge(cudaStream_t s, const T* x, const T* kept, const nondeduced_t<T>* add, const std::int32_t* idx, T* out,
                 int B, int S, int K, int hidden);

}  // namespace cutrain::kernels
