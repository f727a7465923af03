// @brief fp64 reference of knowledge distillation's loss (tests/reference/kd_loss_ref.h).
#include "tests/reference/kd_loss_ref.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace cutrain::ref {
namespace {

// log softmax(x / T) over the row's first `vocab` entries.
std::vector<double> log_softmax(const float* x, int vocab, double temperature) {
  std::vector<double> y(vocab);
  double mx = -INFINITY;
  for (int v = 0; v < vocab; ++v) mx = std::max(mx, double(x[v]) / temperature);
  double sum = 0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(double(x[v]) / temperature - mx);
  const double lse = mx + std::log(sum);
  for (int v = 0; v < vocab; ++v) y[v] = double(x[v]) / temperature - lse;
  return y;
}

}  // namespace

KdLossResult kd_loss(const std::vector<float>& student, int ld_s, const std::vector<float>& teacher, int ld_t, int rows,
                     int vocab, double temperature, double grad_scale) {
  KdLossResult r;
  r.row_kl.assign(std::size_t(rows), 0.0);
  r.dstudent.assign(std::size_t(rows) * ld_s, 0.0);
  double sum = 0;
  for (int m = 0; m < rows; ++m) {
    const std::vector<double> lq = log_softmax(&student[std::size_t(m) * ld_s], vocab, temperature);
    const std::vector<double> lp = log_softmax(&teacher[std::size_t(m) * ld_t], vocab, temperature);
    double kl = 0;
    for (int v = 0; v < vocab; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
    r.row_kl[m] = kl;
    sum += kl;
    for (int v = 0; v < vocab; ++v)
      r.dstudent[std::size_t(m) * ld_s + v] = grad_scale * temperature * (std::exp(lq[v]) - std::exp(lp[v])) / rows;
  }
  r.loss_mean = rows > 0 ? temperature * temperature * sum / rows : 0.0;
  return r;
}

}  // namespace cutrain::ref
