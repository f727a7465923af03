// BERT's encoder in the CPU reference model (docs/bert.md): word + position embeddings, their
// LayerNorm and dropout; Pre-LN or Post-LN blocks with bidirectional attention over the
// non-padding keys, dropout on the attention probabilities and on each sub-layer's output; the
// masked-LM head (dense, exact GELU, LayerNorm, decoder tied to the word embedding, its own bias).
// Dropout masks are Philox's (kernels/common/philox.cuh), keyed as the GPU model keys them, so the
// two draw the same masks and finite differences see a fixed function at a fixed key.
#include "kernels/common/philox.cuh"
#include "kernels/dropout.cuh"
#include "model/reference_model.h"
#include "model/reference_ops.h"
#include "runtime/error.h"

namespace cutrain::model {

using namespace ref_ops;

namespace {

// Dropout's multiplier of each of n elements of the flat tensor at `key` (kernels/dropout.cuh's
// mask: element e kept where dropout_bits(key, e / 4).w[e % 4] >= dropout_threshold(p)): the fp32
// scale 1/(1 - p) where kept, 0 where dropped.
std::vector<double> dropout_multipliers(const kernels::DropoutKey& key, float p, std::size_t n) {
  const std::uint32_t threshold = kernels::dropout_threshold(p);
  const double scale = double(kernels::dropout_scale(p));
  std::vector<double> m(n);
  for (std::size_t g = 0; g * 4 < n; ++g) {
    const kernels::PhiloxWords r = kernels::dropout_bits(key, g);
    for (std::size_t k = 0; k < 4 && g * 4 + k < n; ++k) m[g * 4 + k] = kernels::dropout_keep(r.w[k], threshold) ? scale : 0.0;
  }
  return m;
}

}  // namespace

template <typename T>
std::vector<double> ReferenceModel<T>::bert_drop(std::uint32_t layer, float p, std::size_t n) const {
  if (!train_ || p <= 0.f) return {};
  return dropout_multipliers(kernels::DropoutKey{drop_seed_, drop_step_, layer, nullptr}, p, n);
}

namespace {

// x[i] *= m[i] (m empty: no dropout).
template <typename T>
void apply_drop(std::vector<T>& x, const std::vector<double>& m) {
  if (m.empty()) return;
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = T(double(x[i]) * m[i]);
}

// out[i] = res[i] + t[i] * m[i].
template <typename T>
void residual_drop(const std::vector<T>& res, const std::vector<T>& t, const std::vector<double>& m, std::vector<T>& out) {
  out.resize(res.size());
  for (std::size_t i = 0; i < res.size(); ++i) out[i] = T(double(res[i]) + double(t[i]) * (m.empty() ? 1.0 : m[i]));
}

}  // namespace

// acts_[l] holds, Pre-LN: x_in, x1 = LN_attn(x_in), qkv, probs, att, s1 = a = x_in + drop(attn
// out), s2 = LN_out(a), f, g; Post-LN: x_in, qkv, probs, att, s1 = x_in + drop(attn out), x1 = a =
// LN_attn(s1), f, g, s2 = a + drop(ffn out) (the block's output is LN_out(s2)).
template <typename T>
double ReferenceModel<T>::forward_bert(const T* P, const std::int32_t* tokens, const std::int32_t* labels, int B,
                                       int S) {
  const ModelDims& d = p_.dims();
  const BertConfig& bc = d.bert;
  const int h = d.hidden, H = d.heads, D = d.head_dim(), F = d.ffn(), Vr = d.vocab_rows(), L = d.layers;
  const int M = B * S;
  const double eps = bc.layer_norm_eps;
  const std::size_t Mh = std::size_t(M) * h;
  auto at = [&](int idx) { return P + p_.tensor(idx).offset; };
  emb_sum_ = embed(P, tokens, labels, B, S);
  key_mask_.clear();
  if (bc.pad_id >= 0) {
    key_mask_.resize(std::size_t(M));
    for (int m = 0; m < M; ++m) key_mask_[std::size_t(m)] = tokens[m] != bc.pad_id;
  }
  const std::uint8_t* km = key_mask_.empty() ? nullptr : key_mask_.data();
  std::vector<T> x(Mh);
  mean_e_.resize(M);
  rstd_e_.resize(M);
  ln_fwd(emb_sum_.data(), at(p_.embedding_norm_w()), at(p_.embedding_norm_b()), x.data(), mean_e_.data(),
         rstd_e_.data(), M, h, eps);
  apply_drop(x, bert_drop(bert_embedding_dropout_layer(L, drop_micro_), bc.hidden_dropout_ratio, Mh));

  acts_.assign(std::size_t(L), {});
  std::vector<T> t(Mh);
  for (int l = 0; l < L; ++l) {
    const LayerIndex& Li = p_.layer(l);
    LayerActs& a = acts_[std::size_t(l)];
    const auto m_attn = bert_drop(bert_dropout_layer(L, drop_micro_, l, BertDropoutSite::Attention),
                                  bc.attn_dropout_ratio, std::size_t(B) * H * S * S);
    const auto m1 = bert_drop(bert_dropout_layer(L, drop_micro_, l, BertDropoutSite::AttentionOutput),
                              bc.hidden_dropout_ratio, Mh);
    const auto m2 = bert_drop(bert_dropout_layer(L, drop_micro_, l, BertDropoutSite::Output), bc.hidden_dropout_ratio, Mh);
    a.x_in = x;
    a.mean1.resize(M);
    a.rstd1.resize(M);
    a.mean2.resize(M);
    a.rstd2.resize(M);
    a.qkv.resize(std::size_t(M) * 3 * h);
    a.f.resize(std::size_t(M) * F);
    a.g.resize(std::size_t(M) * F);
    a.x1.resize(Mh);
    a.s2.resize(Mh);
    // The attention sub-layer on `in` (x1 for Pre-LN, x_in for Post-LN): s1 = x_in + drop(proj).
    auto attention = [&](const std::vector<T>& in) {
      linear_fwd(in.data(), at(Li.in_proj_w), at(Li.in_proj_b), a.qkv.data(), M, 3 * h, h);
      attention_fwd(a.qkv, a.probs, a.att, B, S, H, D, false, km, m_attn.empty() ? nullptr : m_attn.data());
      linear_fwd(a.att.data(), at(Li.out_proj_w), at(Li.out_proj_b), t.data(), M, h, h);
      residual_drop(a.x_in, t, m1, a.s1);
    };
    // The FFN on `in`: t = W2 gelu(W1 in + b1) + b2.
    auto ffn = [&](const std::vector<T>& in) {
      linear_fwd(in.data(), at(Li.ff0_w), at(Li.ff0_b), a.f.data(), M, F, h);
      for (std::size_t i = 0; i < a.f.size(); ++i) a.g[i] = T(gelu(double(a.f[i])));
      linear_fwd(a.g.data(), at(Li.ff2_w), at(Li.ff2_b), t.data(), M, h, F);
    };
    if (bc.pre_layer_norm) {
      ln_fwd(x.data(), at(Li.norm1_w), at(Li.norm1_b), a.x1.data(), a.mean1.data(), a.rstd1.data(), M, h, eps);
      attention(a.x1);
      ln_fwd(a.s1.data(), at(Li.norm2_w), at(Li.norm2_b), a.s2.data(), a.mean2.data(), a.rstd2.data(), M, h, eps);
      ffn(a.s2);
      residual_drop(a.s1, t, m2, x);
    } else {
      attention(a.x_in);
      ln_fwd(a.s1.data(), at(Li.norm1_w), at(Li.norm1_b), a.x1.data(), a.mean1.data(), a.rstd1.data(), M, h, eps);
      ffn(a.x1);
      residual_drop(a.x1, t, m2, a.s2);
      ln_fwd(a.s2.data(), at(Li.norm2_w), at(Li.norm2_b), x.data(), a.mean2.data(), a.rstd2.data(), M, h, eps);
    }
  }
  x_final_ = x;
  if (bc.pre_layer_norm) {
    x_lnf_.resize(Mh);
    mean_f_.resize(M);
    rstd_f_.resize(M);
    ln_fwd(x.data(), at(p_.final_norm_w()), at(p_.final_norm_b()), x_lnf_.data(), mean_f_.data(), rstd_f_.data(), M, h,
           eps);
  } else {
    x_lnf_ = x;
  }
  head_d_.resize(Mh);
  head_g_.resize(Mh);
  head_n_.resize(Mh);
  mean_h_.resize(M);
  rstd_h_.resize(M);
  linear_fwd(x_lnf_.data(), at(p_.head_dense_w()), at(p_.head_dense_b()), head_d_.data(), M, h, h);
  for (std::size_t i = 0; i < Mh; ++i) head_g_[i] = T(gelu(double(head_d_[i])));
  ln_fwd(head_g_.data(), at(p_.head_norm_w()), at(p_.head_norm_b()), head_n_.data(), mean_h_.data(), rstd_h_.data(), M,
         h, eps);
  logits_.resize(std::size_t(M) * Vr);
  linear_fwd(head_n_.data(), at(p_.output_w()), at(p_.output_b()), logits_.data(), M, Vr, h);
  return loss_from_logits();
}

template <typename T>
void ReferenceModel<T>::backward_bert(const T* P, T* G, double grad_scale) {
  const ModelDims& d = p_.dims();
  const BertConfig& bc = d.bert;
  const int B = B_, S = S_, h = d.hidden, H = d.heads, D = d.head_dim(), F = d.ffn(), Vr = d.vocab_rows(), L = d.layers;
  const int M = B * S;
  const std::size_t Mh = std::size_t(M) * h;
  auto at = [&](int idx) { return P + p_.tensor(idx).offset; };
  auto gat = [&](int idx) { return G + p_.tensor(idx).offset; };
  auto add = [](std::vector<T>& dst, const std::vector<T>& src) {
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = T(double(dst[i]) + double(src[i]));
  };

  // The head: logits = LN_h(gelu(dense(x_f))) · wteᵀ + bias; the tied weight's gradient lands in wte's.
  std::vector<T> dn(Mh), dg(Mh), dx(Mh), tmp(Mh);
  {
    const std::vector<T> dlogits = this->dlogits(grad_scale);
    linear_bwd(head_n_.data(), at(p_.output_w()), dlogits.data(), dn.data(), false, gat(p_.output_w()),
               gat(p_.output_b()), M, Vr, h);
    ln_bwd(dn.data(), head_g_.data(), mean_h_.data(), rstd_h_.data(), at(p_.head_norm_w()), dg.data(),
           gat(p_.head_norm_w()), gat(p_.head_norm_b()), M, h);
    for (std::size_t i = 0; i < Mh; ++i) dg[i] = T(double(dg[i]) * gelu_grad(double(head_d_[i])));
    linear_bwd(x_lnf_.data(), at(p_.head_dense_w()), dg.data(), dn.data(), false, gat(p_.head_dense_w()),
               gat(p_.head_dense_b()), M, h, h);
    if (bc.pre_layer_norm)
      ln_bwd(dn.data(), x_final_.data(), mean_f_.data(), rstd_f_.data(), at(p_.final_norm_w()), dx.data(),
             gat(p_.final_norm_w()), gat(p_.final_norm_b()), M, h);
    else
      dx = dn;
  }

  // The key mask acts through the stored probabilities (0 at the masked keys).
  std::vector<T> du(Mh), dff(std::size_t(M) * F), da(Mh), dt(Mh), datt(Mh), dqkv(std::size_t(M) * 3 * h);
  auto times = [](std::vector<T>& out, const std::vector<T>& in, const std::vector<double>& m) {
    out = in;
    apply_drop(out, m);
  };
  for (int l = L - 1; l >= 0; --l) {
    const LayerIndex& Li = p_.layer(l);
    const LayerActs& a = acts_[std::size_t(l)];
    const auto m_attn = bert_drop(bert_dropout_layer(L, drop_micro_, l, BertDropoutSite::Attention),
                                  bc.attn_dropout_ratio, std::size_t(B) * H * S * S);
    const auto m1 = bert_drop(bert_dropout_layer(L, drop_micro_, l, BertDropoutSite::AttentionOutput),
                              bc.hidden_dropout_ratio, Mh);
    const auto m2 = bert_drop(bert_dropout_layer(L, drop_micro_, l, BertDropoutSite::Output), bc.hidden_dropout_ratio, Mh);
    // d of the FFN's output (du, from the gradient of its residual sum) back to its input `in`:
    // written into `din`.
    auto ffn_bwd = [&](const std::vector<T>& in, std::vector<T>& din) {
      linear_bwd(a.g.data(), at(Li.ff2_w), du.data(), dff.data(), false, gat(Li.ff2_w), gat(Li.ff2_b), M, h, F);
      for (std::size_t i = 0; i < dff.size(); ++i) dff[i] = T(double(dff[i]) * gelu_grad(double(a.f[i])));
      linear_bwd(in.data(), at(Li.ff0_w), dff.data(), din.data(), false, gat(Li.ff0_w), gat(Li.ff0_b), M, F, h);
    };
    // d of the attention's projected output (dt) back to its input `in`: written into `din`.
    auto attention_bwd_to = [&](const std::vector<T>& in, std::vector<T>& din) {
      linear_bwd(a.att.data(), at(Li.out_proj_w), dt.data(), datt.data(), false, gat(Li.out_proj_w),
                 gat(Li.out_proj_b), M, h, h);
      attention_bwd(a.qkv, a.probs, datt, dqkv, B, S, H, D, false, m_attn.empty() ? nullptr : m_attn.data());
      linear_bwd(in.data(), at(Li.in_proj_w), dqkv.data(), din.data(), false, gat(Li.in_proj_w), gat(Li.in_proj_b), M,
                 3 * h, h);
    };
    if (bc.pre_layer_norm) {
      // y = a + drop(ffn(LN_out(a))), a = x + drop(attn(LN_attn(x))); dx holds dy.
      times(du, dx, m2);
      ffn_bwd(a.s2, tmp);  // tmp = d LN_out(a)
      ln_bwd(tmp.data(), a.s1.data(), a.mean2.data(), a.rstd2.data(), at(Li.norm2_w), da.data(), gat(Li.norm2_w),
             gat(Li.norm2_b), M, h);
      add(da, dx);  // d a
      times(dt, da, m1);
      attention_bwd_to(a.x1, tmp);  // tmp = d LN_attn(x)
      ln_bwd(tmp.data(), a.x_in.data(), a.mean1.data(), a.rstd1.data(), at(Li.norm1_w), dx.data(), gat(Li.norm1_w),
             gat(Li.norm1_b), M, h);
      add(dx, da);
    } else {
      // y = LN_out(s2), s2 = a + drop(ffn(a)), a = LN_attn(s1), s1 = x + drop(attn(x)).
      std::vector<T>& ds = tmp;
      ln_bwd(dx.data(), a.s2.data(), a.mean2.data(), a.rstd2.data(), at(Li.norm2_w), ds.data(), gat(Li.norm2_w),
             gat(Li.norm2_b), M, h);  // d s2
      times(du, ds, m2);
      ffn_bwd(a.x1, da);
      add(da, ds);  // d a
      ln_bwd(da.data(), a.s1.data(), a.mean1.data(), a.rstd1.data(), at(Li.norm1_w), ds.data(), gat(Li.norm1_w),
             gat(Li.norm1_b), M, h);  // d s1
      times(dt, ds, m1);
      attention_bwd_to(a.x_in, dx);
      add(dx, ds);
    }
  }
  // x0 = drop(LN_emb(word + position)).
  apply_drop(dx, bert_drop(bert_embedding_dropout_layer(L, drop_micro_), bc.hidden_dropout_ratio, Mh));
  ln_bwd(dx.data(), emb_sum_.data(), mean_e_.data(), rstd_e_.data(), at(p_.embedding_norm_w()), tmp.data(),
         gat(p_.embedding_norm_w()), gat(p_.embedding_norm_b()), M, h);
  embed_backward(tmp, G);
}

template double ReferenceModel<float>::forward_bert(const float*, const std::int32_t*, const std::int32_t*, int, int);
template double ReferenceModel<double>::forward_bert(const double*, const std::int32_t*, const std::int32_t*, int, int);
template void ReferenceModel<float>::backward_bert(const float*, float*, double);
template void ReferenceModel<double>::backward_bert(const double*, double*, double);
template std::vector<double> ReferenceModel<float>::bert_drop(std::uint32_t, float, std::size_t) const;
template std::vector<double> ReferenceModel<double>::bert_drop(std::uint32_t, float, std::size_t) const;

}  // namespace cutrain::model
