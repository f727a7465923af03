// @brief Knowledge distillation's loss on the host (Mixture-of-Students, docs/moe.md): the
// temperature-scaled KL of the teacher's distribution to the student's, averaged over rows, and its
// gradient w.r.t. the student's logits. The CPU backend's version of kernels/kd_loss.cuh, with the
// same definition; fp64 accumulation whatever the storage type.
#pragma once

#include <cstddef>

namespace cutrain::model {

// student [rows, ld_s], teacher [rows, ld_t], the first `vocab` columns real (padding never read).
// With p = softmax(teacher / T), q = softmax(student / T) per row, returns
//   loss = T^2 * (1 / rows) * sum_rows sum_v p_v (log p_v - log q_v)
// (Megatron-DeepSpeed's MoS term before kd_beta_ce: T^2 * KLDivLoss('batchmean') / seq_length),
// and when `dstudent` is not null adds grad_scale * d(loss)/d(student) = grad_scale * T * (q - p) / rows
// into its first `vocab` columns ([rows, ld_s]). Throws cutrain::Error for a temperature that is
// not finite and > 0, or a vocabulary wider than a row.
template <typename T>
double distillation_loss(const T* student, int ld_s, const T* teacher, int ld_t, int rows, int vocab,
                         double temperature, double grad_scale, T* dstudent);

}  // namespace cutrain::model
