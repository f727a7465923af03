// BERT's encoder and masked-LM head on the GPU (docs/bert.md): the embeddings' LayerNorm and
// dropout, Pre-LN or Post-LN blocks whose sub-layer outputs go through the fused bias + dropout +
// residual kernel, attention over the non-padding keys with dropout on its probabilities (the
// mask computed from the tokens on the device, the dropout regenerated in backward), exact GELU,
// the masked-LM head on the labelled rows only (each sequence's into its own max_pred slots,
// kernels/mlm_gather.cuh: transform and the decoder tied to the word embedding on B x max_pred
// rows, d(hidden) scattered back). DeepSpeed's memory flags:
// gelu_checkpoint (the GELU output recomputed in backward into d4h_), normalize_invertible (the
// LayerNorm inputs that are not kept anyway live in dqkv_, free during the forward, and the
// backward reads the output instead), attn_dropout_checkpoint (nothing to drop: the flash
// attention keeps no probabilities).
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/attention.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/dropout.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/mlm_gather.cuh"
#include "kernels/token_drop.cuh"
#include "model/kernel_costs.h"
#include "model/linear_param_grads.h"
#include "model/timed_call.h"
#include "model/transformer_gpu.h"
#include "runtime/check.h"
#include "runtime/timing.h"

namespace cutrain::model {

using kernels::GemmEpilogue;

template <typename T>
typename GpuTransformerT<T>::BertFlagSavings GpuTransformerT<T>::bert_flag_savings(const ModelDims& d, int B, int S,
                                                                  bool checkpointing, int max_pred) {
  BertFlagSavings out;
  if (d.arch != Arch::Bert) return out;
  const std::size_t M = std::size_t(B) * S, h = std::size_t(d.hidden), F = std::size_t(d.ffn());
  const std::size_t P = std::size_t(B) * mlm_slots(S, max_pred);  // the head's rows
  const std::size_t sets = checkpointing ? 1 : std::size_t(d.layers);  // per-block activation sets
  const std::size_t row = M * h * sizeof(T);
  out.gelu_checkpoint = sets * M * F * sizeof(T);  // the GELU output of each block
  // The LayerNorm inputs whose output is kept: Pre-LN's attention sum a (LN_out's input; LN_attn's
  // input is the block input, kept anyway), Post-LN's s1 and s2; the head's GELU output (P rows).
  out.normalize_invertible = sets * row * (d.bert.pre_layer_norm ? 1 : 2) + P * h * sizeof(T);
  out.attn_dropout_checkpoint = 0;  // no probabilities stored, dropped or not
  return out;
}

template <typename T>
float GpuTransformerT<T>::bert_hidden_p() const { return train_ ? table_.dims().bert.hidden_dropout_ratio : 0.f; }

template <typename T>
kernels::AttentionOptions GpuTransformerT<T>::bert_attention(int l) const {
  const BertConfig& b = table_.dims().bert;
  kernels::AttentionOptions o;
  o.key_mask = key_mask_;
  if (train_ && b.attn_dropout_ratio > 0.f) {
    o.dropout = bert_key(bert_dropout_layer(table_.dims().layers, moe_micro_, l, BertDropoutSite::Attention));
    o.dropout_p = b.attn_dropout_ratio;
  }
  return o;
}

// Buffers for what BERT keeps: see LayerActs' mapping in transformer_gpu.h. The flags leave out
// a.s1 (and Post-LN's a.s2) for dqkv_, a.g for d4h_, head_g_ for dqkv_. The head's buffers have
// P_ = B x max_pred rows.
template <typename T>
void GpuTransformerT<T>::allocate_bert(cudaStream_t s) {
  const ModelDims& d = table_.dims();
  const BertConfig& bc = d.bert;
  // Sized for the constructor's B x S (cap_): a shorter padded length (set_shape) runs in them.
  const std::size_t M = cap_, P = P_, h = d.hidden, F = d.ffn(), V = d.vocab_rows(), H = d.heads;
  auto bf = [&](std::size_t n) { return take_n<T>(s, n); };
  auto f32 = [&](std::size_t n) { return take_n<float>(s, n); };
  auto i32 = [&](std::size_t n) { return take_n<std::int32_t>(s, n); };
  const bool inv = bc.normalize_invertible, gck = bc.gelu_checkpoint;
  xs_.resize(d.layers + 1);
  for (auto& x : xs_) x = bf(M * h);
  acts_.resize(checkpointing_ ? 1 : d.layers);
  for (auto& a : acts_) {
    a = LayerActs{};
    a.qkv = bf(M * 3 * h);
    a.att = bf(M * h);
    a.lse = f32(M * H);  // [rows, H, seq]
    a.x1 = bf(M * h);
    a.s1 = inv ? nullptr : bf(M * h);
    a.s2 = inv && !bc.pre_layer_norm ? nullptr : bf(M * h);
    a.f = bf(M * F);
    a.g = gck ? nullptr : bf(M * F);
    a.mean1 = f32(M);
    a.rstd1 = f32(M);
    a.mean2 = f32(M);
    a.rstd2 = f32(M);
  }
  emb_sum_ = bf(M * h);
  mean_e_ = f32(M);
  rstd_e_ = f32(M);
  key_mask_ = bc.pad_id >= 0 ? take_n<std::uint8_t>(s, M) : nullptr;
  mlm_pos_ = i32(P);
  mlm_labels_ = i32(P);
  mlm_slot_ = i32(M);
  head_x_ = bf(P * h);
  if (bc.pre_layer_norm) {
    lnf_ = bf(P * h);
    mean_f_ = f32(P);
    rstd_f_ = f32(P);
  }
  head_d_ = bf(P * h);
  head_g_ = inv ? nullptr : bf(P * h);
  head_n_ = bf(P * h);
  mean_h_ = f32(P);
  rstd_h_ = f32(P);
  logits_ = bf(P * V);
  dx_ = bf(M * h);
  dh_ = bf(M * h);
  d4h_ = bf(M * F);
  dqkv_ = bf(M * 3 * h);
  // dqkv_ is free during the forward (and a checkpointed block's recompute), d4h_ until a block's
  // FFN backward has read the recomputed GELU output.
  for (auto& a : acts_) {
    if (!a.s1) a.s1 = dqkv_;
    if (!a.s2) a.s2 = dqkv_;
    if (!a.g) a.g = d4h_;
  }
  if (!head_g_) head_g_ = dqkv_;
  // The blocks' rows at the constructor's B x S (each size grows with the rows; set_shape checks
  // a shorter length against it) and the head's P_ rows.
  std::size_t sc = scratch_bytes(Bfull_, Sfull_);
  for (std::size_t n : {3 * h, h, F, V}) sc = std::max(sc, kernels::bias_grad_scratch_bytes(P_, int(n)));
  sc = std::max(sc, kernels::layernorm_backward_scratch_bytes(P_, d.hidden));
  sc = std::max(sc, kernels::cross_entropy_scratch_bytes(P_));
  scratch_size_ = std::max<std::size_t>(sc, 256);
  scratch_ = take(s, scratch_size_);
}

template <typename T>
void GpuTransformerT<T>::bert_embedding_forward(cudaStream_t s, const Unit& E, const std::int32_t* tokens, int* d_status) {
  const ModelDims& d = table_.dims();
  const int h = d.hidden;
  const float p = bert_hidden_p();
  if (key_mask_)
    timed(s, "key_mask", cost::Cost{0, 5.0 * M_}, [&] {
      kernels::attention_key_mask_from_tokens(s, tokens, d.bert.pad_id, key_mask_, std::size_t(M_));
    });
  timed(s, "embedding", cost::embedding_forward(B_, S_, h), [&] {
    kernels::embedding_forward(s, tokens, E.w(table_.embedding()), E.w(table_.pos_embedding()), emb_sum_, B_, S_, h,
                               d.vocab, d_status);
  });
  timed(s, "ln_emb", cost::layernorm_residual_forward(M_, h), [&] {
    kernels::layernorm_residual_forward(s, emb_sum_, nullptr, nullptr, xs_[0], mean_e_, rstd_e_,
                                        E.w(table_.embedding_norm_w()), E.w(table_.embedding_norm_b()), M_, h,
                                        d.bert.layer_norm_eps);
  });
  if (p > 0.f)
    timed(s, "dropout_emb", cost::dropout(std::size_t(M_) * h), [&] {
      kernels::dropout_forward(s, {bert_key(bert_embedding_dropout_layer(d.layers, moe_micro_)), p}, xs_[0], xs_[0],
                               std::size_t(M_) * h, dtype_of<T>());
    });
}

template <typename T>
void GpuTransformerT<T>::bert_embedding_backward(cudaStream_t s, const Unit& E, DType gt, bool acc,
                                             const std::int32_t* tokens) {
  const ModelDims& d = table_.dims();
  const int h = d.hidden, V = d.vocab_rows();
  const std::size_t es = dtype_size(gt);
  const float p = bert_hidden_p();
  if (p > 0.f)
    timed(s, "dropout_emb", cost::dropout(std::size_t(M_) * h), [&] {
      kernels::dropout_backward(s, {bert_key(bert_embedding_dropout_layer(d.layers, moe_micro_)), p}, dx_, dx_,
                                std::size_t(M_) * h, dtype_of<T>());
    });
  timed(s, "ln_emb", cost::layernorm_backward(M_, h, es, acc), [&] {
    kernels::layernorm_backward(s, dx_, emb_sum_, mean_e_, rstd_e_, E.w(table_.embedding_norm_w()), nullptr, dx_,
                                E.g(table_.embedding_norm_w()), E.g(table_.embedding_norm_b()), gt, acc, scratch_, M_, h);
  });
  // The word embedding's gradient holds the tied decoder's share already (written per `acc`):
  // the lookup's is added. The position table's, when not accumulating, is cleared first.
  if (!acc) {
    const ParamTensor& wpe = table_.tensor(table_.pos_embedding());
    CUTRAIN_CUDA_CHECK(cudaMemsetAsync(E.g(table_.pos_embedding()), 0, wpe.count * es, s));
  }
  timed(s, "embedding", cost::embedding_backward(B_, S_, h, es), [&] {
    kernels::embedding_backward(s, dx_, tokens, E.g(table_.embedding()), E.g(table_.pos_embedding()), gt, true, B_, S_,
                                h, V, scratch_);
  });
}

template <typename T>
void GpuTransformerT<T>::bert_layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a) {
  const ModelDims& d = table_.dims();
  const BertConfig& bc = d.bert;
  const LayerIndex& L = table_.layer(l);
  const int h = d.hidden, F = d.ffn();
  const float eps = bc.layer_norm_eps, p = bert_hidden_p();
  auto w = [&](int idx) { return U.w(idx); };
  const T* x = xs_[l];
  T* y = xs_[l + 1];
  // out = residual + dropout(dh_ + bias) at the block's hidden site.
  auto residual = [&](const char* name, int bias, const T* res, T* out, BertDropoutSite site) {
    timed(s, name, cost::bias_dropout_residual(M_, h), [&] {
      kernels::bias_dropout_residual_forward(s, {bert_key(bert_dropout_layer(d.layers, moe_micro_, l, site)), p}, dh_,
                                             w(bias), res, out, std::size_t(M_), std::size_t(h), dtype_of<T>());
    });
  };
  auto ln = [&](const char* name, const T* in, T* out, float* mean, float* rstd, int gw, int gb) {
    timed(s, name, cost::layernorm_residual_forward(M_, h), [&] {
      kernels::layernorm_residual_forward(s, in, nullptr, nullptr, out, mean, rstd, w(gw), w(gb), M_, h, eps);
    });
  };
  {
    TimedRegion r("attn", s);
    if (bc.pre_layer_norm) ln("ln_attn", x, a.x1, a.mean1, a.rstd1, L.norm1_w, L.norm1_b);
    const T* in = bc.pre_layer_norm ? a.x1 : x;
    timed(s, "qkv", cost::gemm_forward(M_, 3 * h, h), [&] {
      gemm_->forward(s, in, w(L.in_proj_w), w(L.in_proj_b), a.qkv, M_, 3 * h, h, GemmEpilogue::Bias);
    });
    timed(s, "attention", cost::attention_forward(B_, S_, attn_.heads, attn_.head_dim, false),
          [&] { kernels::attention_forward(s, a.qkv, a.att, a.lse, attn_, bert_attention(l)); });
    timed(s, "out_proj", cost::gemm_forward(M_, h, h, false), [&] {
      gemm_->forward(s, a.att, w(L.out_proj_w), nullptr, dh_, M_, h, h, GemmEpilogue::None);
    });
    residual("attn_residual", L.out_proj_b, x, a.s1, BertDropoutSite::AttentionOutput);
    // Pre-LN: a = s1 goes on, LN_out(a) feeds the FFN; Post-LN: a = LN_attn(s1).
    if (bc.pre_layer_norm) ln("ln_out", a.s1, a.s2, a.mean2, a.rstd2, L.norm2_w, L.norm2_b);
    else ln("ln_attn", a.s1, a.x1, a.mean1, a.rstd1, L.norm1_w, L.norm1_b);
  }
  TimedRegion r("mlp", s);
  const T* in = bc.pre_layer_norm ? a.s2 : a.x1;
  timed(s, "fc1", cost::gemm_forward(M_, F, h), [&] {
    gemm_->forward(s, in, w(L.ff0_w), w(L.ff0_b), a.f, M_, F, h, GemmEpilogue::Bias);
  });
  timed(s, "gelu", cost::gelu_forward(std::size_t(M_) * F), [&] {
    kernels::gelu_forward(s, a.f, nullptr, nullptr, a.g, std::size_t(M_), F, kernels::GeluKind::Erf);
  });
  timed(s, "fc2", cost::gemm_forward(M_, h, F, false), [&] {
    gemm_->forward(s, a.g, w(L.ff2_w), nullptr, dh_, M_, h, F, GemmEpilogue::None);
  });
  if (bc.pre_layer_norm) {
    residual("out_residual", L.ff2_b, a.s1, y, BertDropoutSite::Output);
  } else {
    residual("out_residual", L.ff2_b, a.x1, a.s2, BertDropoutSite::Output);
    ln("ln_out", a.s2, y, a.mean2, a.rstd2, L.norm2_w, L.norm2_b);
  }
}

template <typename T>
void GpuTransformerT<T>::bert_layer_backward(cudaStream_t s, const Unit& U, DType gt, bool acc, int l, const LayerActs& a) {
  const ModelDims& d = table_.dims();
  const BertConfig& bc = d.bert;
  const LayerIndex& L = table_.layer(l);
  const int h = d.hidden, F = d.ffn();
  const std::size_t es = dtype_size(gt);
  const float p = bert_hidden_p();
  const bool inv = bc.normalize_invertible;
  auto w = [&](int idx) { return U.w(idx); };
  auto g = [&](int idx) { return U.g(idx); };
  // y = x W^T + b with dy [M, N]: dW, db per `acc` (db in the GEMM's epilogue where the measured
  // rule says so: linear_param_grads.h), then dx (+ what dx holds when beta = 1).
  auto linear_backward = [&](LinearRegions n, const T* dy, const T* x, int w_idx, int b_idx, T* dx, int N,
                             int K, float beta) {
    param_grads(s, n, dy, x, g(w_idx), g(b_idx), gt, acc, M_, N, K);
    timed(s, n.dx, cost::gemm_grad_input(M_, N, K, beta != 0.f), [&] { gemm_->grad_input(s, dy, w(w_idx), dx, M_, N, K, beta); });
  };
  // d(t) = dropout_backward(d(out)) at a hidden site, into `spare`; without dropout d(out) itself.
  auto undrop = [&](const char* name, T* dout, T* spare, BertDropoutSite site) -> T* {
    if (p <= 0.f) return dout;
    timed(s, name, cost::dropout(std::size_t(M_) * h), [&] {
      kernels::dropout_backward(s, {bert_key(bert_dropout_layer(d.layers, moe_micro_, l, site)), p}, dout, spare,
                                std::size_t(M_) * h, dtype_of<T>());
    });
    return spare;
  };
  // LayerNorm backward: d_sum = LN'(dy) (+ d_extra), from the input `in` or (normalize_invertible,
  // `out` given) from the output.
  auto ln_backward = [&](const char* name, const T* dy, const T* in, const T* out, const float* mean,
                         const float* rstd, int gw, int gb, const T* d_extra, T* d_sum) {
    timed(s, name, cost::layernorm_backward(M_, h, es, acc), [&] {
      if (inv && out)
        kernels::layernorm_backward_from_output(s, dy, out, rstd, w(gw), w(gb), d_extra, d_sum, g(gw), g(gb), gt, acc,
                                                scratch_, M_, h);
      else
        kernels::layernorm_backward(s, dy, in, mean, rstd, w(gw), d_extra, d_sum, g(gw), g(gb), gt, acc, scratch_, M_, h);
    });
  };
  // The FFN from du (d of fc2's output before its bias) to d of its input, written into `din`
  // (added to what it holds when beta = 1).
  auto ffn_backward = [&](const T* du, const T* in, T* din, float beta) {
    TimedRegion r("mlp", s);
    if (bc.gelu_checkpoint)  // a.g (d4h_) from the kept pre-activation
      timed(s, "gelu_recompute", cost::gelu_forward(std::size_t(M_) * F), [&] {
        kernels::gelu_forward(s, a.f, nullptr, nullptr, a.g, std::size_t(M_), F, kernels::GeluKind::Erf);
      });
    linear_backward({"fc2_dw", "fc2_db", "fc2_dw_db", "fc2_dx"}, du, a.g, L.ff2_w, L.ff2_b, d4h_, h, F, 0.f);  // d4h_ = d g
    timed(s, "gelu", cost::gelu_backward(std::size_t(M_) * F),
          [&] { kernels::gelu_backward(s, d4h_, a.f, d4h_, std::size_t(M_) * F, kernels::GeluKind::Erf); });
    linear_backward({"fc1_dw", "fc1_db", "fc1_dw_db", "fc1_dx"}, d4h_, in, L.ff0_w, L.ff0_b, din, F, h, beta);
  };
  // The attention from dt (d of out_proj's output before its bias) to d of its input `in`,
  // written into dx_ (added to what it holds when beta = 1).
  auto attention_backward = [&](const T* dt, const T* in, float beta) {
    TimedRegion r("attn", s);
    linear_backward({"out_proj_dw", "out_proj_db", "out_proj_dw_db", "out_proj_dx"}, dt, a.att, L.out_proj_w, L.out_proj_b, d4h_, h, h,
                    0.f);  // d4h_ = d att
    timed(s, "attention", cost::attention_backward(B_, S_, attn_.heads, attn_.head_dim, false), [&] {
      kernels::attention_backward(s, a.qkv, a.att, d4h_, a.lse, dqkv_, scratch_, attn_, deterministic_attention_,
                                  bert_attention(l));
    });
    linear_backward({"qkv_dw", "qkv_db", "qkv_dw_db", "qkv_dx"}, dqkv_, in, L.in_proj_w, L.in_proj_b, dx_, 3 * h, h, beta);
  };
  if (bc.pre_layer_norm) {
    // dx_ = dy; y = a + drop(u), a = x + drop(t).
    const T* du = undrop("out_dropout", dx_, dh_, BertDropoutSite::Output);
    ffn_backward(du, a.s2, dh_, 0.f);  // dh_ = d LN_out(a)
    ln_backward("ln_out", dh_, a.s1, a.s2, a.mean2, a.rstd2, L.norm2_w, L.norm2_b, dx_, dh_);  // dh_ = d a
    const T* dt = undrop("attn_dropout", dh_, dx_, BertDropoutSite::AttentionOutput);
    attention_backward(dt, a.x1, 0.f);  // dx_ = d LN_attn(x)
    ln_backward("ln_attn", dx_, xs_[l], nullptr, a.mean1, a.rstd1, L.norm1_w, L.norm1_b, dh_, dx_);  // dx_ = d x
  } else {
    // dx_ = dy; y = LN_out(s2), s2 = a + drop(u), a = LN_attn(s1), s1 = x + drop(t).
    ln_backward("ln_out", dx_, a.s2, xs_[l + 1], a.mean2, a.rstd2, L.norm2_w, L.norm2_b, nullptr, dx_);  // d s2
    const T* du = undrop("out_dropout", dx_, dh_, BertDropoutSite::Output);
    ffn_backward(du, a.x1, dx_, 1.f);  // dx_ = d a (the residual's d s2 + the FFN's)
    ln_backward("ln_attn", dx_, a.s1, a.x1, a.mean1, a.rstd1, L.norm1_w, L.norm1_b, nullptr, dx_);  // d s1
    const T* dt = undrop("attn_dropout", dx_, dh_, BertDropoutSite::AttentionOutput);
    attention_backward(dt, xs_[l], 1.f);  // dx_ = d x (the residual's d s1 + the attention's)
  }
}

// The plan from the labels (d_status[1]: a bad label, or a sequence with more than K_ labelled
// rows), the labelled rows of the final hidden state into head_x_, then the head on P_ rows. A
// row-wise head on the gathered rows gives the all-rows head's values on them; the other rows
// had no loss.
template <typename T>
void GpuTransformerT<T>::bert_head_forward(cudaStream_t s, const Unit& H, const Unit& E, const std::int32_t* labels,
                                       int* d_status) {
  const ModelDims& d = table_.dims();
  const int h = d.hidden, Vr = d.vocab_rows(), Ln = d.layers, P = P_;
  const float eps = d.bert.layer_norm_eps;
  timed(s, "mlm_plan", cost::Cost{0, 4.0 * M_ + 12.0 * P}, [&] {
    kernels::mlm_gather_plan(s, labels, B_, S_, K_, d.vocab, mlm_pos_, mlm_labels_, mlm_slot_,
                             d_status ? d_status + 1 : nullptr);
  });
  timed(s, "mlm_gather", cost::token_move(std::size_t(P), h),
        [&] { kernels::token_gather(s, xs_[Ln], mlm_pos_, head_x_, B_, S_, K_, h); });
  const T* xf = head_x_;
  if (d.bert.pre_layer_norm) {
    timed(s, "ln_f", cost::layernorm_residual_forward(P, h), [&] {
      kernels::layernorm_residual_forward(s, head_x_, nullptr, nullptr, lnf_, mean_f_, rstd_f_,
                                          H.w(table_.final_norm_w()), H.w(table_.final_norm_b()), P, h, eps);
    });
    xf = lnf_;
  }
  timed(s, "transform", cost::gemm_forward(P, h, h), [&] {
    gemm_->forward(s, xf, H.w(table_.head_dense_w()), H.w(table_.head_dense_b()), head_d_, P, h, h, GemmEpilogue::Bias);
  });
  timed(s, "transform_gelu", cost::gelu_forward(std::size_t(P) * h), [&] {
    kernels::gelu_forward(s, head_d_, nullptr, nullptr, head_g_, std::size_t(P), h, kernels::GeluKind::Erf);
  });
  timed(s, "transform_ln", cost::layernorm_residual_forward(P, h), [&] {
    kernels::layernorm_residual_forward(s, head_g_, nullptr, nullptr, head_n_, mean_h_, rstd_h_,
                                        H.w(table_.head_norm_w()), H.w(table_.head_norm_b()), P, h, eps);
  });
  timed(s, "logits", cost::gemm_forward(P, Vr, h), [&] {
    gemm_->forward(s, head_n_, E.w(table_.output_w()), H.w(table_.output_b()), logits_, P, Vr, h, GemmEpilogue::Bias);
  });
}

// logits_ holds dlogits [P_, V]; the head's gradients from the gathered rows (the slots past a
// sequence's count have dlogits 0 and add nothing), then d(head_x_) scattered into dx_ = d x_L.
template <typename T>
void GpuTransformerT<T>::bert_head_backward(cudaStream_t s, const Unit& H, const Unit& E, DType gt, bool acc) {
  const ModelDims& d = table_.dims();
  const int h = d.hidden, V = d.vocab_rows(), P = P_;
  const std::size_t es = dtype_size(gt);
  const bool pre = d.bert.pre_layer_norm;
  // The tied weight's gradient is the word embedding's: written (or added) here, the lookup's
  // share added by the embedding backward.
  param_grads(s, {"dw", "db", "dw_db", "dx"}, logits_, head_n_, E.g(table_.output_w()), H.g(table_.output_b()), gt,
              acc, P, V, h);
  timed(s, "dx", cost::gemm_grad_input(P, V, h, false),
        [&] { gemm_->grad_input(s, logits_, E.w(table_.output_w()), dh_, P, V, h, 0.f); });
  timed(s, "transform_ln", cost::layernorm_backward(P, h, es, acc), [&] {
    if (d.bert.normalize_invertible)
      kernels::layernorm_backward_from_output(s, dh_, head_n_, rstd_h_, H.w(table_.head_norm_w()),
                                              H.w(table_.head_norm_b()), nullptr, dh_, H.g(table_.head_norm_w()),
                                              H.g(table_.head_norm_b()), gt, acc, scratch_, P, h);
    else
      kernels::layernorm_backward(s, dh_, head_g_, mean_h_, rstd_h_, H.w(table_.head_norm_w()), nullptr, dh_,
                                  H.g(table_.head_norm_w()), H.g(table_.head_norm_b()), gt, acc, scratch_, P, h);
  });
  timed(s, "transform_gelu", cost::gelu_backward(std::size_t(P) * h), [&] {
    kernels::gelu_backward(s, dh_, head_d_, dh_, std::size_t(P) * h, kernels::GeluKind::Erf);
  });
  const T* xf = pre ? lnf_ : head_x_;
  // d4h_ [P_, h] = d(transform input), then (Pre-LN) d(head_x_) in place.
  param_grads(s, {"transform_dw", "transform_db", "transform_dw_db", "transform_dx"}, dh_, xf,
              H.g(table_.head_dense_w()), H.g(table_.head_dense_b()), gt, acc, P, h, h);
  timed(s, "transform_dx", cost::gemm_grad_input(P, h, h, false),
        [&] { gemm_->grad_input(s, dh_, H.w(table_.head_dense_w()), d4h_, P, h, h, 0.f); });
  if (pre)
    timed(s, "ln_f", cost::layernorm_backward(P, h, es, acc), [&] {
      kernels::layernorm_backward(s, d4h_, head_x_, mean_f_, rstd_f_, H.w(table_.final_norm_w()), nullptr, d4h_,
                                  H.g(table_.final_norm_w()), H.g(table_.final_norm_b()), gt, acc, scratch_, P, h);
    });
  timed(s, "mlm_scatter", cost::token_move(std::size_t(M_), h),
        [&] { kernels::mlm_scatter_rows(s, d4h_, mlm_slot_, dx_, M_, h); });
}

// The members defined here, for both compute dtypes (the rest: transformer_gpu.cpp).
#define CUTRAIN_BERT_MEMBERS(T)                                                                                    \
  template GpuTransformerT<T>::BertFlagSavings GpuTransformerT<T>::bert_flag_savings(const ModelDims&, int, int,    \
                                                                                     bool, int);                   \
  template float GpuTransformerT<T>::bert_hidden_p() const;                                                        \
  template kernels::AttentionOptions GpuTransformerT<T>::bert_attention(int) const;                                \
  template void GpuTransformerT<T>::allocate_bert(cudaStream_t);                                                   \
  template void GpuTransformerT<T>::bert_embedding_forward(cudaStream_t, const Unit&, const std::int32_t*, int*);   \
  template void GpuTransformerT<T>::bert_embedding_backward(cudaStream_t, const Unit&, DType, bool,                 \
                                                            const std::int32_t*);                                  \
  template void GpuTransformerT<T>::bert_layer_forward(cudaStream_t, const Unit&, int, const LayerActs&);          \
  template void GpuTransformerT<T>::bert_layer_backward(cudaStream_t, const Unit&, DType, bool, int,               \
                                                        const LayerActs&);                                         \
  template void GpuTransformerT<T>::bert_head_forward(cudaStream_t, const Unit&, const Unit&, const std::int32_t*, \
                                                      int*);                                                       \
  template void GpuTransformerT<T>::bert_head_backward(cudaStream_t, const Unit&, const Unit&, DType, bool);
CUTRAIN_BERT_MEMBERS(bf16)
CUTRAIN_BERT_MEMBERS(f16)
#undef CUTRAIN_BERT_MEMBERS

}  // namespace cutrain::model
