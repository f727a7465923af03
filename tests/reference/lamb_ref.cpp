// @brief CPU reference of one LAMB step (see lamb_ref.h).
#include "tests/reference/lamb_ref.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/stochastic_round.cuh"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "tests/reference/adamw_ref.h"

namespace cutrain::ref {

void lamb_step(kernels::OptimizerLayout layout, const kernels::LambParams& p, double scale,
               const std::vector<kernels::LambTensor>& tensors, std::vector<float>& params,
               const std::vector<float>& grads, std::vector<float>& master, std::vector<float>& m,
               std::vector<float>& v, std::vector<float>* comp, std::vector<double>* ratios) {
  using kernels::OptimizerLayout;
  const bool base = layout == OptimizerLayout::Baseline, full = layout == OptimizerLayout::Bf16Full;
  CUTRAIN_CHECK(comp == nullptr || (!base && comp->size() == params.size()),
                "ref::lamb_step: the compensation belongs to a bf16 master and has one element per parameter");
  const double b1 = p.beta1, b2 = p.beta2;
  const double bc1 = 1.0 - std::pow(b1, p.step), bc2 = 1.0 - std::pow(b2, p.step);
  const double step_size = p.bias_correction ? p.lr * std::sqrt(bc2) / bc1 : p.lr;
  const auto step = static_cast<std::uint64_t>(p.step);
  if (ratios) ratios->assign(tensors.size(), 0.0);
  for (std::size_t ti = 0; ti < tensors.size(); ++ti) {
    const kernels::LambTensor& t = tensors[ti];
    const double wd = t.decay ? p.weight_decay : 0.0;
    std::vector<double> w(t.count), u(t.count);
    double sw = 0, su = 0;
    for (std::size_t k = 0; k < t.count; ++k) {
      const std::size_t i = t.begin + k;
      const double g = static_cast<double>(grads[i]) * scale;
      w[k] = base ? master[i] : params[i];
      if (comp) w[k] += (*comp)[i];
      const double mi = b1 * m[i] + (1 - b1) * g, vi = b2 * v[i] + (1 - b2) * g * g;
      const kernels::SrDraws d = kernels::sr_draws(p.seed, step, i);
      if (full) {
        m[i] = bf16_store(static_cast<float>(mi), p.stochastic_rounding, d.m);
        v[i] = bf16_store(static_cast<float>(vi), p.stochastic_rounding, d.v);
      } else {
        m[i] = static_cast<float>(mi);
        v[i] = static_cast<float>(vi);
      }
      const double denom = p.eps_inside_sqrt ? std::sqrt(double(v[i]) + p.eps) : std::sqrt(double(v[i])) + p.eps;
      u[k] = m[i] / denom + wd * w[k];
      sw += w[k] * w[k];
      su += u[k] * u[k];
    }
    const double wn = std::sqrt(sw), un = std::sqrt(su);
    double ratio = 1.0;
    if (wn != 0 && un != 0) ratio = std::clamp(wn / un, double(p.min_coeff), double(p.max_coeff));
    if (ratios) (*ratios)[ti] = ratio;
    for (std::size_t k = 0; k < t.count; ++k) {
      const std::size_t i = t.begin + k;
      const float x = static_cast<float>(w[k] - step_size * ratio * u[k]);
      const kernels::SrDraws d = kernels::sr_draws(p.seed, step, i);
      if (base) master[i] = x;
      params[i] = bf16_store(x, p.stochastic_rounding, d.param);
      if (comp) (*comp)[i] = round_bf16(x - params[i]);
    }
  }
}

}  // namespace cutrain::ref
