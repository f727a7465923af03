#include "tests/reference/mlm_gather_ref.h"

#include "runtime/error.h"

namespace cutrain::ref {

MlmGatherPlan mlm_gather_plan(const std::vector<std::int32_t>& labels, int B, int S, int K, int vocab,
                              int ignore_index) {
  CUTRAIN_CHECK(labels.size() == std::size_t(B) * S && K >= 1 && K <= S, "mlm_gather_plan ref: sizes");
  MlmGatherPlan p;
  p.pos.assign(std::size_t(B) * K, 0);
  p.glabels.assign(std::size_t(B) * K, ignore_index);
  p.slot.assign(std::size_t(B) * S, -1);
  int bad_row = -1, full_seq = -1;
  for (int b = 0; b < B; ++b) {
    int count = 0;
    for (int i = 0; i < S; ++i) {
      const std::size_t r = std::size_t(b) * S + i;
      const int lab = labels[r];
      if (lab == ignore_index) continue;
      if (lab < 0 || lab >= vocab) {
        if (bad_row < 0) bad_row = int(r);
        continue;
      }
      if (count < K) {
        const std::size_t sl = std::size_t(b) * K + count;
        p.pos[sl] = i;
        p.glabels[sl] = lab;
        p.slot[r] = int(sl);
      }
      ++count;
    }
    if (count > K && full_seq < 0) full_seq = b;
  }
  p.status = bad_row >= 0 ? bad_row + 1 : full_seq >= 0 ? -(full_seq + 1) : 0;
  return p;
}

std::vector<double> mlm_scatter_rows(const std::vector<double>& gathered, const std::vector<std::int32_t>& slot,
                                     int rows, int h) {
  CUTRAIN_CHECK(slot.size() == std::size_t(rows) && gathered.size() % std::size_t(h) == 0,
                "mlm_scatter_rows ref: sizes");
  std::vector<double> out(std::size_t(rows) * h, 0.0);
  for (int r = 0; r < rows; ++r) {
    const int s = slot[std::size_t(r)];
    if (s < 0) continue;
    CUTRAIN_CHECK(std::size_t(s + 1) * h <= gathered.size(), "mlm_scatter_rows ref: slot ", s, " out of range");
    for (int c = 0; c < h; ++c) out[std::size_t(r) * h + c] = gathered[std::size_t(s) * h + c];
  }
  return out;
}

}  // namespace cutrain::ref
