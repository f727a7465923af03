// @brief What the attention GPU tests share: slot w of a [B, S, 3, H, D] array and the gradient
// error measure (relative, with a floor where the reference gradient vanishes).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/attention.cuh"

namespace cutrain::test {

// Slot w (0 q, 1 k, 2 v) of a [B, S, 3, H, D] array.
template <typename T>
std::vector<T> attention_slot(const std::vector<T>& a, const kernels::AttentionShape& s, int w) {
  const std::size_t row = static_cast<std::size_t>(s.heads) * s.head_dim;
  std::vector<T> r;
  r.reserve(a.size() / 3);
  for (std::size_t t = 0; t < static_cast<std::size_t>(s.batch) * s.seq; ++t)
    r.insert(r.end(), a.begin() + (t * 3 + w) * row, a.begin() + (t * 3 + w + 1) * row);
  return r;
}

// dQ and dK vanish where the softmax is one-hot (seq 1, the first causal row, saturated logits):
// there ||ref|| -> 0 and a plain relative error divides rounding noise by ~0. Their error is
// measured against max(||ref||, 5% of ||dV_ref||): dV = P^T dO carries the gradients' natural
// scale, and the cancelling terms of dQ/dK are of that size.
template <typename A, typename B>
double attention_grad_error(const A& out, const B& ref, const B& dv_ref) {
  double num = 0, den = 0, dv = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  for (const auto& x : dv_ref) dv += static_cast<double>(x) * static_cast<double>(x);
  const double floor = 0.05 * std::sqrt(dv);
  const double scale = std::max(std::sqrt(den), floor);
  return scale == 0 ? (num == 0 ? 0.0 : INFINITY) : std::sqrt(num) / scale;
}

}  // namespace cutrain::test
