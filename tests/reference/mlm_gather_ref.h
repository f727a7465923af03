// @brief CPU references of kernels/mlm_gather: the masked-LM head's plan (each sequence's labelled
// rows into its own K slots, in row order; the status word) and the scatter of the gathered rows'
// gradient back to every row (zeros where no slot points), on fp64 rows.
#pragma once

#include <cstdint>
#include <vector>

namespace cutrain::ref {

struct MlmGatherPlan {
  std::vector<std::int32_t> pos, glabels;  // [B·K]
  std::vector<std::int32_t> slot;          // [B·S]
  int status = 0;                          // kernels::mlm_gather_plan's encoding
};
MlmGatherPlan mlm_gather_plan(const std::vector<std::int32_t>& labels, int B, int S, int K, int vocab,
                              int ignore_index = -100);

// out[r, :] = slot[r] >= 0 ? gathered[slot[r], :] : 0; out [rows, h].
std::vector<double> mlm_scatter_rows(const std::vector<double>& gathered, const std::vector<std::int32_t>& slot,
                                     int rows, int h);

}  // namespace cutrain::ref
