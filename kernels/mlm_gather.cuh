// @brief BERT's masked-LM head runs on the labelled rows only: the plan (from the labels, each
// sequence's rows with a label into its own `max_pred` slots, in row order) and the scatter of the
// head's input gradient back to every row (zeros where no slot points). The forward's row gather is
// kernels/token_gather (the plan's positions are per sequence, as random-LTD's are).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// labels: int32 [B, S]; a row is labelled where its label is not `ignore_index` and lies in
// [0, vocab). Per sequence b, its labelled rows in order go to slots b·K .. b·K + count - 1
// (K = max_pred):
//   pos[b·K + k]    = the row's position in its sequence (kernels::token_gather's index),
//   glabels[b·K + k] = its label,
//   slot[b·S + i]   = b·K + k for a gathered row, -1 for every other row (all B·S written).
// The slots past a sequence's count point at position 0 (a valid row) with label ignore_index, so
// they carry no loss and get no gradient. Writes *status (device int; may be null), always:
//   0             every label valid and no sequence with more than K labelled rows;
//   r + 1 > 0     row r (flat) is the first with a label outside [0, vocab) (not gathered);
//   -(b + 1) < 0  sequence b is the first with more than K labelled rows (its first K are gathered)
// (a bad label is reported before a full sequence). Deterministic; one block of warps, a warp per
// sequence (the plan is B·S int reads). B·S < 2^31 and 1 <= K <= S.
void mlm_gather_plan(cudaStream_t s, const std::int32_t* labels, int B, int S, int K, int vocab,
                     std::int32_t* pos, std::int32_t* glabels, std::int32_t* slot, int* status,
                     int ignore_index = -100);

// out[r, :] = slot[r] >= 0 ? gathered[slot[r], :] : 0 over rows r of [rows, hidden] (every row
// written: the bit-exact copy or zeros).
// T: bf16 or fp16 (instances of both).
template <typename T>
void mlm_scatter_rows(cudaStream_t s, const T* gathered, const std::int32_t* slot, T* out, int rows, int hidden);

}  // namespace cutrain::kernels
