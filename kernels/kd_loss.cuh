// @brief Knowledge distillation's loss over the vocabulary (Mixture-of-Students, docs/moe.md):
// KL(softmax(teacher / T) || softmax(student / T)) per row and its gradient w.r.t. the student's
// logits, bf16 logits with fp32 math, the row's statistics in one read of both rows.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// student: bf16 [rows, ld_s], teacher: bf16 [rows, ld_t], the first `vocab` columns of each real
// (columns past vocab are padding: never read). With p = softmax(teacher / T), q = softmax(student / T):
//   row_kl[m]  = sum_v p_v (log p_v - log q_v)                       (fp32 [rows], may be null)
//   *loss_mean = T^2 * (1 / rows) * sum_m row_kl[m]                  (fp32 scalar, may be null;
//                summed in a fixed order, so deterministic)
//   dstudent   = grad_scale * d(loss_mean)/d(student)
//              = grad_scale * T * (q - p) / rows                     (bf16 [rows, ld_d], may be null)
// Megatron-DeepSpeed's MoS loss is kd_beta_ce * loss_mean (KLDivLoss 'batchmean' / seq_length is
// the mean over the B x S rows), so grad_scale = beta / (accumulation steps) gives its gradient.
// Without `accumulate` dstudent is written (padding columns [vocab, ld_d) set to 0) and may be the
// student buffer itself (in place: each element is read before it is written, by the same thread);
// with `accumulate` the gradient is added to dstudent (padding left as is), which must not alias the
// student. One block per row: one pass reads both rows for the two online softmax statistics and the
// cross term, a second pass (from L2 for rows up to a few MB) writes the gradient.
// temperature > 0 and finite, rows >= 0, 1 <= vocab <= min(ld_s, ld_t, ld_d); `scratch`:
// kd_loss_scratch_bytes(rows) bytes (only with loss_mean and row_kl null: may be null).
std::size_t kd_loss_scratch_bytes(int rows);
void kd_loss_forward_backward(cudaStream_t s, const bf16* student, int ld_s, const bf16* teacher, int ld_t, int rows,
                              int vocab, float temperature, float grad_scale, float* row_kl, float* loss_mean,
                              bf16* dstudent, int ld_d, bool accumulate, void* scratch);

}  // namespace cutrain::kernels
