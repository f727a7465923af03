// @brief Megatron's vocabulary-parallel cross-entropy, one tensor-parallel rank's share: the rank
// holds the logit columns [col_begin, col_begin + ld) of every row (its vocabulary slice, the
// logits never gathered), and the loss needs three passes with the group's all-reduces between
// them, which the caller issues (model/transformer_gpu.h's TpDeviceGroup):
//   1. vocab_parallel_ce_max:   row_max[r] = max of the slice's real columns      -> all-reduce max
//   2. vocab_parallel_ce_sums:  stats[r] = sum of exp(l - row_max[r]) over them, stats[rows + r] =
//                               the label's logit where the label lies in the slice, else 0
//                                                                                  -> all-reduce sum
//   3. vocab_parallel_ce_finish: each row's loss log(stats[r]) + row_max[r] - stats[rows + r], their
//      mean over the non-ignored rows into *loss_mean, and (grad) the slice's
//      dlogits = (exp(l - row_max) / stats - onehot(label)) * grad_scale / n_valid in place.
// After the all-reduces every rank holds the whole row's max, sum and target logit, so the loss and
// the gradient are kernels/cross_entropy.cuh's over the whole vocabulary, computed per slice.
// The slice's real columns are [col_begin, min(col_begin + ld, vocab)) (none for a slice of padded
// rows only): padded columns never win and get gradient 0. labels: int32 [rows]; ignore_index rows
// give no loss and gradient 0; a label outside [0, vocab) that is not ignore_index is treated as
// ignored and the first such row + 1 is written to *status (0 when none; may be null) by pass 3.
// Every rank computes the same loss bits from the same reduced statistics. bf16 only (tensor
// parallelism runs in bf16). Deterministic: fixed reduction orders, no float atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// logits: bf16 [rows, ld]; row_max: fp32 [rows].
void vocab_parallel_ce_max(cudaStream_t s, const bf16* logits, int rows, int ld, int col_begin, int vocab,
                           float* row_max);

// stats: fp32 [2 * rows] (sum of exponentials, then the target logits); row_max: the group's.
void vocab_parallel_ce_sums(cudaStream_t s, const bf16* logits, const int32_t* labels, int rows, int ld,
                            int col_begin, int vocab, const float* row_max, float* stats, int ignore_index = -100);

// scratch: vocab_parallel_ce_scratch_bytes(rows), 16-byte aligned. `row_loss` (fp32 [rows], may be
// null) receives each row's loss (0 for ignored rows). grad false: the logits are left untouched
// (evaluation). `device_grad_scale` (device fp32, may be null) multiplies grad_scale on the device.
std::size_t vocab_parallel_ce_scratch_bytes(int rows);
void vocab_parallel_ce_finish(cudaStream_t s, bf16* logits, const int32_t* labels, int rows, int ld, int col_begin,
                              int vocab, const float* row_max, const float* stats, float* loss_mean, float* row_loss,
                              int* status, void* scratch, bool grad, int ignore_index = -100, float grad_scale = 1.f,
                              const float* device_grad_scale = nullptr);

}  // namespace cutrain::kernels
