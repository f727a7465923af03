// @brief CPU references of kernels/token_drop: random-LTD's gather of the kept rows, their scatter
// back (the other rows untouched) and the merge (the scatter over a copy of the input stream), on
// fp64 rows; the scatter's optional second operand is added in fp64.
#pragma once

#include <cstdint>
#include <vector>

namespace cutrain::ref {

// kept[b, j, :] = x[b, idx[b, j], :]; x [B, S, h], idx [B, K], kept [B, K, h].
std::vector<double> token_gather(const std::vector<double>& x, const std::vector<std::int32_t>& idx, int B, int S,
                                 int K, int h);
// out[b, idx[b, j], :] = kept[b, j, :] (+ add[b, j, :] when add is not null).
void token_scatter(const std::vector<double>& kept, const std::vector<double>* add, const std::vector<std::int32_t>& idx,
                   std::vector<double>& out, int B, int S, int K, int h);
// out = x with row (b, idx[b, j]) replaced by kept[b, j, :] (+ add[b, j, :]): the bypass and the
// scatter of kernels::token_merge; out [B, S, h].
std::vector<double> token_merge(const std::vector<double>& x, const std::vector<double>& kept,
                                const std::vector<double>* add, const std::vector<std::int32_t>& idx, int B, int S,
                                int K, int h);

}  // namespace cutrain::ref
