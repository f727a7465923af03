// @brief CPU reference of dropout (see dropout_ref.h).
#include "tests/reference/dropout_ref.h"

#include "runtime/error.h"

namespace cutrain::ref {

std::vector<std::uint8_t> dropout_mask(const kernels::DropoutParams& p, std::size_t n) {
  const std::uint32_t thr = kernels::dropout_threshold(p.p);
  std::vector<std::uint8_t> keep(n);
  for (std::size_t g = 0; 4 * g < n; ++g) {
    const kernels::PhiloxWords r = kernels::dropout_bits(p.key, g);
    for (std::size_t k = 0; k < 4 && 4 * g + k < n; ++k) keep[4 * g + k] = kernels::dropout_keep(r.w[k], thr);
  }
  return keep;
}

std::vector<float> dropout(const kernels::DropoutParams& p, const std::vector<float>& x) {
  const std::vector<std::uint8_t> keep = dropout_mask(p, x.size());
  const float scale = kernels::dropout_scale(p.p);
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = keep[i] ? x[i] * scale : 0.f;
  return out;
}

std::vector<float> bias_dropout_residual(const kernels::DropoutParams& p, const std::vector<float>& x,
                                         const std::vector<float>& bias, const std::vector<float>& residual,
                                         std::size_t rows, std::size_t cols) {
  CUTRAIN_CHECK(x.size() == rows * cols && residual.size() == rows * cols && bias.size() == cols,
                "ref::bias_dropout_residual: sizes do not match [", rows, ", ", cols, "]");
  const std::vector<std::uint8_t> keep = dropout_mask(p, x.size());
  const float scale = kernels::dropout_scale(p.p);
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float t = x[i] + bias[i % cols];  // fp32 operations, one rounding each, as the kernel
    const float d = keep[i] ? t * scale : 0.f;
    out[i] = residual[i] + d;
  }
  return out;
}

}  // namespace cutrain::ref
