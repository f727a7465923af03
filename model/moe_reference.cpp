// @brief The MoE layer's CPU reference (model/moe_reference.h).
#include "model/moe_reference.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "kernels/common/counter_uniform.cuh"
#include "kernels/moe_gate.cuh"
#include "model/reference_ops.h"
#include "runtime/error.h"

namespace cutrain::model {

MoeReference::MoeReference(const MoeConfig& c) : c_(c), layout_(moe_param_layout(c)) { validate(c); }

namespace {
double jitter_factor(std::uint64_t seed, std::size_t i) {
  return 1.0 - kMoeJitterEps + 2.0 * kMoeJitterEps * kernels::counter_uniform(moe_jitter_seed(seed), i);
}
}  // namespace

double MoeReference::forward(const double* params, const double* x, int T, bool train, double* y,
                             std::uint64_t seed) {
  validate(c_, T);
  const int E = c_.experts, H = c_.hidden, F = c_.ffn, k = c_.k;
  T_ = T;
  x_.assign(x, x + std::size_t(T) * H);
  const double* wg = params + layout_.wg;
  const double* w1 = params + layout_.w1;
  const double* w2 = params + layout_.w2;
  jitter_ = train && c_.noisy_gate_policy == MoeNoisyGate::Jitter;
  seed_ = seed;
  xg_ = x_;
  if (jitter_)
    for (std::size_t i = 0; i < xg_.size(); ++i) xg_[i] *= jitter_factor(seed, i);
  logits_.assign(std::size_t(T) * E, 0);
  ref_ops::linear_fwd(xg_.data(), wg, static_cast<const double*>(nullptr), logits_.data(), T, E, H);
  const bool rsample = train && c_.noisy_gate_policy == MoeNoisyGate::RSample;
  const bool second_sampling = c_.top2_2nd_expert_sampling && k == 2;
  auto noisy = [&](int s, int e) {
    return logits_[std::size_t(s) * E + e] + kernels::counter_gumbel(moe_gumbel_seed(seed), std::uint64_t(s) * E + e);
  };
  gap_ = std::numeric_limits<double>::infinity();

  // Softmax and the routes: route 0 the first largest probability, route 1 the first largest
  // other logit.
  probs_.assign(std::size_t(T) * E, 0);
  expert_.assign(std::size_t(T) * k, 0);
  for (int s = 0; s < T; ++s) {
    const double* l = &logits_[std::size_t(s) * E];
    double* p = &probs_[std::size_t(s) * E];
    const double mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
    for (int e = 0; e < E; ++e) p[e] = std::exp(l[e] - mx) / sum;
    // The keys each route's arg-max reads (route 0: p, i.e. the logits' order, or logit + Gumbel).
    auto pick = [&](bool use_noise, int skip) {
      auto sel = [&](int e) { return use_noise ? noisy(s, e) : (skip < 0 ? p[e] : l[e]); };
      auto margin = [&](int e) { return use_noise ? noisy(s, e) : l[e]; };  // p's order in logit units
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (e != skip && (best < 0 || sel(e) > sel(best))) best = e;  // the first maximum wins
      double next = -std::numeric_limits<double>::infinity();
      for (int e = 0; e < E; ++e)
        if (e != skip && e != best) next = std::max(next, margin(e));
      gap_ = std::min(gap_, margin(best) - next);
      return best;
    };
    const int best = pick(rsample, -1);
    expert_[std::size_t(s) * k] = best;
    if (k == 2) expert_[std::size_t(s) * 2 + 1] = pick(second_sampling, best);
  }
  // Positions in token order, route 1 after all of route 0; capacity; dropping.
  counts_.assign(E, 0);
  std::vector<int> raw(std::size_t(T) * k), first(E, 0);
  for (int r = 0; r < k; ++r)
    for (int s = 0; s < T; ++s) raw[std::size_t(s) * k + r] = counts_[expert_[std::size_t(s) * k + r]]++;
  for (int s = 0; s < T; ++s) ++first[expert_[std::size_t(s) * k]];
  capacity_ = c_.drop_tokens ? moe_layer_capacity(c_, T, train) : *std::max_element(counts_.begin(), counts_.end());
  if (c_.use_rts && c_.drop_tokens) {  // top-1: each expert over capacity keeps its largest keys, in token order
    for (int e = 0; e < E; ++e) {
      if (counts_[e] <= capacity_) continue;
      std::vector<std::pair<std::uint64_t, int>> keyed;
      for (int s = 0; s < T; ++s)
        if (expert_[s] == e) keyed.push_back({kernels::moe_rts_key(moe_gumbel_seed(seed), s, e, E), s});
      std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      std::vector<char> keep(T, 0);
      for (int i = 0; i < capacity_; ++i) keep[keyed[i].second] = 1;
      int pos = 0;
      for (int s = 0; s < T; ++s)
        if (expert_[s] == e) raw[s] = keep[s] ? pos++ : capacity_;
    }
  }
  kept_.assign(E, 0);
  offsets_.assign(E + 1, 0);
  dropped_ = 0;
  ce_.assign(E, 0);
  double l_aux = 0;
  for (int e = 0; e < E; ++e) {
    kept_[e] = std::min(counts_[e], capacity_);
    offsets_[e + 1] = offsets_[e] + kept_[e];
    dropped_ += counts_[e] - kept_[e];
    double me = 0;
    for (int s = 0; s < T; ++s) me += probs_[std::size_t(s) * E + e];
    ce_[e] = double(first[e]) / T;
    l_aux += me / T * ce_[e];
  }
  l_aux *= E;
  const int R = offsets_[E];
  position_.assign(std::size_t(T) * k, -1);
  row_of_.assign(std::size_t(T) * k, -1);
  weight_.assign(std::size_t(T) * k, 0);
  row_token_.assign(R, 0);
  row_expert_.assign(R, 0);
  for (int s = 0; s < T; ++s) {
    double p[2] = {0, 0};
    for (int r = 0; r < k; ++r) {
      const std::size_t at = std::size_t(s) * k + r;
      if (raw[at] >= capacity_) continue;
      const int e = expert_[at];
      position_[at] = raw[at];
      row_of_[at] = offsets_[e] + raw[at];
      row_token_[row_of_[at]] = s;
      row_expert_[row_of_[at]] = e;
      p[r] = probs_[std::size_t(s) * E + e];
    }
    if (k == 1) {
      weight_[s] = p[0];
    } else {
      const double d = std::max(p[0] + p[1], double(FLT_EPSILON));
      weight_[std::size_t(s) * 2] = p[0] / d;
      weight_[std::size_t(s) * 2 + 1] = p[1] / d;
    }
  }
  // Experts, row by row (here, or on the ranks holding them).
  if (exchanged()) {
    experts_forward_exchanged(params, x);
  } else {
    a1_.assign(std::size_t(R) * F, 0);
    h_.assign(std::size_t(R) * F, 0);
    o_.assign(std::size_t(R) * H, 0);
    for (int row = 0; row < R; ++row) {
      const int e = row_expert_[row];
      const double* xr = x + std::size_t(row_token_[row]) * H;
      ref_ops::linear_fwd(xr, w1 + std::size_t(e) * F * H, static_cast<const double*>(nullptr),
                          &a1_[std::size_t(row) * F], 1, F, H);
      for (int f = 0; f < F; ++f) h_[std::size_t(row) * F + f] = ref_ops::gelu(a1_[std::size_t(row) * F + f]);
      ref_ops::linear_fwd(&h_[std::size_t(row) * F], w2 + std::size_t(e) * H * F, static_cast<const double*>(nullptr),
                          &o_[std::size_t(row) * H], 1, H, F);
    }
  }
  std::fill(y, y + std::size_t(T) * H, 0.0);
  for (int s = 0; s < T; ++s)
    for (int r = 0; r < k; ++r) {
      const std::int64_t row = row_of_[std::size_t(s) * k + r];
      if (row < 0) continue;
      for (int j = 0; j < H; ++j) y[std::size_t(s) * H + j] += weight_[std::size_t(s) * k + r] * o_[row * H + j];
    }
  if (c_.use_residual) {  // y = c0·moe + c1·mlp, c = softmax(x·Wcᵀ + bc)
    ym_.assign(y, y + std::size_t(T) * H);
    ar_.assign(std::size_t(T) * F, 0);
    hr_.assign(std::size_t(T) * F, 0);
    yr_.assign(std::size_t(T) * H, 0);
    coef_.assign(std::size_t(T) * 2, 0);
    ref_ops::linear_fwd(x, params + layout_.r1, static_cast<const double*>(nullptr), ar_.data(), T, F, H);
    for (std::size_t i = 0; i < hr_.size(); ++i) hr_[i] = ref_ops::gelu(ar_[i]);
    ref_ops::linear_fwd(hr_.data(), params + layout_.r2, static_cast<const double*>(nullptr), yr_.data(), T, H, F);
    ref_ops::linear_fwd(x, params + layout_.cw, params + layout_.cb, coef_.data(), T, 2, H);
    for (int s = 0; s < T; ++s) {
      const double c0 = 1 / (1 + std::exp(coef_[2 * s + 1] - coef_[2 * s]));
      coef_[2 * s] = c0;
      coef_[2 * s + 1] = 1 - c0;
      for (int j = 0; j < H; ++j) {
        const std::size_t i = std::size_t(s) * H + j;
        y[i] = c0 * ym_[i] + (1 - c0) * yr_[i];
      }
    }
  }
  return l_aux;
}

void MoeReference::backward(const double* params, const double* dy_in, double aux_grad, double* dx,
                            double* dparams) {
  CUTRAIN_CHECK(T_ > 0, "MoeReference::backward: call forward first");
  const int T = T_, E = c_.experts, H = c_.hidden, F = c_.ffn, k = c_.k, R = offsets_[E];
  // With the residual mix: the MoE branch sees c0·dy; the MLP and the coefficients come last.
  std::vector<double> dy_moe;
  const double* dy = dy_in;
  if (c_.use_residual) {
    dy_moe.resize(std::size_t(T) * H);
    for (std::size_t i = 0; i < dy_moe.size(); ++i) dy_moe[i] = coef_[2 * (i / H)] * dy_in[i];
    dy = dy_moe.data();
  }
  const double* wg = params + layout_.wg;
  const double* w1 = params + layout_.w1;
  const double* w2 = params + layout_.w2;
  std::fill(dx, dx + std::size_t(T) * H, 0.0);
  // Combine: the weights' gradient and each row's output gradient.
  std::vector<double> dweight(std::size_t(T) * k, 0), dout(std::size_t(R) * H, 0);
  for (int s = 0; s < T; ++s)
    for (int r = 0; r < k; ++r) {
      const std::int64_t row = row_of_[std::size_t(s) * k + r];
      if (row < 0) continue;
      double dot = 0;
      for (int j = 0; j < H; ++j) {
        dot += dy[std::size_t(s) * H + j] * o_[row * H + j];
        dout[row * H + j] = weight_[std::size_t(s) * k + r] * dy[std::size_t(s) * H + j];
      }
      dweight[std::size_t(s) * k + r] = dot;
    }
  // Experts backward, row by row (here, or on the ranks holding them).
  std::vector<double> da(F);
  if (exchanged()) experts_backward_exchanged(params, dout, dx, dparams);
  for (int row = 0; row < R && !exchanged(); ++row) {
    const int e = row_expert_[row], s = row_token_[row];
    ref_ops::linear_bwd(&h_[std::size_t(row) * F], w2 + std::size_t(e) * H * F, &dout[std::size_t(row) * H],
                        da.data(), false, dparams + layout_.w2 + std::size_t(e) * H * F,
                        static_cast<double*>(nullptr), 1, H, F);
    for (int f = 0; f < F; ++f) da[f] *= ref_ops::gelu_grad(a1_[std::size_t(row) * F + f]);
    ref_ops::linear_bwd(&x_[std::size_t(s) * H], w1 + std::size_t(e) * F * H, da.data(), dx + std::size_t(s) * H,
                        true, dparams + layout_.w1 + std::size_t(e) * F * H, static_cast<double*>(nullptr), 1, F, H);
  }
  // Gate: the normalization of the weights, the aux loss's constant ce, the softmax.
  std::vector<double> dlogits(std::size_t(T) * E), dp(E);
  for (int s = 0; s < T; ++s) {
    const double* p = &probs_[std::size_t(s) * E];
    for (int e = 0; e < E; ++e) dp[e] = aux_grad * E * ce_[e] / T;
    if (k == 1) {
      if (row_of_[s] >= 0) dp[expert_[s]] += dweight[s];
    } else {
      const std::size_t at = std::size_t(s) * 2;
      const bool k0 = row_of_[at] >= 0, k1 = row_of_[at + 1] >= 0;
      const double a = k0 ? p[expert_[at]] : 0, b = k1 ? p[expert_[at + 1]] : 0, d = a + b;
      const double dd = d >= FLT_EPSILON ? d * d : 0;
      const double da0 = d >= FLT_EPSILON ? (dweight[at] - dweight[at + 1]) * b / dd : dweight[at] / FLT_EPSILON;
      const double db0 = d >= FLT_EPSILON ? (dweight[at + 1] - dweight[at]) * a / dd : dweight[at + 1] / FLT_EPSILON;
      if (k0) dp[expert_[at]] += da0;
      if (k1) dp[expert_[at + 1]] += db0;
    }
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int e = 0; e < E; ++e) dlogits[std::size_t(s) * E + e] = p[e] * (dp[e] - dot);
  }
  if (jitter_) {  // logits = (x ⊙ u)·Wgᵀ: dWg from the jittered input, dx through u
    std::vector<double> dxg(std::size_t(T) * H, 0.0);
    ref_ops::linear_bwd(xg_.data(), wg, dlogits.data(), dxg.data(), false, dparams + layout_.wg,
                        static_cast<double*>(nullptr), T, E, H);
    for (std::size_t i = 0; i < dxg.size(); ++i) dx[i] += dxg[i] * jitter_factor(seed_, i);
  } else {
    ref_ops::linear_bwd(x_.data(), wg, dlogits.data(), dx, true, dparams + layout_.wg, static_cast<double*>(nullptr),
                        T, E, H);
  }
  if (!c_.use_residual) return;
  std::vector<double> dyr(std::size_t(T) * H), dc(std::size_t(T) * 2), dar(std::size_t(T) * F, 0);
  for (int s = 0; s < T; ++s) {
    const double c0 = coef_[2 * s], c1 = coef_[2 * s + 1];
    double d0 = 0, d1 = 0;
    for (int j = 0; j < H; ++j) {
      const std::size_t i = std::size_t(s) * H + j;
      dyr[i] = c1 * dy_in[i];
      d0 += dy_in[i] * ym_[i];
      d1 += dy_in[i] * yr_[i];
    }
    const double dot = c0 * d0 + c1 * d1;
    dc[2 * s] = c0 * (d0 - dot);
    dc[2 * s + 1] = c1 * (d1 - dot);
  }
  ref_ops::linear_bwd(x_.data(), params + layout_.cw, dc.data(), dx, true, dparams + layout_.cw, dparams + layout_.cb,
                      T, 2, H);
  ref_ops::linear_bwd(hr_.data(), params + layout_.r2, dyr.data(), dar.data(), false, dparams + layout_.r2,
                      static_cast<double*>(nullptr), T, H, F);
  for (std::size_t i = 0; i < dar.size(); ++i) dar[i] *= ref_ops::gelu_grad(ar_[i]);
  ref_ops::linear_bwd(x_.data(), params + layout_.r1, dar.data(), dx, true, dparams + layout_.r1,
                      static_cast<double*>(nullptr), T, F, H);
}

// The dispatch buffer [E, C, H] holds row (e, pos) of this rank's kept routes at slot e·C + pos;
// member j gets experts [j·E/ep, (j+1)·E/ep), i.e. the buffer's j-th chunk, and returns their
// outputs in the same slots. Each slot's expert math is the single process's row math.
void MoeReference::experts_forward_exchanged(const double* params, const double* x) {
  const int E = c_.experts, H = c_.hidden, F = c_.ffn, P = ex_->size(), El = E / P, R = offsets_[E];
  CUTRAIN_CHECK(E % P == 0, "MoE layer: ep_size ", P, " does not divide num_experts ", E);
  const int C = slots_ = std::max(ex_->max(std::max(capacity_, 1)), 1);
  const std::size_t chunk = std::size_t(El) * C * H;
  std::vector<double> send(std::size_t(E) * C * H, 0.0), counts(E), got(std::size_t(P) * El);
  for (int row = 0; row < R; ++row) {
    const int e = row_expert_[row], pos = row - offsets_[e];
    std::copy_n(x + std::size_t(row_token_[row]) * H, H, &send[(std::size_t(e) * C + pos) * H]);
  }
  for (int e = 0; e < E; ++e) counts[e] = kept_[e];
  ex_in_.assign(send.size(), 0.0);
  ex_->all_to_all(send.data(), ex_in_.data(), chunk);
  ex_->all_to_all(counts.data(), got.data(), std::size_t(El));
  ex_count_.assign(got.size(), 0);
  for (std::size_t i = 0; i < got.size(); ++i) ex_count_[i] = int(got[i]);
  // This rank's experts on every member's slots: [P][El][C] rows.
  const double* w1 = params + layout_.w1;
  const double* w2 = params + layout_.w2;
  ex_a1_.assign(std::size_t(P) * El * C * F, 0.0);
  std::vector<double> out(send.size(), 0.0), h(F);
  for (int src = 0; src < P; ++src)
    for (int le = 0; le < El; ++le) {
      const int e = moe_first_expert(E, P, ex_->rank()) + le;
      for (int pos = 0; pos < ex_count_[std::size_t(src) * El + le]; ++pos) {
        const std::size_t slot = (std::size_t(src) * El + le) * C + pos;
        double* a1 = &ex_a1_[slot * F];
        ref_ops::linear_fwd(&ex_in_[slot * H], w1 + std::size_t(e) * F * H, static_cast<const double*>(nullptr), a1, 1,
                            F, H);
        for (int f = 0; f < F; ++f) h[f] = ref_ops::gelu(a1[f]);
        ref_ops::linear_fwd(h.data(), w2 + std::size_t(e) * H * F, static_cast<const double*>(nullptr), &out[slot * H],
                            1, H, F);
      }
    }
  std::vector<double> back(send.size());
  ex_->all_to_all(out.data(), back.data(), chunk);
  o_.assign(std::size_t(R) * H, 0);
  for (int row = 0; row < R; ++row) {
    const int e = row_expert_[row], pos = row - offsets_[e];
    std::copy_n(&back[(std::size_t(e) * C + pos) * H], H, &o_[std::size_t(row) * H]);
  }
}

// The mirror: the rows' output gradients to the experts' ranks, each expert's backward on its
// slots (its weights' gradients from every member's tokens), the slots' input gradients back into
// dx, row by row in the single process's order.
void MoeReference::experts_backward_exchanged(const double* params, const std::vector<double>& dout, double* dx,
                                              double* dparams) {
  const int E = c_.experts, H = c_.hidden, F = c_.ffn, P = ex_->size(), El = E / P, R = offsets_[E], C = slots_;
  const std::size_t chunk = std::size_t(El) * C * H;
  std::vector<double> send(std::size_t(E) * C * H, 0.0), dslot(send.size()), dxslot(send.size(), 0.0);
  for (int row = 0; row < R; ++row) {
    const int e = row_expert_[row], pos = row - offsets_[e];
    std::copy_n(&dout[std::size_t(row) * H], H, &send[(std::size_t(e) * C + pos) * H]);
  }
  ex_->all_to_all(send.data(), dslot.data(), chunk);
  const double* w1 = params + layout_.w1;
  const double* w2 = params + layout_.w2;
  std::vector<double> h(F), da(F);
  for (int src = 0; src < P; ++src)
    for (int le = 0; le < El; ++le) {
      const int e = moe_first_expert(E, P, ex_->rank()) + le;
      for (int pos = 0; pos < ex_count_[std::size_t(src) * El + le]; ++pos) {
        const std::size_t slot = (std::size_t(src) * El + le) * C + pos;
        const double* a1 = &ex_a1_[slot * F];
        for (int f = 0; f < F; ++f) h[f] = ref_ops::gelu(a1[f]);
        ref_ops::linear_bwd(h.data(), w2 + std::size_t(e) * H * F, &dslot[slot * H], da.data(), false,
                            dparams + layout_.w2 + std::size_t(e) * H * F, static_cast<double*>(nullptr), 1, H, F);
        for (int f = 0; f < F; ++f) da[f] *= ref_ops::gelu_grad(a1[f]);
        ref_ops::linear_bwd(&ex_in_[slot * H], w1 + std::size_t(e) * F * H, da.data(), &dxslot[slot * H], true,
                            dparams + layout_.w1 + std::size_t(e) * F * H, static_cast<double*>(nullptr), 1, F, H);
      }
    }
  std::vector<double> back(send.size());
  ex_->all_to_all(dxslot.data(), back.data(), chunk);
  for (int row = 0; row < R; ++row) {
    const int e = row_expert_[row], pos = row - offsets_[e];
    const double* g = &back[(std::size_t(e) * C + pos) * H];
    double* d = dx + std::size_t(row_token_[row]) * H;
    for (int j = 0; j < H; ++j) d[j] += g[j];
  }
}

}  // namespace cutrain::model
