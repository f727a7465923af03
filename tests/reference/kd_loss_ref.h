// @brief CPU reference of knowledge distillation's loss (kernels/kd_loss.cuh, model/distillation_loss.h),
// fp64 throughout, straight from the definition: two log-softmaxes, then the KL and its gradient.
#pragma once

#include <vector>

namespace cutrain::ref {

struct KdLossResult {
  std::vector<double> row_kl;    // [rows]: sum_v p_v (log p_v - log q_v)
  double loss_mean = 0;          // T^2 * mean over rows of row_kl
  std::vector<double> dstudent;  // [rows, ld_s]: grad_scale * T * (q - p) / rows; 0 in padding
};

// student [rows, ld_s], teacher [rows, ld_t] (the bf16 values as floats), first `vocab` columns
// real; p = softmax(teacher / T), q = softmax(student / T).
KdLossResult kd_loss(const std::vector<float>& student, int ld_s, const std::vector<float>& teacher, int ld_t, int rows,
                     int vocab, double temperature, double grad_scale = 1.0);

}  // namespace cutrain::ref
