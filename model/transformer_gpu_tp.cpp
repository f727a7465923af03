// Tensor parallelism of the GPU model above one rank (Megatron's layout; transformer_gpu.h's
// set_tensor_parallel): the sharded blocks of the seed model and GPT-2, the vocabulary-parallel
// embedding, logits and loss, and the slices' copies between the flat layout and packed scratch.
// The replicated work (LayerNorms, the residual stream, attention's layout) is the whole model's;
// each block all-reduce sits where Megatron puts it, so between them every rank holds the same
// full [rows, hidden] activations and gradients.
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/attention.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/vocab_parallel_loss.cuh"
#include "model/kernel_costs.h"
#include "model/linear_param_grads.h"
#include "model/timed_call.h"
#include "model/transformer_gpu.h"
#include "runtime/check.h"
#include "runtime/timing.h"

namespace cutrain::model {

using kernels::GemmEpilogue;

template <typename T>
void GpuTransformerT<T>::pack(cudaStream_t s, void* dst, const void* src, const SliceRuns& r, std::size_t es) const {
  CUTRAIN_CUDA_CHECK(cudaMemcpy2DAsync(dst, r.width * es, static_cast<const char*>(src) + r.offset * es, r.pitch * es,
                                       r.width * es, r.height, cudaMemcpyDeviceToDevice, s));
}
template <typename T>
void GpuTransformerT<T>::unpack(cudaStream_t s, void* dst, const void* src, const SliceRuns& r, std::size_t es) const {
  CUTRAIN_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst) + r.offset * es, r.pitch * es, src, r.width * es,
                                       r.width * es, r.height, cudaMemcpyDeviceToDevice, s));
}

template <typename T>
void GpuTransformerT<T>::packed_grad_weight(cudaStream_t s, const T* dy, const T* x, void* g, DType gt, bool acc,
                                            int M, int N, int K, const SliceRuns& r) {
  const std::size_t es = dtype_size(gt);
  if (acc) pack(s, tp_gw_, g, r, es);
  gemm_->grad_weight(s, dy, x, tp_gw_, gt, M, N, K, acc);
  unpack(s, g, tp_gw_, r, es);
}

template <typename T>
void GpuTransformerT<T>::packed_grad_weight_bias(cudaStream_t s, const T* dy, const T* x, void* g, void* db, DType gt,
                                                 bool acc, int M, int N, int K, const SliceRuns& r) {
  const std::size_t es = dtype_size(gt);
  if (acc) pack(s, tp_gw_, g, r, es);
  gemm_->grad_weight_bias(s, dy, x, tp_gw_, db, gt, M, N, K, acc, scratch_);
  unpack(s, g, tp_gw_, r, es);
}

template <typename T>
void GpuTransformerT<T>::tp_row_param_grads(cudaStream_t s, const char* layer, const T* dy, const T* x, void* gw,
                                            void* gb, DType gt, bool acc, int M, int N, int K, const SliceRuns& r) {
  const std::string n(layer), dw = n + "_dw", db = n + "_db", dw_db = n + "_dw_db", dx = n + "_dx";
  linear_param_grads(
      s, {dw.c_str(), db.c_str(), dw_db.c_str(), dx.c_str()}, M, N, K, dtype_size(gt), acc,
      [&] { packed_grad_weight_bias(s, dy, x, gw, gb, gt, acc, M, N, K, r); },
      [&] { packed_grad_weight(s, dy, x, gw, gt, acc, M, N, K, r); },
      [&] { kernels::bias_grad(s, dy, gb, gt, M, N, acc, scratch_); });
}

template <typename T>
void GpuTransformerT<T>::tp_qkv_param_grads(cudaStream_t s, const T* dq, const T* x, void* gw, void* gb, DType gt,
                                            bool acc, int M, int N, int K) {
  const std::size_t es = dtype_size(gt);
  linear_param_grads(
      s, {"qkv_dw", "qkv_db", "qkv_dw_db", "qkv_dx"}, M, N, K, es, acc,
      [&] {  // only without accumulation: tp_gb_ is written whole, then scattered
        packed_grad_weight_bias(s, dq, x, gw, tp_gb_, gt, acc, M, N, K, tp_runs_.qkv_w);
        unpack(s, gb, tp_gb_, tp_runs_.qkv_b, es);
      },
      [&] { packed_grad_weight(s, dq, x, gw, gt, acc, M, N, K, tp_runs_.qkv_w); },
      [&] {
        if (acc) pack(s, tp_gb_, gb, tp_runs_.qkv_b, es);
        kernels::bias_grad(s, dq, tp_gb_, gt, M, N, acc, scratch_);
        unpack(s, gb, tp_gb_, tp_runs_.qkv_b, es);
      });
}

template <typename T>
void GpuTransformerT<T>::tp_reduce_piece(cudaStream_t s, T* buf, int rows, int p) {
  if (tps_.pieces == 1) return tp_all_reduce(s, buf, rows);
  cudaStream_t c = tp_comm_stream_->get();
  tp_ready_[std::size_t(p)].record(s);
  tp_ready_[std::size_t(p)].wait_on(c);
  tp_all_reduce(c, buf, rows);
  tp_done_[std::size_t(p)].record(c);
}

template <typename T>
void GpuTransformerT<T>::tp_wait_piece(cudaStream_t s, int p) {
  if (tps_.pieces > 1) tp_done_[std::size_t(p)].wait_on(s);
}

// Domino's pieces of a block (one piece: the whole micro-batch): piece p holds the sequences
// [p B/P, (p+1) B/P), i.e. the rows [p M/P, (p+1) M/P) of every [rows, width] buffer and the
// sequences' blocks of the attention's [B, heads, S] statistics.
#define CUTRAIN_TP_PIECES()                                                                                      \
  const int P = tps_.pieces;                                                                                     \
  CUTRAIN_CHECK(rows.attn.batch % P == 0, "gpu model: Domino's ", P, " pieces do not divide the micro-batch of ", \
                rows.attn.batch, " sequences");                                                                  \
  const int Mp = rows.M / P;                                                                                     \
  kernels::AttentionShape pattn = rows.attn;                                                                     \
  pattn.batch = rows.attn.batch / P;                                                                             \
  auto at = [&](auto* buf, int p, std::size_t width) { return buf + std::size_t(p) * std::size_t(Mp) * width; }; \
  auto act = [&](int p) {                                                                                        \
    LayerActs v = a;                                                                                             \
    const std::size_t r = std::size_t(p) * std::size_t(Mp);                                                      \
    v.qkv += r * 3 * std::size_t(hl);                                                                            \
    v.att += r * std::size_t(hl);                                                                                \
    v.s1 += r * std::size_t(h);                                                                                  \
    v.x1 += r * std::size_t(h);                                                                                  \
    v.f += r * std::size_t(Fp);                                                                                  \
    v.g += r * std::size_t(Fp);                                                                                  \
    v.s2 += r * std::size_t(h);                                                                                  \
    v.lse += std::size_t(p) * std::size_t(pattn.batch) * std::size_t(pattn.heads) * std::size_t(pattn.seq);     \
    v.mean1 += r;                                                                                                \
    v.rstd1 += r;                                                                                                \
    v.mean2 += r;                                                                                                \
    v.rstd2 += r;                                                                                                \
    return v;                                                                                                    \
  }

// The seed model's post-LN block on the rank's heads and FFN columns.
template <typename T>
void GpuTransformerT<T>::tp_layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a, const T* x_in,
                                          T* x_out, const Rows& rows) {
  const LayerIndex& L = table_.layer(l);
  const int h = table_.dims().hidden, D = table_.dims().head_dim();
  const int hl = (tps_.head_end - tps_.head_begin) * D, Fp = tps_.ffn_end - tps_.ffn_begin;
  const std::size_t f0 = std::size_t(tps_.ffn_begin);
  const bool first = tps_.rank == 0;  // the row-parallel biases are added once over the group
  auto w = [&](int idx) { return U.w(idx); };
  CUTRAIN_TP_PIECES();
  {
    TimedRegion r("attn", s);
    for (int p = 0; p < P; ++p) {
      const LayerActs v = act(p);
      T* proj = at(dh_, p, h);
      pack(s, tp_w_, w(L.in_proj_w), tp_runs_.qkv_w, sizeof(T));
      pack(s, tp_b_, w(L.in_proj_b), tp_runs_.qkv_b, sizeof(T));
      timed(s, "qkv", cost::gemm_forward(Mp, 3 * hl, h),
            [&] { gemm_->forward(s, at(x_in, p, h), tp_w_, tp_b_, v.qkv, Mp, 3 * hl, h, GemmEpilogue::Bias); });
      timed(s, "attention", cost::attention_forward(pattn.batch, pattn.seq, pattn.heads, pattn.head_dim, pattn.causal),
            [&] { kernels::attention_forward(s, v.qkv, v.att, v.lse, pattn); });
      pack(s, tp_w_, w(L.out_proj_w), tp_runs_.out_proj_w, sizeof(T));
      timed(s, "out_proj", cost::gemm_forward(Mp, h, hl), [&] {
        gemm_->forward(s, v.att, tp_w_, first ? w(L.out_proj_b) : nullptr, proj, Mp, h, hl,
                       first ? GemmEpilogue::Bias : GemmEpilogue::None);
      });
      tp_reduce_piece(s, proj, Mp, p);
    }
  }
  TimedRegion r("mlp", s);
  for (int p = 0; p < P; ++p) {
    const LayerActs v = act(p);
    T* proj = at(dh_, p, h);
    tp_wait_piece(s, p);
    timed(s, "ln1", cost::layernorm_residual_forward(Mp, h), [&] {
      kernels::layernorm_residual_forward(s, proj, at(x_in, p, h), v.s1, v.x1, v.mean1, v.rstd1, w(L.norm1_w),
                                          w(L.norm1_b), Mp, h);
    });
    timed(s, "fc1", cost::gemm_forward(Mp, Fp, h), [&] {
      gemm_->forward(s, v.x1, w(L.ff0_w) + f0 * h, w(L.ff0_b) + f0, v.f, Mp, Fp, h, GemmEpilogue::Bias);
    });
    timed(s, "gelu", cost::gelu_forward(std::size_t(Mp) * Fp), [&] {
      kernels::gelu_forward(s, v.f, nullptr, nullptr, v.g, std::size_t(Mp), Fp, kernels::GeluKind::Erf);
    });
    pack(s, tp_w_, w(L.ff2_w), tp_runs_.ff2_w, sizeof(T));
    timed(s, "fc2", cost::gemm_forward(Mp, h, Fp), [&] {
      gemm_->forward(s, v.g, tp_w_, first ? w(L.ff2_b) : nullptr, proj, Mp, h, Fp,
                     first ? GemmEpilogue::Bias : GemmEpilogue::None);
    });
    tp_reduce_piece(s, proj, Mp, p);
  }
  for (int p = 0; p < P; ++p) {
    const LayerActs v = act(p);
    tp_wait_piece(s, p);
    timed(s, "ln2", cost::layernorm_residual_forward(Mp, h), [&] {
      kernels::layernorm_residual_forward(s, at(dh_, p, h), v.x1, v.s2, at(x_out, p, h), v.mean2, v.rstd2,
                                          w(L.norm2_w), w(L.norm2_b), Mp, h);
    });
  }
}

template <typename T>
void GpuTransformerT<T>::tp_layer_backward(cudaStream_t s, const Unit& U, DType gt, bool acc, int l,
                                           const LayerActs& a, const T* x_in, const Rows& rows) {
  const LayerIndex& L = table_.layer(l);
  const int h = table_.dims().hidden, D = table_.dims().head_dim();
  const int hl = (tps_.head_end - tps_.head_begin) * D, Fp = tps_.ffn_end - tps_.ffn_begin;
  const std::size_t f0 = std::size_t(tps_.ffn_begin), es = dtype_size(gt);
  // The residual's share of a column-parallel input gradient is added on rank 0 only.
  const float residual = tps_.rank == 0 ? 1.f : 0.f;
  auto w = [&](int idx) { return U.w(idx); };
  auto g = [&](int idx) { return U.g(idx); };
  auto g_at = [&](int idx, std::size_t elems) { return static_cast<char*>(U.g(idx)) + elems * es; };
  CUTRAIN_TP_PIECES();
  {
    TimedRegion r("mlp", s);
    for (int p = 0; p < P; ++p) {
      const LayerActs v = act(p);
      const bool ac = acc || p > 0;  // the pieces' weight gradients add up
      T* dx = at(rows.dx, p, h);
      T* d4 = at(d4h_, p, Fp);
      timed(s, "ln2", cost::layernorm_backward(Mp, h, es, ac), [&] {
        kernels::layernorm_backward(s, dx, v.s2, v.mean2, v.rstd2, w(L.norm2_w), nullptr, dx, g(L.norm2_w),
                                    g(L.norm2_b), gt, ac, scratch_, Mp, h);
      });
      tp_row_param_grads(s, "fc2", dx, v.g, g(L.ff2_w), g(L.ff2_b), gt, ac, Mp, h, Fp, tp_runs_.ff2_w);
      pack(s, tp_w_, w(L.ff2_w), tp_runs_.ff2_w, sizeof(T));
      timed(s, "fc2_dx", cost::gemm_grad_input(Mp, h, Fp, false),
            [&] { gemm_->grad_input(s, dx, tp_w_, d4, Mp, h, Fp, 0.f); });
      timed(s, "gelu", cost::gelu_backward(std::size_t(Mp) * Fp),
            [&] { kernels::gelu_backward(s, d4, v.f, d4, std::size_t(Mp) * Fp, kernels::GeluKind::Erf); });
      param_grads(s, {"fc1_dw", "fc1_db", "fc1_dw_db", "fc1_dx"}, d4, v.x1, g_at(L.ff0_w, f0 * h), g_at(L.ff0_b, f0),
                  gt, ac, Mp, Fp, h);
      timed(s, "fc1_dx", cost::gemm_grad_input(Mp, Fp, h, residual != 0.f),
            [&] { gemm_->grad_input(s, d4, w(L.ff0_w) + f0 * h, dx, Mp, Fp, h, residual); });
      tp_reduce_piece(s, dx, Mp, p);  // d x1
    }
  }
  TimedRegion r("attn", s);
  for (int p = 0; p < P; ++p) {
    const LayerActs v = act(p);
    const bool ac = acc || p > 0;
    T* dx = at(rows.dx, p, h);
    T* datt = at(dh_, p, hl);  // d att [Mp, hl]
    T* dq = at(dqkv_, p, 3 * std::size_t(hl));
    tp_wait_piece(s, p);
    timed(s, "ln1", cost::layernorm_backward(Mp, h, es, ac), [&] {
      kernels::layernorm_backward(s, dx, v.s1, v.mean1, v.rstd1, w(L.norm1_w), nullptr, dx, g(L.norm1_w),
                                  g(L.norm1_b), gt, ac, scratch_, Mp, h);
    });
    tp_row_param_grads(s, "out_proj", dx, v.att, g(L.out_proj_w), g(L.out_proj_b), gt, ac, Mp, h, hl, tp_runs_.out_proj_w);
    pack(s, tp_w_, w(L.out_proj_w), tp_runs_.out_proj_w, sizeof(T));
    timed(s, "out_proj_dx", cost::gemm_grad_input(Mp, h, hl, false),
          [&] { gemm_->grad_input(s, dx, tp_w_, datt, Mp, h, hl, 0.f); });
    timed(s, "attention", cost::attention_backward(pattn.batch, pattn.seq, pattn.heads, pattn.head_dim, pattn.causal),
          [&] {
            kernels::attention_backward(s, v.qkv, v.att, datt, v.lse, dq, scratch_, pattn, deterministic_attention_);
          });
    tp_qkv_param_grads(s, dq, at(x_in, p, h), g(L.in_proj_w), g(L.in_proj_b), gt, ac, Mp, 3 * hl, h);
    pack(s, tp_w_, w(L.in_proj_w), tp_runs_.qkv_w, sizeof(T));
    timed(s, "qkv_dx", cost::gemm_grad_input(Mp, 3 * hl, h, residual != 0.f),
          [&] { gemm_->grad_input(s, dq, tp_w_, dx, Mp, 3 * hl, h, residual); });
    tp_reduce_piece(s, dx, Mp, p);  // d x_in
  }
  for (int p = 0; p < P; ++p) tp_wait_piece(s, p);
}

// GPT-2's pre-LN block on the rank's heads and FFN columns (transformer_gpu_gpt2.cpp's order).
template <typename T>
void GpuTransformerT<T>::tp_gpt2_layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a,
                                               const LayerActs* prev, T* x_in, bool fuse, const Rows& rows) {
  const LayerIndex& L = table_.layer(l);
  const int h = table_.dims().hidden, D = table_.dims().head_dim();
  const int hl = (tps_.head_end - tps_.head_begin) * D, Fp = tps_.ffn_end - tps_.ffn_begin;
  const std::size_t f0 = std::size_t(tps_.ffn_begin);
  const bool first = tps_.rank == 0;
  auto w = [&](int idx) { return U.w(idx); };
  CUTRAIN_TP_PIECES();
  {
    TimedRegion r("attn", s);
    for (int p = 0; p < P; ++p) {
      const LayerActs v = act(p);
      T* xi = at(x_in, p, h);
      T* dh = at(dh_, p, h);
      timed(s, "ln1", cost::layernorm_residual_forward(Mp, h), [&] {
        if (fuse)  // x_in = prev block's s1 + its MLP output (in dh_, summed over the group)
          kernels::layernorm_residual_forward(s, dh, at(prev->s1, p, h), xi, v.x1, v.mean1, v.rstd1, w(L.norm1_w),
                                              w(L.norm1_b), Mp, h);
        else
          kernels::layernorm_residual_forward(s, xi, nullptr, nullptr, v.x1, v.mean1, v.rstd1, w(L.norm1_w),
                                              w(L.norm1_b), Mp, h);
      });
      pack(s, tp_w_, w(L.in_proj_w), tp_runs_.qkv_w, sizeof(T));
      pack(s, tp_b_, w(L.in_proj_b), tp_runs_.qkv_b, sizeof(T));
      timed(s, "qkv", cost::gemm_forward(Mp, 3 * hl, h),
            [&] { gemm_->forward(s, v.x1, tp_w_, tp_b_, v.qkv, Mp, 3 * hl, h, GemmEpilogue::Bias); });
      timed(s, "attention", cost::attention_forward(pattn.batch, pattn.seq, pattn.heads, pattn.head_dim, pattn.causal),
            [&] { kernels::attention_forward(s, v.qkv, v.att, v.lse, pattn); });
      pack(s, tp_w_, w(L.out_proj_w), tp_runs_.out_proj_w, sizeof(T));
      timed(s, "out_proj", cost::gemm_forward(Mp, h, hl), [&] {
        gemm_->forward(s, v.att, tp_w_, first ? w(L.out_proj_b) : nullptr, dh, Mp, h, hl,
                       first ? GemmEpilogue::Bias : GemmEpilogue::None);
      });
      tp_reduce_piece(s, dh, Mp, p);
    }
  }
  TimedRegion r("mlp", s);
  for (int p = 0; p < P; ++p) {
    const LayerActs v = act(p);
    T* dh = at(dh_, p, h);
    tp_wait_piece(s, p);
    timed(s, "ln2", cost::layernorm_residual_forward(Mp, h), [&] {
      kernels::layernorm_residual_forward(s, dh, at(x_in, p, h), v.s1, v.s2, v.mean2, v.rstd2, w(L.norm2_w),
                                          w(L.norm2_b), Mp, h);
    });
    timed(s, "fc1", cost::gemm_forward(Mp, Fp, h), [&] {
      gemm_->forward(s, v.s2, w(L.ff0_w) + f0 * h, w(L.ff0_b) + f0, v.g, Mp, Fp, h, GemmEpilogue::BiasGeluTanh, v.f);
    });
    pack(s, tp_w_, w(L.ff2_w), tp_runs_.ff2_w, sizeof(T));
    timed(s, "fc2", cost::gemm_forward(Mp, h, Fp), [&] {
      gemm_->forward(s, v.g, tp_w_, first ? w(L.ff2_b) : nullptr, dh, Mp, h, Fp,
                     first ? GemmEpilogue::Bias : GemmEpilogue::None);
    });
    tp_reduce_piece(s, dh, Mp, p);
  }
  for (int p = 0; p < P; ++p) tp_wait_piece(s, p);
}

template <typename T>
void GpuTransformerT<T>::tp_gpt2_layer_backward(cudaStream_t s, const Unit& U, DType gt, bool acc, int l,
                                                const LayerActs& a, const T* x_in, const Rows& rows) {
  const LayerIndex& L = table_.layer(l);
  const int h = table_.dims().hidden, D = table_.dims().head_dim();
  const int hl = (tps_.head_end - tps_.head_begin) * D, Fp = tps_.ffn_end - tps_.ffn_begin;
  const std::size_t f0 = std::size_t(tps_.ffn_begin), es = dtype_size(gt);
  auto w = [&](int idx) { return U.w(idx); };
  auto g = [&](int idx) { return U.g(idx); };
  auto g_at = [&](int idx, std::size_t elems) { return static_cast<char*>(U.g(idx)) + elems * es; };
  CUTRAIN_TP_PIECES();
  {
    TimedRegion r("mlp", s);
    for (int p = 0; p < P; ++p) {
      const LayerActs v = act(p);
      const bool ac = acc || p > 0;  // the pieces' weight gradients add up
      T* dx = at(rows.dx, p, h);
      T* dh = at(dh_, p, h);
      T* d4 = at(d4h_, p, Fp);
      if (recompute_gelu_) {
        timed(s, "gelu_recompute", cost::gelu_forward(std::size_t(Mp) * Fp), [&] {
          kernels::gelu_forward(s, v.f, nullptr, nullptr, v.g, std::size_t(Mp), Fp, kernels::GeluKind::Tanh);
        });
      }
      // dx = d(block output) = d(MLP output): FC2's dW (packed columns), db (replicated), then d f
      // through the DGELU epilogue; FC1's rows are contiguous.
      tp_row_param_grads(s, "fc2", dx, v.g, g(L.ff2_w), g(L.ff2_b), gt, ac, Mp, h, Fp, tp_runs_.ff2_w);
      pack(s, tp_w_, w(L.ff2_w), tp_runs_.ff2_w, sizeof(T));
      timed(s, "fc2_dx", cost::gemm_grad_input(Mp, h, Fp, false),
            [&] { gemm_->grad_input(s, dx, tp_w_, d4, Mp, h, Fp, 0.f, v.f); });
      param_grads(s, {"fc1_dw", "fc1_db", "fc1_dw_db", "fc1_dx"}, d4, v.s2, g_at(L.ff0_w, f0 * h), g_at(L.ff0_b, f0),
                  gt, ac, Mp, Fp, h);
      timed(s, "fc1_dx", cost::gemm_grad_input(Mp, Fp, h, false),
            [&] { gemm_->grad_input(s, d4, w(L.ff0_w) + f0 * h, dh, Mp, Fp, h, 0.f); });
      tp_reduce_piece(s, dh, Mp, p);  // d s2
    }
  }
  TimedRegion r("attn", s);
  for (int p = 0; p < P; ++p) {
    const LayerActs v = act(p);
    const bool ac = acc || p > 0;
    T* dx = at(rows.dx, p, h);
    T* dh = at(dh_, p, h);
    // d att [Mp, hl] in d4h_ (free now): rows.dx's other pieces still hold their gradients.
    T* datt = at(d4h_, p, hl);
    T* dq = at(dqkv_, p, 3 * std::size_t(hl));
    tp_wait_piece(s, p);
    timed(s, "ln2", cost::layernorm_backward(Mp, h, es, ac), [&] {  // dh = d s1 (LN2's + the residual's)
      kernels::layernorm_backward(s, dh, v.s1, v.mean2, v.rstd2, w(L.norm2_w), dx, dh, g(L.norm2_w), g(L.norm2_b), gt,
                                  ac, scratch_, Mp, h);
    });
    tp_row_param_grads(s, "out_proj", dh, v.att, g(L.out_proj_w), g(L.out_proj_b), gt, ac, Mp, h, hl, tp_runs_.out_proj_w);
    pack(s, tp_w_, w(L.out_proj_w), tp_runs_.out_proj_w, sizeof(T));
    timed(s, "out_proj_dx", cost::gemm_grad_input(Mp, h, hl, false),
          [&] { gemm_->grad_input(s, dh, tp_w_, datt, Mp, h, hl, 0.f); });
    timed(s, "attention", cost::attention_backward(pattn.batch, pattn.seq, pattn.heads, pattn.head_dim, pattn.causal),
          [&] {
            kernels::attention_backward(s, v.qkv, v.att, datt, v.lse, dq, scratch_, pattn, deterministic_attention_);
          });
    tp_qkv_param_grads(s, dq, v.x1, g(L.in_proj_w), g(L.in_proj_b), gt, ac, Mp, 3 * hl, h);
    pack(s, tp_w_, w(L.in_proj_w), tp_runs_.qkv_w, sizeof(T));
    timed(s, "qkv_dx", cost::gemm_grad_input(Mp, 3 * hl, h, false),
          [&] { gemm_->grad_input(s, dq, tp_w_, dx, Mp, 3 * hl, h, 0.f); });
    tp_reduce_piece(s, dx, Mp, p);  // d x1
  }
  for (int p = 0; p < P; ++p) {
    const LayerActs v = act(p);
    T* dx = at(rows.dx, p, h);
    tp_wait_piece(s, p);
    timed(s, "ln1", cost::layernorm_backward(Mp, h, es, acc || p > 0), [&] {  // dx = d x_in (LN1's + d s1)
      kernels::layernorm_backward(s, dx, at(x_in, p, h), v.mean1, v.rstd1, w(L.norm1_w), at(dh_, p, h), dx,
                                  g(L.norm1_w), g(L.norm1_b), gt, acc || p > 0, scratch_, Mp, h);
    });
  }
}
#undef CUTRAIN_TP_PIECES

template <typename T>
void GpuTransformerT<T>::tp_embedding_forward(cudaStream_t s, const Unit& E, const std::int32_t* tokens,
                                              int* d_status) {
  const ModelDims& d = table_.dims();
  const int h = d.hidden;
  timed(s, "embedding", cost::embedding_forward(B_, S_, h), [&] {
    // Another rank's token reads a zero row here (the flat layout); the positions once, on rank 0.
    kernels::embedding_forward(s, tokens, E.w(table_.embedding()),
                               tps_.rank == 0 ? E.w(table_.pos_embedding()) : tp_zero_pos_, xs_[0], B_, S_, h,
                               d.vocab, d_status);
  });
  tp_all_reduce(s, xs_[0], M_);
}

template <typename T>
void GpuTransformerT<T>::tp_embedding_rows_clear(cudaStream_t s, const Unit& E, DType gt) {
  const std::size_t h = table_.dims().hidden, es = dtype_size(gt), V = table_.dims().vocab_rows();
  char* g = static_cast<char*>(E.g(table_.embedding()));
  const std::size_t v0 = std::size_t(tps_.vocab_begin), v1 = std::size_t(tps_.vocab_end);
  if (v0 > 0) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(g, 0, v0 * h * es, s));
  if (v1 < V) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(g + v1 * h * es, 0, (V - v1) * h * es, s));
}

template <typename T>
void GpuTransformerT<T>::tp_logits(cudaStream_t s, const Unit& H, const Unit& E) {
  const ModelDims& d = table_.dims();
  const int h = d.hidden, Vs = vocab_slice();
  const std::size_t v0 = std::size_t(tps_.vocab_begin);
  timed(s, "logits", cost::gemm_forward(M_, Vs, h, d.arch != Arch::Gpt2), [&] {
    if (d.arch == Arch::Gpt2)  // tied: the rank's rows of wte
      gemm_->forward(s, lnf_, E.w(table_.output_w()) + v0 * h, nullptr, logits_, M_, Vs, h, GemmEpilogue::None);
    else
      gemm_->forward(s, xs_[d.layers], H.w(table_.output_w()) + v0 * h, H.w(table_.output_b()) + v0, logits_, M_, Vs,
                     h, GemmEpilogue::Bias);
  });
}

template <typename T>
void GpuTransformerT<T>::tp_loss(cudaStream_t s, const std::int32_t* labels, float* d_loss, int* d_status, bool grad,
                                 float grad_scale, const float* d_loss_scale) {
  if constexpr (!std::is_same_v<T, bf16>) {
    CUTRAIN_FAIL("gpu model: tensor parallelism runs in bf16 only");  // refused by set_tensor_parallel already
  } else {
    const ModelDims& d = table_.dims();
    const int Vs = vocab_slice(), v0 = tps_.vocab_begin;
    float* row_max = tp_stats_;
    float* stats = tp_stats_ + M_;  // [2 x rows]: sum-exp, then the target logits
    timed(s, "cross_entropy", cost::cross_entropy(M_, Vs), [&] {
      kernels::vocab_parallel_ce_max(s, logits_, M_, Vs, v0, d.vocab, row_max);
    });
    timed(s, "tp_allreduce", cost::Cost{0.0, 2.0 * double(M_) * sizeof(float)},
          [&] { tp_->all_reduce_f32(s, row_max, std::size_t(M_), true); });
    timed(s, "cross_entropy", cost::cross_entropy(M_, Vs), [&] {
      kernels::vocab_parallel_ce_sums(s, logits_, labels, M_, Vs, v0, d.vocab, row_max, stats);
    });
    timed(s, "tp_allreduce", cost::Cost{0.0, 4.0 * double(M_) * sizeof(float)},
          [&] { tp_->all_reduce_f32(s, stats, 2 * std::size_t(M_), false); });
    timed(s, "cross_entropy", cost::cross_entropy(M_, Vs), [&] {
      kernels::vocab_parallel_ce_finish(s, logits_, labels, M_, Vs, v0, d.vocab, row_max, stats, d_loss, nullptr,
                                        d_status + 1, scratch_, grad, -100, grad_scale, d_loss_scale);
    });
  }
}

template <typename T>
void GpuTransformerT<T>::tp_head_backward(cudaStream_t s, const Unit& H, const Unit& E, DType gt, bool acc) {
  const ModelDims& d = table_.dims();
  const int h = d.hidden, Vs = vocab_slice(), Ln = d.layers;
  const std::size_t v0 = std::size_t(tps_.vocab_begin), es = dtype_size(gt);
  const bool gpt2 = d.arch == Arch::Gpt2;
  const Unit& W = gpt2 ? E : H;  // the unit holding the head's weight (GPT-2: tied to wte)
  const T* x = gpt2 ? lnf_ : xs_[Ln];
  T* dx = gpt2 ? dh_ : dx_;
  // logits_ holds the rank's dlogits [M, Vs]. GPT-2: wte's gradient rows written (or added) here,
  // the lookup's share added by the embedding backward.
  void* gw = static_cast<char*>(W.g(table_.output_w())) + v0 * h * es;
  if (gpt2) {  // no output bias
    timed(s, "dw", cost::gemm_grad_weight(M_, Vs, h, es, acc),
          [&] { gemm_->grad_weight(s, logits_, x, gw, gt, M_, Vs, h, acc); });
  } else {
    void* gb = static_cast<char*>(H.g(table_.output_b())) + v0 * es;
    param_grads(s, {"dw", "db", "dw_db", "dx"}, logits_, x, gw, gb, gt, acc, M_, Vs, h);
  }
  timed(s, "dx", cost::gemm_grad_input(M_, Vs, h, false),
        [&] { gemm_->grad_input(s, logits_, W.w(table_.output_w()) + v0 * h, dx, M_, Vs, h, 0.f); });
  tp_all_reduce(s, dx, M_);
  if (!gpt2) return;
  timed(s, "ln_f", cost::layernorm_backward(M_, h, es, acc), [&] {
    kernels::layernorm_backward(s, dh_, xs_[Ln], mean_f_, rstd_f_, H.w(table_.final_norm_w()), nullptr, dx_,
                                H.g(table_.final_norm_w()), H.g(table_.final_norm_b()), gt, acc, scratch_, M_, h);
  });
}

// The members defined here, for both compute dtypes (fp16 never runs them: set_tensor_parallel
// refuses it).
#define CUTRAIN_TP_MEMBERS(T)                                                                                        \
  template void GpuTransformerT<T>::tp_layer_forward(cudaStream_t, const Unit&, int, const LayerActs&, const T*, T*, \
                                                     const Rows&);                                                   \
  template void GpuTransformerT<T>::tp_layer_backward(cudaStream_t, const Unit&, DType, bool, int, const LayerActs&, \
                                                      const T*, const Rows&);                                        \
  template void GpuTransformerT<T>::tp_gpt2_layer_forward(cudaStream_t, const Unit&, int, const LayerActs&,         \
                                                          const LayerActs*, T*, bool, const Rows&);                  \
  template void GpuTransformerT<T>::tp_gpt2_layer_backward(cudaStream_t, const Unit&, DType, bool, int,             \
                                                           const LayerActs&, const T*, const Rows&);                 \
  template void GpuTransformerT<T>::tp_embedding_forward(cudaStream_t, const Unit&, const std::int32_t*, int*);     \
  template void GpuTransformerT<T>::tp_embedding_rows_clear(cudaStream_t, const Unit&, DType);                      \
  template void GpuTransformerT<T>::tp_logits(cudaStream_t, const Unit&, const Unit&);                              \
  template void GpuTransformerT<T>::tp_loss(cudaStream_t, const std::int32_t*, float*, int*, bool, float,           \
                                            const float*);                                                           \
  template void GpuTransformerT<T>::tp_head_backward(cudaStream_t, const Unit&, const Unit&, DType, bool);         \
  template void GpuTransformerT<T>::tp_reduce_piece(cudaStream_t, T*, int, int);                                   \
  template void GpuTransformerT<T>::tp_wait_piece(cudaStream_t, int);
CUTRAIN_TP_MEMBERS(bf16)
CUTRAIN_TP_MEMBERS(f16)
#undef CUTRAIN_TP_MEMBERS

}  // namespace cutrain::model
