#include "tests/reference/cross_entropy_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cutrain::ref {

CrossEntropyResult cross_entropy(const std::vector<float>& logits, const std::vector<int32_t>& labels, int rows,
                                 int vocab, int ld, int ignore_index, double grad_scale) {
  CrossEntropyResult r;
  r.row_loss.assign(rows, 0.0);
  r.dlogits.assign(static_cast<std::size_t>(rows) * ld, 0.f);
  std::vector<char> valid(rows, 0);
  for (int i = 0; i < rows; ++i) {
    const int l = labels[i];
    if (l == ignore_index) continue;
    if (l < 0 || l >= vocab) {
      if (r.status == 0) r.status = i + 1;
      continue;
    }
    valid[i] = 1;
    ++r.n_valid;
  }
  const double scale = grad_scale / std::max(r.n_valid, 1);
  double total = 0;
  for (int i = 0; i < rows; ++i) {
    if (!valid[i]) continue;
    const float* x = logits.data() + static_cast<std::size_t>(i) * ld;
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(x[j]));
    double sum = 0;
    for (int j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(x[j]) - mx);
    const double lse = mx + std::log(sum);
    r.row_loss[i] = lse - x[labels[i]];
    total += r.row_loss[i];
    float* d = r.dlogits.data() + static_cast<std::size_t>(i) * ld;
    for (int j = 0; j < vocab; ++j) {
      const double p = std::exp(static_cast<double>(x[j]) - lse);
      d[j] = static_cast<float>((p - (j == labels[i] ? 1.0 : 0.0)) * scale);
    }
  }
  r.loss_mean = r.n_valid > 0 ? total / r.n_valid : 0.0;
  return r;
}

}  // namespace cutrain::ref
