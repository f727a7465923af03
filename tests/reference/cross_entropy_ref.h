// @brief CPU reference of the fused cross-entropy (fp64 accumulation).
#pragma once

#include <cstdint>
#include <vector>

namespace cutrain::ref {

struct CrossEntropyResult {
  double loss_mean = 0;            // mean over non-ignored rows (0 when there are none)
  std::vector<double> row_loss;    // [rows], 0 for ignored / bad-label rows
  std::vector<float> dlogits;      // [rows, ld]: (softmax - onehot) * grad_scale / n_valid; 0 in padding
  int n_valid = 0;
  int status = 0;                  // first bad-label row + 1, or 0
};

// logits: [rows, ld] (the bf16 values as floats), first `vocab` columns real. Labels equal to
// ignore_index, or outside [0, vocab), give no loss and zero gradient (the latter also set status).
CrossEntropyResult cross_entropy(const std::vector<float>& logits, const std::vector<int32_t>& labels, int rows,
                                 int vocab, int ld, int ignore_index = -100, double grad_scale = 1.0);

}  // namespace cutrain::ref
