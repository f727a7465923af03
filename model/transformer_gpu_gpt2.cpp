// GPT-2's blocks and head on the GPU (llm.c's model): pre-LN blocks whose residual add is fused
// into the next LayerNorm (LN1 of the next block, or the final LN_f), c_fc with cuBLASLt's
// bias + tanh-GELU epilogue and c_proj's backward with its DGELU epilogue, the logits from the
// token embedding (tied head, no bias).
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/attention.cuh"
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "model/kernel_costs.h"
#include "model/linear_param_grads.h"
#include "model/timed_call.h"
#include "model/transformer_gpu.h"
#include "runtime/timing.h"

namespace cutrain::model {

using kernels::GemmEpilogue;

template <typename T>
void GpuTransformerT<T>::gpt2_layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a,
                                        const LayerActs* prev, T* x_in, bool fuse, const Rows& rows) {
  if (sharded()) return tp_gpt2_layer_forward(s, U, l, a, prev, x_in, fuse, rows);
  const LayerIndex& L = table_.layer(l);
  const int h = table_.dims().hidden, F = table_.dims().ffn();
  auto w = [&](int idx) { return U.w(idx); };
  const auto& A = rows.attn;
  {
    TimedRegion r("attn", s);
    timed(s, "ln1", cost::layernorm_residual_forward(rows.M, h), [&] {
      if (fuse)  // x_in = prev block's s1 + its MLP output (in dh_)
        kernels::layernorm_residual_forward(s, dh_, prev->s1, x_in, a.x1, a.mean1, a.rstd1, w(L.norm1_w),
                                            w(L.norm1_b), rows.M, h);
      else
        kernels::layernorm_residual_forward(s, x_in, nullptr, nullptr, a.x1, a.mean1, a.rstd1, w(L.norm1_w),
                                            w(L.norm1_b), rows.M, h);
    });
    timed(s, "qkv", cost::gemm_forward(rows.M, 3 * h, h), [&] {
      gemm_->forward(s, a.x1, w(L.in_proj_w), w(L.in_proj_b), a.qkv, rows.M, 3 * h, h, GemmEpilogue::Bias);
    });
    timed(s, "attention", cost::attention_forward(A.batch, A.seq, A.heads, A.head_dim, A.causal),
          [&] { kernels::attention_forward(s, a.qkv, a.att, a.lse, rows.attn); });
    timed(s, "out_proj", cost::gemm_forward(rows.M, h, h), [&] {
      gemm_->forward(s, a.att, w(L.out_proj_w), w(L.out_proj_b), dh_, rows.M, h, h, GemmEpilogue::Bias);
    });
    tp_all_reduce(s, dh_, rows.M);  // row-parallel: the heads' partial sums
  }
  if (moe_[std::size_t(l)]) {  // the MLP is a MoE layer; its output in dh_ as the MLP's
    TimedRegion r("moe", s);
    timed(s, "ln2", cost::layernorm_residual_forward(rows.M, h), [&] {
      kernels::layernorm_residual_forward(s, dh_, x_in, a.s1, a.s2, a.mean2, a.rstd2, w(L.norm2_w), w(L.norm2_b), rows.M,
                                          h);
    });
    moe_forward(s, U, l, a.s2, dh_);
    return;
  }
  {
    TimedRegion r("mlp", s);
    timed(s, "ln2", cost::layernorm_residual_forward(rows.M, h), [&] {
      kernels::layernorm_residual_forward(s, dh_, x_in, a.s1, a.s2, a.mean2, a.rstd2, w(L.norm2_w), w(L.norm2_b), rows.M,
                                          h);
    });
    timed(s, "fc1", cost::gemm_forward(rows.M, F, h), [&] {
      gemm_->forward(s, a.s2, w(L.ff0_w), w(L.ff0_b), a.g, rows.M, F, h, GemmEpilogue::BiasGeluTanh, a.f);
    });
    timed(s, "fc2", cost::gemm_forward(rows.M, h, F), [&] {
      gemm_->forward(s, a.g, w(L.ff2_w), w(L.ff2_b), dh_, rows.M, h, F, GemmEpilogue::Bias);
    });
    tp_all_reduce(s, dh_, rows.M);  // row-parallel: the FFN columns' partial sums
  }
}

template <typename T>
void GpuTransformerT<T>::gpt2_layer_backward(cudaStream_t s, const Unit& U, DType gt, bool acc, int l, const LayerActs& a,
                                         const T* x_in, const Rows& rows) {
  if (sharded()) return tp_gpt2_layer_backward(s, U, gt, acc, l, a, x_in, rows);
  const LayerIndex& L = table_.layer(l);
  const int h = table_.dims().hidden, F = table_.dims().ffn();
  const std::size_t es = dtype_size(gt);
  auto w = [&](int idx) { return U.w(idx); };
  auto g = [&](int idx) { return U.g(idx); };
  const auto& A = rows.attn;
  // y = x W^T + b with dy [M, N]: dW, db per `acc` (db in the GEMM's epilogue where the measured
  // rule says so: linear_param_grads.h), then dx (with the DGELU epilogue when `aux`).
  auto linear_backward = [&](LinearRegions n, const T* dy, const T* x, int w_idx, int b_idx, T* dx, int N,
                             int K, const T* aux) {
    param_grads(s, n, dy, x, g(w_idx), g(b_idx), gt, acc, rows.M, N, K);
    timed(s, n.dx, cost::gemm_grad_input(rows.M, N, K, false),
          [&] { gemm_->grad_input(s, dy, w(w_idx), dx, rows.M, N, K, 0.f, aux); });
  };
  if (moe_[std::size_t(l)]) {
    TimedRegion r("moe", s);
    // rows.dx = d(block output) = d(MoE output): dh_ = d s2, then d s1 (LN2's + the residual's).
    if constexpr (std::is_same_v<T, bf16>)  // MoE blocks are bf16 only (refused with fp16 at construction)
      moe_[std::size_t(l)]->backward(s, U.w(L.moe), a.s2, rows.dx,
                                     float(table_.dims().moe.loss_coeff) * moe_grad_scale_, dh_, U.g(L.moe), gt, acc);
    timed(s, "ln2", cost::layernorm_backward(rows.M, h, es, acc), [&] {
      kernels::layernorm_backward(s, dh_, a.s1, a.mean2, a.rstd2, w(L.norm2_w), rows.dx, dh_, g(L.norm2_w), g(L.norm2_b),
                                  gt, acc, scratch_, rows.M, h);
    });
  } else {
    TimedRegion r("mlp", s);
    if (recompute_gelu_) {  // a.g is shared by the blocks: this block's from its pre-activation
      timed(s, "gelu_recompute", cost::gelu_forward(std::size_t(rows.M) * F), [&] {
        kernels::gelu_forward(s, a.f, nullptr, nullptr, a.g, std::size_t(rows.M), F, kernels::GeluKind::Tanh);
      });
    }
    // rows.dx = d(block output) = d(MLP output) = the residual's share of d s1.
    linear_backward({"fc2_dw", "fc2_db", "fc2_dw_db", "fc2_dx"}, rows.dx, a.g, L.ff2_w, L.ff2_b, d4h_, h, F, a.f);  // d4h_ = d f
    linear_backward({"fc1_dw", "fc1_db", "fc1_dw_db", "fc1_dx"}, d4h_, a.s2, L.ff0_w, L.ff0_b, dh_, F, h, nullptr);  // d s2
    tp_all_reduce(s, dh_, rows.M);  // column-parallel FC1's input gradient
    timed(s, "ln2", cost::layernorm_backward(rows.M, h, es, acc), [&] {  // dh_ = d s1 (LN2's + the residual's)
      kernels::layernorm_backward(s, dh_, a.s1, a.mean2, a.rstd2, w(L.norm2_w), rows.dx, dh_, g(L.norm2_w), g(L.norm2_b),
                                  gt, acc, scratch_, rows.M, h);
    });
  }
  {
    TimedRegion r("attn", s);
    linear_backward({"out_proj_dw", "out_proj_db", "out_proj_dw_db", "out_proj_dx"}, dh_, a.att, L.out_proj_w, L.out_proj_b, rows.dx, h, h,
                    nullptr);  // rows.dx = d att
    timed(s, "attention", cost::attention_backward(A.batch, A.seq, A.heads, A.head_dim, A.causal),
          [&] {
            kernels::attention_backward(s, a.qkv, a.att, rows.dx, a.lse, dqkv_, scratch_, rows.attn,
                                        deterministic_attention_);
          });
    linear_backward({"qkv_dw", "qkv_db", "qkv_dw_db", "qkv_dx"}, dqkv_, a.x1, L.in_proj_w, L.in_proj_b, rows.dx, 3 * h, h,
                    nullptr);  // rows.dx = d x1
    tp_all_reduce(s, rows.dx, rows.M);  // column-parallel QKV's input gradient
    timed(s, "ln1", cost::layernorm_backward(rows.M, h, es, acc), [&] {  // rows.dx = d x_in (LN1's + d s1)
      kernels::layernorm_backward(s, rows.dx, x_in, a.mean1, a.rstd1, w(L.norm1_w), dh_, rows.dx, g(L.norm1_w), g(L.norm1_b),
                                  gt, acc, scratch_, rows.M, h);
    });
  }
}

template <typename T>
void GpuTransformerT<T>::gpt2_head_forward(cudaStream_t s, const Unit& H, const Unit& E) {
  const ModelDims& d = table_.dims();
  const int h = d.hidden, Vr = d.vocab_rows(), Ln = d.layers;
  timed(s, "ln_f", cost::layernorm_residual_forward(M_, h), [&] {
    if (Ln > 0 && drop_slot(Ln - 1) < 0)  // x_L = the last block's s1 + its MLP output (in dh_)
      kernels::layernorm_residual_forward(s, dh_, acts_[checkpointing_ ? 0 : Ln - 1].s1, xs_[Ln], lnf_, mean_f_,
                                          rstd_f_, H.w(table_.final_norm_w()), H.w(table_.final_norm_b()), M_, h);
    else
      kernels::layernorm_residual_forward(s, xs_[Ln], nullptr, nullptr, lnf_, mean_f_, rstd_f_,  // a dropping last block scattered x_L
                                          H.w(table_.final_norm_w()), H.w(table_.final_norm_b()), M_, h);
  });
  if (sharded()) return tp_logits(s, H, E);  // the rank's vocabulary rows of wte
  timed(s, "logits", cost::gemm_forward(M_, Vr, h, false), [&] {
    gemm_->forward(s, lnf_, E.w(table_.output_w()), nullptr, logits_, M_, Vr, h, GemmEpilogue::None);
  });
}

template <typename T>
void GpuTransformerT<T>::gpt2_head_backward(cudaStream_t s, const Unit& H, const Unit& E, DType gt, bool acc) {
  if (sharded()) return tp_head_backward(s, H, E, gt, acc);
  const ModelDims& d = table_.dims();
  const int h = d.hidden, V = d.vocab_rows(), Ln = d.layers;
  const std::size_t es = dtype_size(gt);
  // logits_ holds dlogits. The tied weight's gradient is wte's: written (or added) here, the
  // embedding lookup's share added by the embedding backward.
  timed(s, "dw", cost::gemm_grad_weight(M_, V, h, es, acc),
        [&] { gemm_->grad_weight(s, logits_, lnf_, E.g(table_.output_w()), gt, M_, V, h, acc); });
  timed(s, "dx", cost::gemm_grad_input(M_, V, h, false),
        [&] { gemm_->grad_input(s, logits_, E.w(table_.output_w()), dh_, M_, V, h, 0.f); });
  timed(s, "ln_f", cost::layernorm_backward(M_, h, es, acc), [&] {
    kernels::layernorm_backward(s, dh_, xs_[Ln], mean_f_, rstd_f_, H.w(table_.final_norm_w()), nullptr, dx_,
                                H.g(table_.final_norm_w()), H.g(table_.final_norm_b()), gt, acc, scratch_, M_, h);
  });
}

// The members defined here, for both compute dtypes (the rest: transformer_gpu.cpp).
#define CUTRAIN_GPT2_MEMBERS(T)                                                                                     \
  template void GpuTransformerT<T>::gpt2_layer_forward(cudaStream_t, const Unit&, int, const LayerActs&,           \
                                                       const LayerActs*, T*, bool, const Rows&);                    \
  template void GpuTransformerT<T>::gpt2_layer_backward(cudaStream_t, const Unit&, DType, bool, int,               \
                                                        const LayerActs&, const T*, const Rows&);                  \
  template void GpuTransformerT<T>::gpt2_head_forward(cudaStream_t, const Unit&, const Unit&);                     \
  template void GpuTransformerT<T>::gpt2_head_backward(cudaStream_t, const Unit&, const Unit&, DType, bool);
CUTRAIN_GPT2_MEMBERS(bf16)
CUTRAIN_GPT2_MEMBERS(f16)
#undef CUTRAIN_GPT2_MEMBERS

}  // namespace cutrain::model
