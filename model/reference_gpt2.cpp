// The GPT-2 architecture of the CPU reference model: pre-LN blocks, final LayerNorm, tanh GELU,
// causal attention, the head tied to the token embedding (its gradient adds to the embedding's);
// by span as the seed model (a pipeline stage).
#include "model/reference_model.h"
#include "model/reference_ops.h"
#include "runtime/error.h"

namespace cutrain::model {

using namespace ref_ops;

// span_ is set (by forward_span): the embedding, blocks [span_.first, span_.end), the final
// LayerNorm and the tied head.
template <typename T>
double ReferenceModel<T>::forward_gpt2(const T* P, const std::int32_t* tokens, const std::int32_t* labels,
                                       const T* x_in, int B, int S, std::vector<T>* x_out) {
  const ModelDims& d = p_.dims();
  const int h = d.hidden, H = d.heads, D = d.head_dim(), F = d.ffn(), Vr = d.vocab_rows();
  const int M = B * S;
  auto at = [&](int idx) { return P + p_.tensor(idx).offset; };
  std::vector<T> x;  // the residual stream
  if (span_.embedding) {
    x = embed(P, tokens, labels, B, S);
  } else {
    B_ = B;
    S_ = S;
    x.assign(x_in, x_in + std::size_t(M) * h);
    if (span_.head) labels_.assign(labels, labels + M);
  }
  acts_.assign(d.layers, {});
  std::vector<T> tmp(std::size_t(M) * h), xk;
  for (int l = span_.first; l < span_.end; ++l) {
    const LayerIndex& L = p_.layer(l);
    LayerActs& a = acts_[l];
    // random-LTD: a dropping block on its kept tokens, in ascending position order. Causal
    // attention over them by their order is the causal mask of their original positions restricted
    // to the kept set (j before i in the kept order iff position j < position i); the positions
    // themselves were added at the embedding, so the block needs nothing else of them.
    const int slot = drop_slot(l);
    const int Sl = slot < 0 ? S : drop_->kept, Ml = B * Sl;
    if (slot >= 0) xk = gather_tokens(x, slot);
    std::vector<T>& xb = slot < 0 ? x : xk;
    a.x_in = xb;
    a.x1.resize(std::size_t(Ml) * h);
    a.mean1.resize(Ml);
    a.rstd1.resize(Ml);
    ln_fwd(xb.data(), at(L.norm1_w), at(L.norm1_b), a.x1.data(), a.mean1.data(), a.rstd1.data(), Ml, h);
    a.qkv.resize(std::size_t(Ml) * 3 * h);
    linear_fwd(a.x1.data(), at(L.in_proj_w), at(L.in_proj_b), a.qkv.data(), Ml, 3 * h, h);
    attention_fwd(a.qkv, a.probs, a.att, B, Sl, H, D, true);
    linear_fwd(a.att.data(), at(L.out_proj_w), at(L.out_proj_b), tmp.data(), Ml, h, h);
    a.s1.resize(std::size_t(Ml) * h);
    for (std::size_t i = 0; i < a.s1.size(); ++i) a.s1[i] = T(double(xb[i]) + double(tmp[i]));
    a.s2.resize(std::size_t(Ml) * h);
    a.mean2.resize(Ml);
    a.rstd2.resize(Ml);
    ln_fwd(a.s1.data(), at(L.norm2_w), at(L.norm2_b), a.s2.data(), a.mean2.data(), a.rstd2.data(), Ml, h);
    if (moe_[std::size_t(l)]) {  // the MLP is a MoE layer
      moe_forward(P, l, a.s2.data(), tmp.data());
    } else {
      a.f.resize(std::size_t(Ml) * F);
      a.g.resize(std::size_t(Ml) * F);
      linear_fwd(a.s2.data(), at(L.ff0_w), at(L.ff0_b), a.f.data(), Ml, F, h);
      for (std::size_t i = 0; i < a.f.size(); ++i) a.g[i] = T(gelu_tanh(double(a.f[i])));
      linear_fwd(a.g.data(), at(L.ff2_w), at(L.ff2_b), tmp.data(), Ml, h, F);
    }
    for (std::size_t i = 0; i < xb.size(); ++i) xb[i] = T(double(a.s1[i]) + double(tmp[i]));
    if (slot >= 0) scatter_tokens(xk, slot, x);
  }
  if (!span_.head) {
    *x_out = std::move(x);
    return 0.0;
  }
  x_final_ = x;
  x_lnf_.resize(x.size());
  mean_f_.resize(M);
  rstd_f_.resize(M);
  ln_fwd(x.data(), at(p_.final_norm_w()), at(p_.final_norm_b()), x_lnf_.data(), mean_f_.data(), rstd_f_.data(), M, h);
  logits_.resize(std::size_t(M) * Vr);
  linear_fwd(x_lnf_.data(), at(p_.output_w()), static_cast<const T*>(nullptr), logits_.data(), M, Vr, h);
  return loss_from_logits();
}

template <typename T>
void ReferenceModel<T>::backward_gpt2(const T* P, T* G, const T* dx_out, double grad_scale, std::vector<T>* dx_in) {
  const ModelDims& d = p_.dims();
  const int B = B_, S = S_, h = d.hidden, H = d.heads, D = d.head_dim(), F = d.ffn(), Vr = d.vocab_rows();
  const int M = B * S;
  auto at = [&](int idx) { return P + p_.tensor(idx).offset; };
  auto gat = [&](int idx) { return G + p_.tensor(idx).offset; };

  std::vector<T> dln(std::size_t(M) * h), dx(std::size_t(M) * h), tmp(std::size_t(M) * h);
  if (span_.head) {
    const std::vector<T> dlogits = this->dlogits(grad_scale);
    // The tied head: its weight gradient lands in the token embedding's.
    linear_bwd(x_lnf_.data(), at(p_.output_w()), dlogits.data(), dln.data(), false, gat(p_.output_w()),
               static_cast<T*>(nullptr), M, Vr, h);
    ln_bwd(dln.data(), x_final_.data(), mean_f_.data(), rstd_f_.data(), at(p_.final_norm_w()), dx.data(),
           gat(p_.final_norm_w()), gat(p_.final_norm_b()), M, h);
  } else {
    dx.assign(dx_out, dx_out + std::size_t(M) * h);
  }

  std::vector<T> dg(std::size_t(M) * F), datt(std::size_t(M) * h), dqkv(std::size_t(M) * 3 * h), dxk;
  for (int l = span_.end - 1; l >= span_.first; --l) {
    const LayerIndex& L = p_.layer(l);
    const LayerActs& a = acts_[l];
    const int slot = drop_slot(l);  // random-LTD: the kept tokens' gradient; the dropped ones pass through
    const int Sl = slot < 0 ? S : drop_->kept, Ml = B * Sl;
    if (slot >= 0) dxk = gather_tokens(dx, slot);
    std::vector<T>& dxb = slot < 0 ? dx : dxk;
    const auto add_rows = [&](std::vector<T>& dst, const std::vector<T>& src) {
      for (std::size_t i = 0; i < std::size_t(Ml) * h; ++i) dst[i] = T(double(dst[i]) + double(src[i]));
    };
    // x_out = s1 + mlp(LN2(s1)): dx is d x_out, then d s1.
    if (moe_[std::size_t(l)]) {
      moe_backward(P, l, dxb.data(), dln.data(), G, grad_scale);  // dln = d s2
    } else {
      linear_bwd(a.g.data(), at(L.ff2_w), dxb.data(), dg.data(), false, gat(L.ff2_w), gat(L.ff2_b), Ml, h, F);
      for (std::size_t i = 0; i < std::size_t(Ml) * F; ++i) dg[i] = T(double(dg[i]) * gelu_tanh_grad(double(a.f[i])));
      linear_bwd(a.s2.data(), at(L.ff0_w), dg.data(), dln.data(), false, gat(L.ff0_w), gat(L.ff0_b), Ml, F, h);
    }
    ln_bwd(dln.data(), a.s1.data(), a.mean2.data(), a.rstd2.data(), at(L.norm2_w), tmp.data(), gat(L.norm2_w),
           gat(L.norm2_b), Ml, h);
    add_rows(dxb, tmp);
    // s1 = x_in + attn(LN1(x_in)): dx becomes d x_in.
    linear_bwd(a.att.data(), at(L.out_proj_w), dxb.data(), datt.data(), false, gat(L.out_proj_w), gat(L.out_proj_b),
               Ml, h, h);
    attention_bwd(a.qkv, a.probs, datt, dqkv, B, Sl, H, D, true);
    linear_bwd(a.x1.data(), at(L.in_proj_w), dqkv.data(), dln.data(), false, gat(L.in_proj_w), gat(L.in_proj_b), Ml,
               3 * h, h);
    ln_bwd(dln.data(), a.x_in.data(), a.mean1.data(), a.rstd1.data(), at(L.norm1_w), tmp.data(), gat(L.norm1_w),
           gat(L.norm1_b), Ml, h);
    add_rows(dxb, tmp);
    if (slot >= 0) scatter_tokens(dxk, slot, dx);
  }
  if (span_.embedding) embed_backward(dx, G);
  else *dx_in = std::move(dx);
}

template double ReferenceModel<float>::forward_gpt2(const float*, const std::int32_t*, const std::int32_t*,
                                                    const float*, int, int, std::vector<float>*);
template double ReferenceModel<double>::forward_gpt2(const double*, const std::int32_t*, const std::int32_t*,
                                                     const double*, int, int, std::vector<double>*);
template void ReferenceModel<float>::backward_gpt2(const float*, float*, const float*, double, std::vector<float>*);
template void ReferenceModel<double>::backward_gpt2(const double*, double*, const double*, double,
                                                    std::vector<double>*);

}  // namespace cutrain::model
