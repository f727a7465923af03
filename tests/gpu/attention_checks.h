// @brief What the attention GPU tests share: slot w of a [B, S, 3, H, D] array, the gradient
// error measure (relative, with a floor where the reference gradient vanishes), the key masks
// the option tests draw and the log-sum-exp check of masked rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.cuh"
#include "tests/support/test_support.h"

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

// A key mask [B, S] for the option tests. Sequence 0: no valid key; 1: all valid; 2: a padded
// prefix of random length; 3 and up: random bits (about 70% valid), not a prefix. Valid bytes are
// 1 or 7 (any nonzero byte means valid).
inline std::vector<std::uint8_t> option_test_mask(const kernels::AttentionShape& sh, std::mt19937_64& rng) {
  std::vector<std::uint8_t> m(static_cast<std::size_t>(sh.batch) * sh.seq);
  std::uniform_int_distribution<int> len(1, sh.seq);
  std::bernoulli_distribution bit(0.7);
  for (int b = 0; b < sh.batch; ++b) {
    const int n = len(rng);
    for (int j = 0; j < sh.seq; ++j) {
      std::uint8_t v = 0;
      if (b == 1) v = 1;
      else if (b == 2) v = j < n;
      else if (b >= 3) v = bit(rng) ? 1 : 0;
      m[static_cast<std::size_t>(b) * sh.seq + j] = v ? static_cast<std::uint8_t>(v + (j % 3 == 0 ? 6 : 0)) : 0;
    }
  }
  return m;
}

// lse against the reference: -inf exactly where the reference's row has no key (a masked-out
// sequence), relative error (of the undropped softmax's) over the rest. Returns the rows with no key.
inline std::size_t expect_lse_matches(const std::vector<float>& got, const std::vector<double>& want) {
  std::vector<float> fin;
  std::vector<double> want_fin;
  std::size_t empty_rows = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      ++empty_rows;
      EXPECT_EQ(got[i], -std::numeric_limits<float>::infinity()) << "lse of a row with no key, at " << i;
    } else {
      fin.push_back(got[i]);
      want_fin.push_back(want[i]);
    }
  }
  if (!fin.empty()) {
    EXPECT_LE(rel_error(fin, want_fin), 1e-4) << "lse vs CPU (undropped softmax)";
  }
  return empty_rows;
}

}  // namespace cutrain::test
