// @brief The CPU reference model's analytic gradient against central finite differences in fp64,
// tensor by tensor: the seed model's and GPT-2's gradient tests share the loop and keep their own
// checks of each tensor.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "model/reference_model.h"
#include "tests/support/test_support.h"

namespace cutrain::test {

// One forward + backward at `p`, then for every tensor of `table` the central difference of each
// element (step `h`, the objective recomputed twice: the loss, plus moe.loss_coeff times the MoE
// layers' l_aux for a model with MoE blocks). `check(tensor, fd, analytic)` gets the tensor's
// differences (rounded to float, as rel_error takes them) and analytic gradient. Returns the
// analytic gradient of the whole flat buffer (padding included).
template <class Check>
std::vector<double> check_gradients(model::ReferenceModel<double>& model, const model::TransformerParams& table,
                                    std::vector<double>& p, const std::vector<std::int32_t>& tok,
                                    const std::vector<std::int32_t>& lab, int B, int S, Check check, double h = 1e-6) {
  const double coeff = table.dims().moe.loss_coeff;
  auto objective = [&] { return model.forward(p.data(), tok.data(), lab.data(), B, S) + coeff * model.aux_loss(); };
  model.forward(p.data(), tok.data(), lab.data(), B, S);
  std::vector<double> g(table.flat_size(), 0.0);
  model.backward(p.data(), g.data());
  for (const auto& t : table.tensors()) {
    std::vector<float> fd(t.count);
    std::vector<double> an(t.count);
    for (std::size_t i = 0; i < t.count; ++i) {
      double& x = p[t.offset + i];
      const double x0 = x;
      x = x0 + h;
      const double lp = objective();
      x = x0 - h;
      const double lm = objective();
      x = x0;
      fd[i] = float((lp - lm) / (2 * h));
      an[i] = g[t.offset + i];
    }
    check(t, fd, an);
  }
  return g;
}

// check_gradients' check where every tensor must get a gradient: a non-zero analytic gradient
// within `tol` relative error of the differences.
inline auto every_tensor_within(double tol) {
  return [tol](const model::ParamTensor& t, const std::vector<float>& fd, const std::vector<double>& an) {
    double norm = 0;
    for (double v : an) norm += v * v;
    ASSERT_GT(norm, 0.0) << t.name << " got no gradient";
    EXPECT_LE(rel_error(fd, an), tol) << t.name;
  };
}

}  // namespace cutrain::test
