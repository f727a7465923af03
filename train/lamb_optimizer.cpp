// @brief LAMB in training (see lamb_optimizer.h).
#include "train/lamb_optimizer.h"

#include <algorithm>
#include <cmath>

namespace cutrain::train {

kernels::LambParams lamb_params(const OptimizerConfig& o, float lr, int step) {
  kernels::LambParams p;
  p.lr = lr;
  p.beta1 = o.beta1;
  p.beta2 = o.beta2;
  p.eps = o.eps;
  p.weight_decay = o.weight_decay;
  p.max_coeff = o.max_coeff;
  p.min_coeff = o.min_coeff;
  p.bias_correction = o.bias_correction;
  p.eps_inside_sqrt = o.eps_inside_sqrt;
  p.step = step;
  return p;
}

std::vector<kernels::LambTensor> lamb_tensors(const model::TransformerParams& table) {
  std::vector<kernels::LambTensor> out;
  for (const model::ParamTensor& t : table.tensors()) out.push_back({t.offset, t.count, t.decay});
  return out;
}

void host_lamb_step(const kernels::LambParams& p, double scale, const std::vector<kernels::LambTensor>& tensors,
                    float* params, const float* grads, float* m, float* v, std::vector<double>* ratios) {
  const double b1 = p.beta1, b2 = p.beta2;
  const double step_size =
      p.bias_correction ? p.lr * std::sqrt(1.0 - std::pow(b2, p.step)) / (1.0 - std::pow(b1, p.step)) : p.lr;
  if (ratios) ratios->assign(tensors.size(), 0.0);
  std::vector<double> u;
  for (std::size_t ti = 0; ti < tensors.size(); ++ti) {
    const kernels::LambTensor& t = tensors[ti];
    const double wd = t.decay ? p.weight_decay : 0.0;
    u.resize(t.count);
    double sw = 0, su = 0;
    for (std::size_t k = 0; k < t.count; ++k) {
      const std::size_t i = t.begin + k;
      const double g = double(grads[i]) * scale, w = params[i];
      m[i] = static_cast<float>(b1 * m[i] + (1 - b1) * g);
      v[i] = static_cast<float>(b2 * v[i] + (1 - b2) * g * g);
      const double denom = p.eps_inside_sqrt ? std::sqrt(double(v[i]) + p.eps) : std::sqrt(double(v[i])) + p.eps;
      u[k] = m[i] / denom + wd * w;
      sw += w * w;
      su += u[k] * u[k];
    }
    const double wn = std::sqrt(sw), un = std::sqrt(su);
    const double ratio = wn != 0 && un != 0 ? std::clamp(wn / un, double(p.min_coeff), double(p.max_coeff)) : 1.0;
    if (ratios) (*ratios)[ti] = ratio;
    for (std::size_t k = 0; k < t.count; ++k)
      params[t.begin + k] = static_cast<float>(params[t.begin + k] - step_size * ratio * u[k]);
  }
}

}  // namespace cutrain::train
