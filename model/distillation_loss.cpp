// @brief Knowledge distillation's loss on the host (model/distillation_loss.h).
#include "model/distillation_loss.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/error.h"

namespace cutrain::model {

template <typename T>
double distillation_loss(const T* student, int ld_s, const T* teacher, int ld_t, int rows, int vocab,
                         double temperature, double grad_scale, T* dstudent) {
  CUTRAIN_CHECK(temperature > 0 && std::isfinite(temperature), "distillation loss: the temperature must be finite and ",
                "> 0, got ", temperature);
  CUTRAIN_CHECK(vocab >= 1 && ld_s >= vocab && ld_t >= vocab, "distillation loss: vocabulary ", vocab,
                " outside the rows (student ", ld_s, ", teacher ", ld_t, " columns)");
  if (rows <= 0) return 0.0;
  std::vector<double> ls(static_cast<std::size_t>(vocab)), lt(static_cast<std::size_t>(vocab));
  // x / T - logsumexp(x / T) over the row.
  auto log_softmax = [&](const T* x, std::vector<double>& y) {
    double mx = -INFINITY;
    for (int v = 0; v < vocab; ++v) mx = std::max(mx, double(x[v]) / temperature);
    double sum = 0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(double(x[v]) / temperature - mx);
    const double lse = mx + std::log(sum);
    for (int v = 0; v < vocab; ++v) y[std::size_t(v)] = double(x[v]) / temperature - lse;
  };
  const double k = grad_scale * temperature / rows;
  double total = 0;
  for (int m = 0; m < rows; ++m) {
    log_softmax(student + std::size_t(m) * ld_s, ls);
    log_softmax(teacher + std::size_t(m) * ld_t, lt);
    double kl = 0;
    for (int v = 0; v < vocab; ++v) kl += std::exp(lt[std::size_t(v)]) * (lt[std::size_t(v)] - ls[std::size_t(v)]);
    total += kl;
    if (!dstudent) continue;
    T* d = dstudent + std::size_t(m) * ld_s;
    for (int v = 0; v < vocab; ++v)
      d[v] = T(double(d[v]) + k * (std::exp(ls[std::size_t(v)]) - std::exp(lt[std::size_t(v)])));
  }
  return temperature * temperature * total / rows;
}

template double distillation_loss<float>(const float*, int, const float*, int, int, int, double, double, float*);
template double distillation_loss<double>(const double*, int, const double*, int, int, int, double, double, double*);

}  // namespace cutrain::model
