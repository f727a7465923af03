// @brief CPU reference of one Adam / AdamW step (see adamw_ref.h).
#include "tests/reference/adamw_ref.h"

#include <cmath>
#include <cstring>

#include "kernels/common/stochastic_round.cuh"
#include "runtime/dtype.h"
#include "runtime/error.h"

namespace cutrain::ref {

float bf16_store(float f, bool stochastic, unsigned r16) {
  if (!stochastic) return round_bf16(f);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return bf16_bits_to_f32(kernels::sr_round_bits(u, r16));
}

void adam_step(kernels::OptimizerLayout layout, const kernels::AdamParams& p, double scale, std::vector<float>& params,
               const std::vector<float>& grads, std::vector<float>& master, std::vector<float>& m,
               std::vector<float>& v, std::vector<float>* comp) {
  using kernels::OptimizerLayout;
  const double b1 = p.beta1, b2 = p.beta2;
  const double bc1 = 1.0 - std::pow(b1, p.step), bc2 = 1.0 - std::pow(b2, p.step);
  const bool base = layout == OptimizerLayout::Baseline, full = layout == OptimizerLayout::Bf16Full;
  CUTRAIN_CHECK(comp == nullptr || (!base && comp->size() == params.size()),
                "ref::adam_step: the compensation belongs to a bf16 master and has one element per parameter");
  for (std::size_t i = 0; i < params.size(); ++i) {
    double g = static_cast<double>(grads[i]) * scale;
    double w = base ? master[i] : params[i];
    if (comp) w += (*comp)[i];
    if (!p.decoupled) g += p.weight_decay * w;
    const double mi = b1 * m[i] + (1 - b1) * g;
    const double vi = b2 * v[i] + (1 - b2) * g * g;
    double update = (mi / bc1) / (std::sqrt(vi / bc2) + p.eps);
    if (p.decoupled) update += p.weight_decay * w;
    w -= p.lr * update;
    std::uint32_t rp = 0, rm = 0, rv = 0;  // 16-bit draws of the parameter, m, v
    if (p.stochastic_rounding) {
      const kernels::SrDraws d = kernels::sr_draws(p.seed, static_cast<std::uint64_t>(p.step), i);
      rp = d.param, rm = d.m, rv = d.v;
    }
    if (base) master[i] = static_cast<float>(w);
    params[i] = bf16_store(static_cast<float>(w), p.stochastic_rounding, rp);
    if (comp) (*comp)[i] = round_bf16(static_cast<float>(w) - params[i]);  // the difference is exact in float
    if (full) {
      m[i] = bf16_store(static_cast<float>(mi), p.stochastic_rounding, rm);
      v[i] = bf16_store(static_cast<float>(vi), p.stochastic_rounding, rv);
    } else {
      m[i] = static_cast<float>(mi);
      v[i] = static_cast<float>(vi);
    }
  }
}

}  // namespace cutrain::ref
