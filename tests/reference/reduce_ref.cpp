#include "tests/reference/reduce_ref.h"

#include <algorithm>
#include <cmath>

namespace cutrain::ref {

double grad_norm(const std::vector<float>& g) {
  double s = 0;
  for (float x : g) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double clip_scale(double norm, double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(norm)) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

}  // namespace cutrain::ref
