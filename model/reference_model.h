// @brief The CPU reference of the whole model (either architecture of TransformerParams): forward
// to the mean cross-entropy loss and the full backward, over the flat parameter layout. Templated on the
// storage type (float for the CPU training path and GPU comparisons, double for finite-difference
// gradient checks); sums are accumulated in double either way. Not fast: it is the yardstick.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/moe_reference.h"
#include "model/moe_stats.h"
#include "model/tensor_parallel.h"
#include "model/token_drop_plan.h"
#include "model/transformer_params.h"

namespace cutrain::model {

// A contiguous run of the model's layer sequence (embedding, blocks [first, end), head): what one
// pipeline stage computes. The default is the whole model.
struct LayerSpan {
  bool embedding = true;
  int first = 0, end = -1;  // blocks; end -1: through the last block
  bool head = true;         // the output projection and the loss
};

template <typename T>
class ReferenceModel {
 public:
  // `causal`: mask future positions in attention (the BF16 example uses no mask; GPT-2 is always
  // causal, whatever is passed).
  explicit ReferenceModel(const TransformerParams& params, bool causal = false);

  // Mean cross-entropy of labels (ignore_index -100 rows skipped) for tokens [B, S]; keeps the
  // activations for backward(). params: flat_size() elements. The MoE blocks (MoeDims) run
  // model/moe_reference.h's layer; the returned loss is the LM loss, aux_loss() their l_aux sum.
  double forward(const T* params, const std::int32_t* tokens, const std::int32_t* labels, int B, int S);

  // Adds d(objective * grad_scale)/d(params) into grads (flat_size(); the caller zeroes it), using
  // the activations of the last forward() with the same params. The objective is the LM loss plus
  // moe.loss_coeff * aux_loss() (each MoE layer's backward gets aux_grad = coeff * grad_scale).
  void backward(const T* params, T* grads, double grad_scale = 1.0);

  // The MoE layers' mode for the next forwards: training (capacity_factor, noisy gate) or
  // evaluation (eval_capacity_factor), and the gate noise's seed (moe_forward_seed).
  void set_moe_mode(bool train, std::uint64_t seed = 0) {
    moe_train_ = train;
    moe_seed_ = seed;
  }
  // random-LTD for the next forwards (and their backwards): `plan` (null or inactive: every block
  // sees every token) stays the caller's and must outlive them. A dropping block runs on the
  // plan's kept tokens of each sequence, in ascending position order; the others bypass it.
  void set_token_drop(const TokenDropPlan* plan) { drop_ = plan; }
  // BERT's dropout (Arch::Bert; model/bert_config.h's sites): the key of the next forwards' masks
  // (seed, the optimizer step, the micro-batch of the step), and training (dropout on) or
  // evaluation (off). The default: training, seed 0, step 0, micro-batch 0.
  void set_dropout(std::uint64_t seed, std::uint32_t step, int micro = 0) {
    drop_seed_ = seed;
    drop_step_ = step;
    drop_micro_ = micro;
  }
  void set_training(bool train) { train_ = train; }
  // Expert parallelism: every MoE block exchanges its tokens over `ex` (model/moe_exchange.h);
  // params then hold this rank's experts only (null: every expert here).
  void set_moe_exchange(MoeExchange* ex) {
    for (auto& m : moe_)
      if (m) m->set_exchange(ex);
  }
  // Knowledge distillation (Mixture-of-Students, model/distillation_loss.h) for the next backwards:
  // the LM loss's logits gradient weighted by `ce_weight`, and `extra` [B*S, vocab_rows] (the
  // distillation term's gradient w.r.t. the logits) added to it, both times the backward's
  // grad_scale. Null: the LM loss alone at weight 1. `extra` stays the caller's and must outlive the
  // backwards. Not with tensor parallelism (its vocabulary-parallel head has its own gradient).
  void set_logits_grad_extra(const std::vector<T>* extra, double ce_weight = 1.0) {
    logits_extra_ = extra;
    ce_weight_ = ce_weight;
  }
  double aux_loss() const { return aux_; }  // sum of the MoE layers' l_aux of the last forward
  const std::vector<MoeBlockStats>& moe_stats() const { return moe_stats_; }  // one per MoE block
  const MoeReference* moe_layer(int l) const { return moe_.at(std::size_t(l)).get(); }  // null: dense block

  const std::vector<T>& logits() const { return logits_; }  // [B*S, vocab_rows] of the last forward

  // Tensor parallelism (Megatron's layout, model/tensor_parallel.h): with slice.size > 1 the spans
  // compute this rank's heads, FFN columns and vocabulary rows only (reference_tp.cpp), reading and
  // writing those slices of the flat params and gradients (and the replicated LayerNorms, biases of
  // the row-parallel layers and position table whole); logits() is then this rank's columns.
  // Dense blocks only (a MoE block is refused).
  void set_tensor_parallel(const TpSlice& slice);
  const TpSlice& tensor_parallel() const { return tp_; }

  // One span (GPT-2: the head's weight is the token embedding's, in the params and gradients of
  // the first layer, whichever span holds the head): the input is `tokens` when the span starts with the embedding, else `x_in` [B*S, hidden];
  // `labels` are read when it ends with the head, which returns the loss; otherwise the output
  // [B*S, hidden] goes to `x_out` and 0 is returned. forward() is the whole span.
  double forward_span(const T* params, const LayerSpan& span, const std::int32_t* tokens, const std::int32_t* labels,
                      const T* x_in, int B, int S, std::vector<T>* x_out);
  // The backward of the last forward_span: from the loss when the span has the head, else from
  // `dx_out` (the gradient of its output); the gradient of its input goes to `dx_in` unless the
  // span starts with the embedding.
  void backward_span(const T* params, T* grads, const T* dx_out, double grad_scale, std::vector<T>* dx_in);

  // Host bytes of the activations the last forward keeps for its backward (every block's, the
  // tensor-parallel pieces', the final hidden rows and the logits).
  std::size_t activation_bytes() const {
    std::size_t n = sizeof(T) * (x_final_.size() + logits_.size() + x_lnf_.size()) +
                    sizeof(double) * (mean_f_.size() + rstd_f_.size());
    for (const std::vector<LayerActs>* v : {&acts_, &tp_acts_})
      for (const LayerActs& a : *v)
        n += sizeof(T) * (a.x_in.size() + a.qkv.size() + a.probs.size() + a.att.size() + a.s1.size() + a.x1.size() +
                          a.f.size() + a.g.size() + a.s2.size()) +
             sizeof(double) * (a.mean1.size() + a.rstd1.size() + a.mean2.size() + a.rstd2.size());
    return n;
  }

 private:
  struct LayerActs {
    std::vector<T> x_in, qkv, probs, att, s1, x1, f, g, s2;
    std::vector<double> mean1, rstd1, mean2, rstd2;
  };
  // GPT-2 (reference_gpt2.cpp): pre-LN blocks (x1 = LN1(x_in), s1 = x_in + attn, s2 = LN2(s1)),
  // final LayerNorm, head tied to the token embedding. Logits' shared softmax: dlogits().
  // Both architectures' start: keeps B, S, tokens and labels, checks the tokens and returns the
  // token + position embeddings [B*S, hidden].
  std::vector<T> embed(const T* params, const std::int32_t* tokens, const std::int32_t* labels, int B, int S);
  // And its end: the residual stream's gradient `dx` [B*S, hidden] added into the token and
  // position embeddings' gradients in `grads`.
  void embed_backward(const std::vector<T>& dx, T* grads) const;
  // The tensor-parallel spans of both architectures (reference_tp.cpp).
  double forward_tp(const T* params, const std::int32_t* tokens, const std::int32_t* labels, const T* x_in, int B,
                    int S, std::vector<T>* x_out);
  void backward_tp(const T* params, T* grads, const T* dx_out, double grad_scale, std::vector<T>* dx_in);
  // BERT (reference_bert.cpp; docs/bert.md): Pre-LN or Post-LN blocks with padding masks and
  // dropout, the masked-LM head tied to the word embedding. The whole model only (no spans).
  double forward_bert(const T* params, const std::int32_t* tokens, const std::int32_t* labels, int B, int S);
  void backward_bert(const T* params, T* grads, double grad_scale);
  // Multipliers of dropout site `layer` over n elements (empty: no dropout there now).
  std::vector<double> bert_drop(std::uint32_t layer, float p, std::size_t n) const;
  double forward_gpt2(const T* params, const std::int32_t* tokens, const std::int32_t* labels, const T* x_in, int B,
                      int S, std::vector<T>* x_out);
  void backward_gpt2(const T* params, T* grads, const T* dx_out, double grad_scale, std::vector<T>* dx_in);
  std::vector<T> dlogits(double grad_scale) const;
  // random-LTD: block l's slot in the plan (-1: all tokens), and the kept rows' gather / scatter.
  int drop_slot(int l) const;
  std::vector<T> gather_tokens(const std::vector<T>& x, int slot) const;
  void scatter_tokens(const std::vector<T>& xk, int slot, std::vector<T>& x) const;
  double loss_from_logits();
  // Block l's MoE layer on x [M, hidden] into y (the FFN's output); its stats recorded.
  void moe_forward(const T* params, int l, const T* x, T* y);
  // Its backward: dx [M, hidden] written from dy, the layer's gradients added into grads.
  void moe_backward(const T* params, int l, const T* dy, T* dx, T* grads, double grad_scale);

  const TransformerParams& p_;
  bool causal_;
  LayerSpan span_;  // of the last forward, end resolved
  int B_ = 0, S_ = 0;
  std::vector<std::int32_t> tokens_, labels_;
  std::vector<LayerActs> acts_;
  std::vector<T> x_final_, logits_;
  std::vector<T> x_lnf_;               // GPT-2: LN_f(x_final_)
  std::vector<double> mean_f_, rstd_f_;
  std::size_t n_valid_ = 0;
  std::vector<std::unique_ptr<MoeReference>> moe_;  // per block: null for a dense block
  std::vector<MoeBlockStats> moe_stats_;
  bool moe_train_ = true;
  std::uint64_t moe_seed_ = 0;
  double aux_ = 0;
  TpSlice tp_;
  std::vector<LayerActs> tp_acts_;         // tensor parallel: [block x pieces + piece], piece rows
  std::vector<double> row_max_, row_sum_;  // vocab-parallel cross-entropy: each row's max and sum-exp
  const TokenDropPlan* drop_ = nullptr;
  const std::vector<T>* logits_extra_ = nullptr;  // distillation: added to dlogits (set_logits_grad_extra)
  double ce_weight_ = 1.0;
  // BERT: the dropout key and mode, the key mask of the last forward ([B*S], empty: no padding
  // token), the embeddings' LayerNorm input and statistics, the head's transform (dense output,
  // its GELU, the LayerNorm of that).
  std::uint64_t drop_seed_ = 0;
  std::uint32_t drop_step_ = 0;
  int drop_micro_ = 0;
  bool train_ = true;
  std::vector<std::uint8_t> key_mask_;
  std::vector<T> emb_sum_, head_d_, head_g_, head_n_;
  std::vector<double> mean_e_, rstd_e_, mean_h_, rstd_h_;
};

// One AdamW / Adam step on fp32-or-fp64 host buffers (the CPU training path), PyTorch's formula:
// bias-corrected moments, decoupled decay (p -= lr*wd*p) when `decoupled`, else L2 on the gradient.
template <typename T>
void reference_adam_step(T* params, const T* grads, T* m, T* v, std::size_t n, double lr, double beta1, double beta2,
                         double eps, double weight_decay, bool decoupled, int step, double grad_scale = 1.0);

}  // namespace cutrain::model
