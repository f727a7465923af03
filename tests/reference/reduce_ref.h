// @brief CPU reference of the global gradient norm and the clip coefficient (fp64).
#pragma once

#include <vector>

namespace cutrain::ref {

// sqrt(sum g_i^2) accumulated in double.
double grad_norm(const std::vector<float>& g);
// min(1, max_norm / (norm + 1e-6)) when max_norm > 0 and the norm is finite, else 1.
double clip_scale(double norm, double max_norm);

}  // namespace cutrain::ref
