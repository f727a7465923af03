#include "model/reference_model.h"

#include <algorithm>
#include <cmath>

#include "model/reference_ops.h"
#include "runtime/error.h"

namespace cutrain::model {

using namespace ref_ops;

template <typename T>
ReferenceModel<T>::ReferenceModel(const TransformerParams& params, bool causal) : p_(params), causal_(causal) {
  const ModelDims& d = params.dims();
  moe_.resize(std::size_t(d.layers));
  for (int l = 0; l < d.layers; ++l)
    if (d.moe.is_moe(l)) moe_[std::size_t(l)] = std::make_unique<MoeReference>(d.moe.layer_config(l, d.hidden, d.ffn()));
}

// The MoE layer works in fp64 on its packed parameters (moe_param_layout from the gate's offset).
template <typename T>
void ReferenceModel<T>::moe_forward(const T* P, int l, const T* x, T* y) {
  const ModelDims& d = p_.dims();
  const std::size_t M = std::size_t(B_) * S_, h = std::size_t(d.hidden);
  MoeReference& m = *moe_[std::size_t(l)];
  const MoeConfig c = d.moe.layer_config(l, d.hidden, d.ffn());
  validate(c, int(M), "reference model: block " + std::to_string(l) + "'s MoE layer");
  const std::size_t n = moe_param_layout(c).total;
  const T* w = P + p_.tensor(p_.layer(l).moe).offset;
  std::vector<double> wd(w, w + n), xd(x, x + M * h), yd(M * h);
  const double l_aux = m.forward(wd.data(), xd.data(), int(M), moe_train_, yd.data(), moe_seed_);
  for (std::size_t i = 0; i < yd.size(); ++i) y[i] = T(yd[i]);
  aux_ += l_aux;
  MoeBlockStats st;
  st.layer = l;
  st.l_aux = l_aux;
  st.capacity = m.capacity();
  st.dropped = m.dropped();
  st.min_load = *std::min_element(m.kept_counts().begin(), m.kept_counts().end());
  st.max_load = *std::max_element(m.kept_counts().begin(), m.kept_counts().end());
  moe_stats_.push_back(st);
}

template <typename T>
void ReferenceModel<T>::moe_backward(const T* P, int l, const T* dy, T* dx, T* G, double grad_scale) {
  const ModelDims& d = p_.dims();
  const std::size_t M = std::size_t(B_) * S_, h = std::size_t(d.hidden);
  const std::size_t n = moe_param_layout(d.moe.layer_config(l, d.hidden, d.ffn())).total;
  const std::size_t off = p_.tensor(p_.layer(l).moe).offset;
  std::vector<double> wd(P + off, P + off + n), dyd(dy, dy + M * h), dxd(M * h), gd(n, 0.0);
  moe_[std::size_t(l)]->backward(wd.data(), dyd.data(), d.moe.loss_coeff * grad_scale, dxd.data(), gd.data());
  for (std::size_t i = 0; i < dxd.size(); ++i) dx[i] = T(dxd[i]);
  for (std::size_t i = 0; i < n; ++i) G[off + i] = T(double(G[off + i]) + gd[i]);
}

template <typename T>
std::vector<T> ReferenceModel<T>::embed(const T* P, const std::int32_t* tokens, const std::int32_t* labels, int B,
                                        int S) {
  const int h = p_.dims().hidden, V = p_.dims().vocab, M = B * S;
  B_ = B;
  S_ = S;
  tokens_.assign(tokens, tokens + M);
  if (labels) labels_.assign(labels, labels + M);  // a pipeline's first stage has no head
  const T* emb = P + p_.tensor(p_.embedding()).offset;
  const T* pos = P + p_.tensor(p_.pos_embedding()).offset;
  std::vector<T> x(std::size_t(M) * h);
  for (int m = 0; m < M; ++m) {
    const int tok = tokens[m];
    CUTRAIN_CHECK(tok >= 0 && tok < V, "reference model: token ", tok, " at position ", m, " is outside [0, ", V, ")");
    const T* e = emb + std::size_t(tok) * h;
    const T* pe = pos + std::size_t(m % S) * h;
    for (int c = 0; c < h; ++c) x[std::size_t(m) * h + c] = T(double(e[c]) + double(pe[c]));
  }
  return x;
}

template <typename T>
void ReferenceModel<T>::embed_backward(const std::vector<T>& dx, T* G) const {
  const int h = p_.dims().hidden, M = B_ * S_;
  T* dwte = G + p_.tensor(p_.embedding()).offset;
  T* dwpe = G + p_.tensor(p_.pos_embedding()).offset;
  for (int m = 0; m < M; ++m) {
    T* e = dwte + std::size_t(tokens_[m]) * h;
    T* pe = dwpe + std::size_t(m % S_) * h;
    for (int c = 0; c < h; ++c) {
      const double g = double(dx[std::size_t(m) * h + c]);
      e[c] = T(double(e[c]) + g);
      pe[c] = T(double(pe[c]) + g);
    }
  }
}

template <typename T>
int ReferenceModel<T>::drop_slot(int l) const {
  return drop_ ? drop_->slot(l) : -1;
}

// Rows of the kept tokens of slot `slot`: out[b, j] = x[b, idx[b, j]] ([B, K, hidden] from [B, S, hidden]).
template <typename T>
std::vector<T> ReferenceModel<T>::gather_tokens(const std::vector<T>& x, int slot) const {
  const std::size_t h = std::size_t(p_.dims().hidden), K = std::size_t(drop_->kept);
  const std::int32_t* idx = drop_->slot_indices(slot);
  std::vector<T> out(std::size_t(B_) * K * h);
  for (std::size_t b = 0; b < std::size_t(B_); ++b)
    for (std::size_t j = 0; j < K; ++j)
      std::copy_n(&x[(b * S_ + std::size_t(idx[b * K + j])) * h], h, &out[(b * K + j) * h]);
  return out;
}

// The inverse: x[b, idx[b, j]] = xk[b, j]; the other rows of x stay (the tokens that bypassed).
template <typename T>
void ReferenceModel<T>::scatter_tokens(const std::vector<T>& xk, int slot, std::vector<T>& x) const {
  const std::size_t h = std::size_t(p_.dims().hidden), K = std::size_t(drop_->kept);
  const std::int32_t* idx = drop_->slot_indices(slot);
  for (std::size_t b = 0; b < std::size_t(B_); ++b)
    for (std::size_t j = 0; j < K; ++j)
      std::copy_n(&xk[(b * K + j) * h], h, &x[(b * S_ + std::size_t(idx[b * K + j])) * h]);
}

template <typename T>
double ReferenceModel<T>::forward(const T* P, const std::int32_t* tokens, const std::int32_t* labels, int B, int S) {
  return forward_span(P, LayerSpan{}, tokens, labels, nullptr, B, S, nullptr);
}

template <typename T>
double ReferenceModel<T>::forward_span(const T* P, const LayerSpan& span, const std::int32_t* tokens,
                                       const std::int32_t* labels, const T* x_in, int B, int S, std::vector<T>* x_out) {
  const ModelDims& d = p_.dims();
  CUTRAIN_CHECK(B > 0 && S > 0, "reference model: batch and seq must be positive, got B=", B, " S=", S);
  CUTRAIN_CHECK(S <= d.max_seq, "reference model: seq ", S, " exceeds the position table's ", d.max_seq, " rows");
  const int end = span.end < 0 ? d.layers : span.end;
  CUTRAIN_CHECK(span.first >= 0 && span.first <= end && end <= d.layers, "reference model: blocks [", span.first, ", ",
                end, ") outside the model's ", d.layers);
  CUTRAIN_CHECK((span.embedding || x_in) && (span.head || x_out), "reference model: a span without the embedding "
                "needs its input, one without the head a place for its output");
  span_ = LayerSpan{span.embedding, span.first, end, span.head};
  if (drop_ && drop_->active()) {
    CUTRAIN_CHECK(drop_->batch == B && drop_->seq == S, "reference model: the random-LTD plan is for B=", drop_->batch,
                  " S=", drop_->seq, ", the forward has B=", B, " S=", S);
    for (int l : drop_->layers) {
      CUTRAIN_CHECK(l >= 0 && l < d.layers, "reference model: random-LTD block ", l, " outside the model's ", d.layers);
      CUTRAIN_CHECK(!moe_[std::size_t(l)], "reference model: random-LTD on MoE block ", l, " is not implemented");
    }
  }
  aux_ = 0;
  moe_stats_.clear();
  if (d.arch == Arch::Bert) {
    CUTRAIN_CHECK(span.embedding && span.head && span.first == 0 && end == d.layers && !tp_.active(),
                  "reference model: the bert architecture runs as a whole model (pipeline spans and tensor parallelism "
                  "are not implemented for it)");
    CUTRAIN_CHECK(!drop_ || !drop_->active(), "reference model: random-LTD is not implemented for the bert architecture");
    return forward_bert(P, tokens, labels, B, S);
  }
  if (tp_.active()) return forward_tp(P, tokens, labels, x_in, B, S, x_out);
  if (d.arch == Arch::Gpt2) return forward_gpt2(P, tokens, labels, x_in, B, S, x_out);
  const int h = d.hidden, H = d.heads, D = d.head_dim(), F = d.ffn(), Vr = d.vocab_rows();
  const int M = B * S;
  auto at = [&](int idx) { return P + p_.tensor(idx).offset; };
  std::vector<T> x;
  if (span.embedding) {
    x = embed(P, tokens, labels, B, S);
  } else {
    B_ = B;
    S_ = S;
    x.assign(x_in, x_in + std::size_t(M) * h);
    if (span.head) labels_.assign(labels, labels + M);
  }

  acts_.assign(d.layers, {});
  std::vector<T> tmp(std::size_t(M) * h), xk;
  for (int l = span.first; l < end; ++l) {
    const LayerIndex& L = p_.layer(l);
    LayerActs& a = acts_[l];
    // random-LTD: a dropping block runs on its kept tokens (Sl of them per sequence), gathered
    // from the residual stream and scattered back after; the others bypass it.
    const int slot = drop_slot(l);
    const int Sl = slot < 0 ? S : drop_->kept, Ml = B * Sl;
    if (slot >= 0) xk = gather_tokens(x, slot);
    std::vector<T>& xb = slot < 0 ? x : xk;
    a.x_in = xb;
    a.qkv.resize(std::size_t(Ml) * 3 * h);
    linear_fwd(xb.data(), at(L.in_proj_w), at(L.in_proj_b), a.qkv.data(), Ml, 3 * h, h);
    attention_fwd(a.qkv, a.probs, a.att, B, Sl, H, D, causal_);
    linear_fwd(a.att.data(), at(L.out_proj_w), at(L.out_proj_b), tmp.data(), Ml, h, h);
    a.s1.resize(std::size_t(Ml) * h);
    a.x1.resize(std::size_t(Ml) * h);
    a.mean1.resize(Ml);
    a.rstd1.resize(Ml);
    add_ln_fwd(xb.data(), tmp.data(), at(L.norm1_w), at(L.norm1_b), a.s1.data(), a.x1.data(), a.mean1.data(),
               a.rstd1.data(), Ml, h);
    if (moe_[std::size_t(l)]) {
      moe_forward(P, l, a.x1.data(), tmp.data());
    } else {
      a.f.resize(std::size_t(Ml) * F);
      a.g.resize(std::size_t(Ml) * F);
      linear_fwd(a.x1.data(), at(L.ff0_w), at(L.ff0_b), a.f.data(), Ml, F, h);
      for (std::size_t i = 0; i < a.f.size(); ++i) a.g[i] = T(gelu(double(a.f[i])));
      linear_fwd(a.g.data(), at(L.ff2_w), at(L.ff2_b), tmp.data(), Ml, h, F);
    }
    a.s2.resize(std::size_t(Ml) * h);
    a.mean2.resize(Ml);
    a.rstd2.resize(Ml);
    add_ln_fwd(a.x1.data(), tmp.data(), at(L.norm2_w), at(L.norm2_b), a.s2.data(), xb.data(), a.mean2.data(),
               a.rstd2.data(), Ml, h);
    if (slot >= 0) scatter_tokens(xk, slot, x);
  }
  if (!span.head) {
    *x_out = std::move(x);
    return 0.0;
  }
  x_final_ = x;
  logits_.resize(std::size_t(M) * Vr);
  linear_fwd(x.data(), at(p_.output_w()), at(p_.output_b()), logits_.data(), M, Vr, h);

  return loss_from_logits();
}

// Mean cross-entropy of logits_ against labels_ over the real vocabulary; sets n_valid_.
template <typename T>
double ReferenceModel<T>::loss_from_logits() {
  const int V = p_.dims().vocab, Vr = p_.dims().vocab_rows(), M = B_ * S_;
  const std::int32_t* labels = labels_.data();
  double loss = 0;
  n_valid_ = 0;
  for (int m = 0; m < M; ++m) {
    const int y = labels[m];
    if (y == kIgnore) continue;
    CUTRAIN_CHECK(y >= 0 && y < V, "reference model: label ", y, " at position ", m, " is outside [0, ", V, ")");
    const T* lr = &logits_[std::size_t(m) * Vr];
    double mx = -INFINITY;
    for (int v = 0; v < V; ++v) mx = std::max(mx, double(lr[v]));
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(double(lr[v]) - mx);
    loss += std::log(sum) + mx - double(lr[y]);
    ++n_valid_;
  }
  return n_valid_ ? loss / double(n_valid_) : 0.0;
}

// dlogits = (softmax - onehot) * grad_scale * ce_weight / n_valid over the real vocabulary (padded
// columns 0), plus grad_scale times the distillation's gradient when one is set.
template <typename T>
std::vector<T> ReferenceModel<T>::dlogits(double grad_scale) const {
  const int V = p_.dims().vocab, Vr = p_.dims().vocab_rows(), M = B_ * S_;
  std::vector<T> dlogits(std::size_t(M) * Vr, T(0));
  for (int m = 0; m < M; ++m) {
    const int y = labels_[m];
    if (y == kIgnore) continue;
    const T* lr = &logits_[std::size_t(m) * Vr];
    double mx = -INFINITY;
    for (int v = 0; v < V; ++v) mx = std::max(mx, double(lr[v]));
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(double(lr[v]) - mx);
    const double k = grad_scale * ce_weight_ / double(n_valid_);
    for (int v = 0; v < V; ++v)
      dlogits[std::size_t(m) * Vr + v] = T((std::exp(double(lr[v]) - mx) / sum - (v == y ? 1.0 : 0.0)) * k);
  }
  if (logits_extra_) {  // distillation: its gradient on every row, labelled or not
    CUTRAIN_CHECK(logits_extra_->size() == dlogits.size(), "reference model: the distillation gradient has ",
                  logits_extra_->size(), " elements, the logits ", dlogits.size());
    for (std::size_t i = 0; i < dlogits.size(); ++i)
      dlogits[i] = T(double(dlogits[i]) + grad_scale * double((*logits_extra_)[i]));
  }
  return dlogits;
}

template <typename T>
void ReferenceModel<T>::backward(const T* P, T* G, double grad_scale) {
  const ModelDims& d = p_.dims();
  CUTRAIN_CHECK(B_ > 0, "reference model: backward() before forward()");
  CUTRAIN_CHECK(span_.embedding && span_.head && span_.first == 0 && span_.end == d.layers,
                "reference model: backward() after a forward_span() of part of the model: use backward_span()");
  backward_span(P, G, nullptr, grad_scale, nullptr);
}

template <typename T>
void ReferenceModel<T>::backward_span(const T* P, T* G, const T* dx_out, double grad_scale, std::vector<T>* dx_in) {
  const ModelDims& d = p_.dims();
  CUTRAIN_CHECK(B_ > 0, "reference model: backward() before forward()");
  CUTRAIN_CHECK((span_.head || dx_out) && (span_.embedding || dx_in), "reference model: a span without the head needs "
                "the gradient of its output, one without the embedding a place for the gradient of its input");
  if (d.arch == Arch::Bert) return backward_bert(P, G, grad_scale);
  if (tp_.active()) return backward_tp(P, G, dx_out, grad_scale, dx_in);
  if (d.arch == Arch::Gpt2) return backward_gpt2(P, G, dx_out, grad_scale, dx_in);
  const int B = B_, S = S_, h = d.hidden, H = d.heads, D = d.head_dim(), F = d.ffn(), Vr = d.vocab_rows();
  const int M = B * S;
  auto at = [&](int idx) { return P + p_.tensor(idx).offset; };
  auto gat = [&](int idx) { return G + p_.tensor(idx).offset; };

  std::vector<T> dx(std::size_t(M) * h);
  if (span_.head) {
    const std::vector<T> dlogits = this->dlogits(grad_scale);
    linear_bwd(x_final_.data(), at(p_.output_w()), dlogits.data(), dx.data(), false, gat(p_.output_w()),
               gat(p_.output_b()), M, Vr, h);
  } else {
    dx.assign(dx_out, dx_out + std::size_t(M) * h);
  }

  std::vector<T> ds(std::size_t(M) * h), dg(std::size_t(M) * F), datt(std::size_t(M) * h), dqkv(std::size_t(M) * 3 * h);
  std::vector<T> dxk;
  for (int l = span_.end - 1; l >= span_.first; --l) {
    const LayerIndex& L = p_.layer(l);
    const LayerActs& a = acts_[l];
    // random-LTD: the block's gradient on its kept tokens; the dropped ones pass dx through.
    const int slot = drop_slot(l);
    const int Sl = slot < 0 ? S : drop_->kept, Ml = B * Sl;
    if (slot >= 0) dxk = gather_tokens(dx, slot);
    std::vector<T>& dxb = slot < 0 ? dx : dxk;
    // x_out = LN2(x1 + ff(x1))
    ln_bwd(dxb.data(), a.s2.data(), a.mean2.data(), a.rstd2.data(), at(L.norm2_w), ds.data(), gat(L.norm2_w),
           gat(L.norm2_b), Ml, h);
    if (moe_[std::size_t(l)]) {
      std::vector<T> dmoe(std::size_t(M) * h);
      moe_backward(P, l, ds.data(), dmoe.data(), G, grad_scale);
      for (std::size_t i = 0; i < ds.size(); ++i) ds[i] = T(double(ds[i]) + double(dmoe[i]));
    } else {
      linear_bwd(a.g.data(), at(L.ff2_w), ds.data(), dg.data(), false, gat(L.ff2_w), gat(L.ff2_b), Ml, h, F);
      for (std::size_t i = 0; i < std::size_t(Ml) * F; ++i) dg[i] = T(double(dg[i]) * gelu_grad(double(a.f[i])));
      linear_bwd(a.x1.data(), at(L.ff0_w), dg.data(), ds.data(), true, gat(L.ff0_w), gat(L.ff0_b), Ml, F, h);
    }
    // ds now holds d x1; x1 = LN1(x_in + attn(x_in))
    ln_bwd(ds.data(), a.s1.data(), a.mean1.data(), a.rstd1.data(), at(L.norm1_w), dxb.data(), gat(L.norm1_w),
           gat(L.norm1_b), Ml, h);
    linear_bwd(a.att.data(), at(L.out_proj_w), dxb.data(), datt.data(), false, gat(L.out_proj_w), gat(L.out_proj_b),
               Ml, h, h);
    attention_bwd(a.qkv, a.probs, datt, dqkv, B, Sl, H, D, causal_);
    // dx (= d s1, the residual's share) += dqkv · W_in
    linear_bwd(a.x_in.data(), at(L.in_proj_w), dqkv.data(), dxb.data(), true, gat(L.in_proj_w), gat(L.in_proj_b), Ml,
               3 * h, h);
    if (slot >= 0) scatter_tokens(dxk, slot, dx);
  }
  if (span_.embedding) embed_backward(dx, G);
  else *dx_in = std::move(dx);
}

template <typename T>
void reference_adam_step(T* params, const T* grads, T* m, T* v, std::size_t n, double lr, double beta1, double beta2,
                         double eps, double weight_decay, bool decoupled, int step, double grad_scale) {
  const double bc1 = 1.0 - std::pow(beta1, step), bc2 = 1.0 - std::pow(beta2, step);
  for (std::size_t i = 0; i < n; ++i) {
    double p = double(params[i]);
    double g = double(grads[i]) * grad_scale;
    if (!decoupled) g += weight_decay * p;
    const double mi = beta1 * double(m[i]) + (1 - beta1) * g;
    const double vi = beta2 * double(v[i]) + (1 - beta2) * g * g;
    m[i] = T(mi);
    v[i] = T(vi);
    if (decoupled) p -= lr * weight_decay * p;
    p -= lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    params[i] = T(p);
  }
}

template class ReferenceModel<float>;
template class ReferenceModel<double>;
template void reference_adam_step<float>(float*, const float*, float*, float*, std::size_t, double, double, double,
                                         double, double, bool, int, double);
template void reference_adam_step<double>(double*, const double*, double*, double*, std::size_t, double, double,
                                          double, double, double, bool, int, double);

}  // namespace cutrain::model
