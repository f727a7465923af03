// @brief The MoE references of moe_ref.h.
#include "tests/reference/moe_ref.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "kernels/common/counter_uniform.cuh"
#include "kernels/moe_gate.cuh"

namespace cutrain::ref {

int moe_capacity(int tokens, int experts, int k, double capacity_factor, int min_capacity) {
  // DeepSpeed: ceil((tokens / experts) * capacity_factor·k), then max with min_capacity; the Python
  // float tokens / experts times the fp32 tensor of the factor: both operands and the product fp32.
  const float per_expert = static_cast<float>(double(tokens) / experts);
  const float factor = static_cast<float>(capacity_factor * k);
  const float product = per_expert * factor;
  return std::max(static_cast<int>(std::ceil(double(product))), min_capacity);
}

MoeGateRef moe_gate_forward(const std::vector<float>& logits, int T, int E, int k, bool drop_tokens, int capacity,
                            bool rsample, bool second_sampling, std::uint64_t seed, bool rts) {
  auto noisy = [&](int s, int e) { return logits[std::size_t(s) * E + e] + kernels::counter_gumbel(seed, std::uint64_t(s) * E + e); };
  MoeGateRef g;
  g.tokens = T, g.experts = E, g.k = k;
  g.probs.assign(std::size_t(T) * E, 0);
  g.expert.assign(std::size_t(T) * k, 0);
  for (int s = 0; s < T; ++s) {
    const float* l = &logits[std::size_t(s) * E];
    double mx = -std::numeric_limits<double>::infinity();
    for (int e = 0; e < E; ++e) mx = std::max(mx, double(l[e]));
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(double(l[e]) - mx);
    int best = 0;
    for (int e = 0; e < E; ++e) {
      g.probs[std::size_t(s) * E + e] = std::exp(double(l[e]) - mx) / sum;
      const bool better = rsample ? noisy(s, e) > noisy(s, best)
                                  : g.probs[std::size_t(s) * E + e] > g.probs[std::size_t(s) * E + best];
      if (better) best = e;  // the first maximum wins
    }
    g.expert[std::size_t(s) * k] = best;
    if (k == 2) {
      int second = -1;
      for (int e = 0; e < E; ++e) {
        if (e == best) continue;
        const bool better = second < 0 || (second_sampling ? noisy(s, e) > noisy(s, second) : l[e] > l[second]);
        if (better) second = e;
      }
      g.expert[std::size_t(s) * 2 + 1] = second;
    }
  }
  // Positions: route 0 in token order, then route 1 after all of route 0.
  std::vector<int> next(E, 0), total0(E, 0);
  std::vector<int> raw(std::size_t(T) * k);
  for (int r = 0; r < k; ++r)
    for (int s = 0; s < T; ++s) {
      const int e = g.expert[std::size_t(s) * k + r];
      raw[std::size_t(s) * k + r] = next[e]++;
    }
  for (int s = 0; s < T; ++s) ++total0[g.expert[std::size_t(s) * k]];
  g.expert_counts = next;
  g.capacity = drop_tokens ? capacity : *std::max_element(next.begin(), next.end());
  if (rts && k == 1 && drop_tokens) {  // keep each expert's `capacity` largest keys, in token order
    for (int e = 0; e < E; ++e) {
      std::vector<std::pair<std::uint64_t, int>> keyed;
      for (int s = 0; s < T; ++s)
        if (g.expert[s] == e) keyed.push_back({kernels::moe_rts_key(seed, s, e, E), s});
      if (int(keyed.size()) <= g.capacity) continue;
      std::sort(keyed.begin(), keyed.end(), [](auto& a, auto& b) { return a.first > b.first; });
      std::vector<char> keep(T, 0);
      for (int i = 0; i < g.capacity; ++i) keep[keyed[i].second] = 1;
      int pos = 0;
      for (int s = 0; s < T; ++s)
        if (g.expert[s] == e) raw[s] = keep[s] ? pos++ : g.capacity;
    }
  }
  g.position.assign(std::size_t(T) * k, -1);
  g.weight.assign(std::size_t(T) * k, 0);
  for (int s = 0; s < T; ++s) {
    double p[2] = {0, 0};
    for (int r = 0; r < k; ++r) {
      const std::size_t at = std::size_t(s) * k + r;
      if (raw[at] < g.capacity) {
        g.position[at] = raw[at];
        p[r] = g.probs[std::size_t(s) * E + g.expert[at]];
      }
    }
    if (k == 1) {
      g.weight[s] = p[0];
    } else {
      const double d = std::max(p[0] + p[1], double(FLT_EPSILON));
      g.weight[std::size_t(s) * 2] = p[0] / d;
      g.weight[std::size_t(s) * 2 + 1] = p[1] / d;
    }
  }
  g.kept_counts.assign(E, 0);
  g.offsets.assign(E + 1, 0);
  g.ce.assign(E, 0);
  g.dropped = 0;
  double l = 0;
  for (int e = 0; e < E; ++e) {
    g.kept_counts[e] = std::min(next[e], g.capacity);
    g.offsets[e + 1] = g.offsets[e] + g.kept_counts[e];
    g.dropped += next[e] - g.kept_counts[e];
    double me = 0;
    for (int s = 0; s < T; ++s) me += g.probs[std::size_t(s) * E + e];
    me /= T;
    g.ce[e] = double(total0[e]) / T;
    l += me * g.ce[e];
  }
  g.l_aux = E * l;
  return g;
}

std::vector<double> moe_gate_backward(const MoeGateRef& g, const std::vector<double>& dweight, double aux_grad) {
  const int T = g.tokens, E = g.experts, k = g.k;
  std::vector<double> dl(std::size_t(T) * E);
  std::vector<double> dp(E);
  for (int s = 0; s < T; ++s) {
    const double* p = &g.probs[std::size_t(s) * E];
    for (int e = 0; e < E; ++e) dp[e] = aux_grad * E * g.ce[e] / T;
    if (k == 1) {
      if (g.position[s] >= 0) dp[g.expert[s]] += dweight[s];
    } else {
      const std::size_t at = std::size_t(s) * 2;
      const bool k0 = g.position[at] >= 0, k1 = g.position[at + 1] >= 0;
      const double a = k0 ? p[g.expert[at]] : 0, b = k1 ? p[g.expert[at + 1]] : 0, d = a + b;
      double da, db;
      if (d >= FLT_EPSILON) {
        da = (dweight[at] - dweight[at + 1]) * b / (d * d);
        db = (dweight[at + 1] - dweight[at]) * a / (d * d);
      } else {
        da = dweight[at] / FLT_EPSILON;
        db = dweight[at + 1] / FLT_EPSILON;
      }
      if (k0) dp[g.expert[at]] += da;
      if (k1) dp[g.expert[at + 1]] += db;
    }
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int e = 0; e < E; ++e) dl[std::size_t(s) * E + e] = p[e] * (dp[e] - dot);
  }
  return dl;
}

std::int64_t moe_row(const MoeGateRef& g, int s, int r) {
  const std::size_t at = std::size_t(s) * g.k + r;
  return g.position[at] < 0 ? -1 : std::int64_t(g.offsets[g.expert[at]]) + g.position[at];
}

std::vector<double> moe_permute(const std::vector<float>& x, const MoeGateRef& g, int H) {
  std::vector<double> xp(std::size_t(g.offsets[g.experts]) * H, std::nan(""));
  for (int s = 0; s < g.tokens; ++s)
    for (int r = 0; r < g.k; ++r) {
      const std::int64_t row = moe_row(g, s, r);
      if (row < 0) continue;
      for (int h = 0; h < H; ++h) xp[row * H + h] = x[std::size_t(s) * H + h];
    }
  return xp;
}

std::vector<double> moe_permute_backward(const std::vector<float>& dxp, const MoeGateRef& g, int H) {
  std::vector<double> dx(std::size_t(g.tokens) * H, 0);
  for (int s = 0; s < g.tokens; ++s)
    for (int r = 0; r < g.k; ++r) {
      const std::int64_t row = moe_row(g, s, r);
      if (row < 0) continue;
      for (int h = 0; h < H; ++h) dx[std::size_t(s) * H + h] += dxp[row * H + h];
    }
  return dx;
}

std::vector<double> moe_unpermute(const std::vector<float>& yp, const std::vector<float>& weight,
                                  const MoeGateRef& g, int H) {
  std::vector<double> y(std::size_t(g.tokens) * H, 0);
  for (int s = 0; s < g.tokens; ++s)
    for (int r = 0; r < g.k; ++r) {
      const std::int64_t row = moe_row(g, s, r);
      if (row < 0) continue;
      const double w = weight[std::size_t(s) * g.k + r];
      for (int h = 0; h < H; ++h) y[std::size_t(s) * H + h] += w * yp[row * H + h];
    }
  return y;
}

void moe_unpermute_backward(const std::vector<float>& dy, const std::vector<float>& yp,
                            const std::vector<float>& weight, const MoeGateRef& g, int H, std::vector<double>& dyp,
                            std::vector<double>& dweight) {
  dyp.assign(std::size_t(g.offsets[g.experts]) * H, std::nan(""));
  dweight.assign(std::size_t(g.tokens) * g.k, 0);
  for (int s = 0; s < g.tokens; ++s)
    for (int r = 0; r < g.k; ++r) {
      const std::int64_t row = moe_row(g, s, r);
      if (row < 0) continue;
      const double w = weight[std::size_t(s) * g.k + r];
      double dot = 0;
      for (int h = 0; h < H; ++h) {
        dyp[row * H + h] = w * dy[std::size_t(s) * H + h];
        dot += double(dy[std::size_t(s) * H + h]) * yp[row * H + h];
      }
      dweight[std::size_t(s) * g.k + r] = dot;
    }
}

MoeGateRef moe_slot_layout(const MoeGateRef& g, int capacity) {
  MoeGateRef s = g;
  for (int e = 0; e <= g.experts; ++e) s.offsets[std::size_t(e)] = e * capacity;
  return s;
}

std::vector<double> moe_zero_empty_slots(std::vector<double> buf, const std::vector<std::int32_t>& kept, int capacity,
                                         int width) {
  for (std::size_t e = 0; e < kept.size(); ++e)
    for (int j = kept[e]; j < capacity; ++j)
      std::fill_n(buf.begin() + (std::int64_t(e) * capacity + j) * width, width, 0.0);
  return buf;
}

std::vector<double> grouped_gemm_forward(const std::vector<float>& x, const std::vector<float>& w,
                                         const std::vector<int>& rows, int N, int K) {
  std::size_t total = 0;
  for (int r : rows) total += r;
  std::vector<double> y(total * N);
  std::size_t row = 0;
  for (std::size_t g = 0; g < rows.size(); ++g)
    for (int i = 0; i < rows[g]; ++i, ++row)
      for (int n = 0; n < N; ++n) {
        double acc = 0;
        for (int kk = 0; kk < K; ++kk) acc += double(x[row * K + kk]) * w[(g * N + n) * K + kk];
        y[row * N + n] = acc;
      }
  return y;
}

std::vector<double> grouped_gemm_grad_input(const std::vector<float>& dy, const std::vector<float>& w,
                                            const std::vector<int>& rows, int N, int K, double beta,
                                            const std::vector<float>* dx_init) {
  std::size_t total = 0;
  for (int r : rows) total += r;
  std::vector<double> dx(total * K);
  std::size_t row = 0;
  for (std::size_t g = 0; g < rows.size(); ++g)
    for (int i = 0; i < rows[g]; ++i, ++row)
      for (int kk = 0; kk < K; ++kk) {
        double acc = dx_init ? beta * (*dx_init)[row * K + kk] : 0.0;
        for (int n = 0; n < N; ++n) acc += double(dy[row * N + n]) * w[(g * N + n) * K + kk];
        dx[row * K + kk] = acc;
      }
  return dx;
}

std::vector<double> grouped_gemm_grad_weight(const std::vector<float>& dy, const std::vector<float>& x,
                                             const std::vector<int>& rows, int N, int K,
                                             const std::vector<float>* dw_init) {
  std::vector<double> dw(rows.size() * N * K);
  std::size_t row0 = 0;
  for (std::size_t g = 0; g < rows.size(); ++g) {
    for (int n = 0; n < N; ++n)
      for (int kk = 0; kk < K; ++kk) {
        const std::size_t at = (g * N + n) * K + kk;
        double acc = dw_init ? (*dw_init)[at] : 0.0;
        for (int i = 0; i < rows[g]; ++i) acc += double(dy[(row0 + i) * N + n]) * x[(row0 + i) * K + kk];
        dw[at] = acc;
      }
    row0 += rows[g];
  }
  return dw;
}

double moe_jitter_factor(float eps, std::uint64_t seed, std::uint64_t i) {
  return 1.0 - eps + 2.0 * eps * kernels::counter_uniform(seed, i);
}

void moe_residual_mix_forward(const std::vector<float>& y_moe, const std::vector<float>& y_mlp,
                              const std::vector<float>& logits, const float bias[2], int T, int H,
                              std::vector<double>& y, std::vector<double>& coef) {
  y.assign(std::size_t(T) * H, 0);
  coef.assign(std::size_t(T) * 2, 0);
  for (int s = 0; s < T; ++s) {
    const double l0 = double(logits[2 * s]) + bias[0], l1 = double(logits[2 * s + 1]) + bias[1];
    const double c0 = 1 / (1 + std::exp(l1 - l0)), c1 = 1 - c0;
    coef[2 * s] = c0;
    coef[2 * s + 1] = c1;
    for (int h = 0; h < H; ++h) {
      const std::size_t i = std::size_t(s) * H + h;
      y[i] = c0 * y_moe[i] + c1 * y_mlp[i];
    }
  }
}

void moe_residual_mix_backward(const std::vector<float>& dy, const std::vector<float>& y_moe,
                               const std::vector<float>& y_mlp, const std::vector<float>& coef, int T, int H,
                               std::vector<double>& dy_moe, std::vector<double>& dy_mlp,
                               std::vector<double>& dlogits) {
  dy_moe.assign(std::size_t(T) * H, 0);
  dy_mlp.assign(std::size_t(T) * H, 0);
  dlogits.assign(std::size_t(T) * 2, 0);
  for (int s = 0; s < T; ++s) {
    const double c0 = coef[2 * s], c1 = coef[2 * s + 1];
    double d0 = 0, d1 = 0;
    for (int h = 0; h < H; ++h) {
      const std::size_t i = std::size_t(s) * H + h;
      dy_moe[i] = c0 * dy[i];
      dy_mlp[i] = c1 * dy[i];
      d0 += double(dy[i]) * y_moe[i];
      d1 += double(dy[i]) * y_mlp[i];
    }
    const double dot = c0 * d0 + c1 * d1;  // the softmax Jacobian
    dlogits[2 * s] = c0 * (d0 - dot);
    dlogits[2 * s + 1] = c1 * (d1 - dot);
  }
}

}  // namespace cutrain::ref
