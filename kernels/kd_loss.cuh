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
// student's or the teacher's buffer itself (in place, ld_d that buffer's: each element is read
// before it is written, by the same thread); with `accumulate` the gradient is added to dstudent
// (padding left as is), which must alias neither. One block per row: one pass reads both rows for the two online softmax statistics and the
// cross term, a second pass (from L2 for rows up to a few MB) writes the gradient.
// temperature > 0 and finite, rows >= 0, 1 <= vocab <= min(ld_s, ld_t, ld_d); `scratch`:
// kd_loss_scratch_bytes(rows) bytes (only with loss_mean and row_kl null: may be null).
std::size_t kd_loss_scratch_bytes(int rows);
void kd_loss_forward_backward(cudaStream_t s, const bf16* student, int ld_s, const bf16* teacher, int ld_t, int rows,
                              int vocab, float temperature, float grad_scale, float* row_kl, float* loss_mean,
                              bf16* dstudent, int ld_d, bool accumulate, void* scratch);

// dlogits[m, v] += kd[m, v] for v < vocab (bf16, fp32 sum): the distillation gradient written over
// the teacher's logits added to the LM loss's gradient the cross-entropy left in place over the
// student's (kernels/cross_entropy.cuh), in the order the GPU model runs them. Padding untouched.
void kd_add_grad(cudaStream_t s, bf16* dlogits, int ld, const bf16* kd, int ld_k, int rows, int vocab);

}  // namespace cutrain::kernels
