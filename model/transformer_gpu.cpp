#include "model/transformer_gpu.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "kernels/cross_entropy.cuh"
#include "kernels/kd_loss.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/token_drop.cuh"
#include "kernels/vocab_parallel_loss.cuh"
#include "runtime/check.h"
#include "model/kernel_costs.h"
#include "model/linear_param_grads.h"
#include "model/timed_call.h"
#include "runtime/nvtx.h"
#include "runtime/timing.h"

namespace cutrain::model {

using kernels::GemmEpilogue;

template <typename T>
GpuTransformerT<T>::GpuTransformerT(const TransformerParams& table, int B, int S, bool checkpointing, bool causal,
                               CachingAllocator& alloc, bool recompute_gelu, std::vector<int> drop_layers,
                               int max_pred, comm::Communicator* moe_ep_group, std::size_t max_tokens,
                               bool deterministic_attention)
    : table_(table),
      B_(B),
      S_(S),
      M_(B * S),
      Bfull_(B),
      Sfull_(S),
      cap_(std::max(std::size_t(B) * std::size_t(S), max_tokens)),
      stage_end_(table.dims().layers + 2),
      checkpointing_(checkpointing),
      recompute_gelu_(recompute_gelu && !checkpointing && table.dims().arch == Arch::Gpt2),
      deterministic_attention_(deterministic_attention),
      alloc_(alloc) {
  const ModelDims& d = table.dims();
  CUTRAIN_CHECK(B > 0 && S > 0, "gpu model: batch and seq must be positive, got B=", B, " S=", S);
  CUTRAIN_CHECK(S <= d.max_seq, "gpu model: seq ", S, " exceeds the position table's ", d.max_seq, " rows");
  CUTRAIN_CHECK(d.head_dim() == 64 || d.head_dim() == 128, "gpu model: attention supports head_dim 64 or 128, got ",
                d.head_dim(), " (hidden_dim ", d.hidden, " / num_heads ", d.heads, ")");
  CUTRAIN_CHECK(d.hidden >= 64 && d.hidden <= 16384, "gpu model: LayerNorm supports hidden_dim in [64, 16384], got ",
                d.hidden);
  // GPT-2 is causal, BERT bidirectional, the seed model as the caller says.
  attn_ = kernels::AttentionShape{B, S, d.heads, d.head_dim(),
                                  d.arch == Arch::Gpt2 || (causal && d.arch == Arch::Simple)};
  CUTRAIN_CHECK(d.arch != Arch::Bert || drop_layers.empty(),
                "gpu model: random-LTD is not implemented for the bert architecture (its padding masks and dropout "
                "sites are per position); leave data_efficiency.random_ltd off");
  CUTRAIN_CHECK(d.arch != Arch::Bert || !d.moe.any(), "gpu model: MoE blocks are not implemented for the bert architecture");
  CUTRAIN_CHECK((std::is_same_v<T, bf16>) || !d.moe.any(),
                "gpu model: MoE blocks run in bf16 only; fp16 training (fp16.enabled) needs a dense model");
  CUTRAIN_CHECK(max_pred >= 0 && max_pred <= S, "gpu model: max_predictions_per_seq must lie in [0, seq ", S,
                "] (0: every position), got ", max_pred);
  CUTRAIN_CHECK(max_pred == 0 || d.arch == Arch::Bert,
                "gpu model: max_predictions_per_seq applies to the bert architecture's masked-LM head, got ", max_pred);
  if (d.arch == Arch::Bert) {
    K_ = mlm_slots(S, max_pred);
    P_ = B * K_;
  }
  std::sort(drop_layers.begin(), drop_layers.end());
  drop_layers.erase(std::unique(drop_layers.begin(), drop_layers.end()), drop_layers.end());
  for (int l : drop_layers) {
    CUTRAIN_CHECK(l >= 0 && l < d.layers, "gpu model: random-LTD block ", l, " outside the model's ", d.layers);
    CUTRAIN_CHECK(!d.moe.is_moe(l), "gpu model: random-LTD on MoE block ", l, " is not implemented");
  }
  drop_layers_ = std::move(drop_layers);
  gemm_ = std::make_unique<kernels::Gemm>(&alloc);
  moe_.resize(std::size_t(d.layers));
  for (int l = 0; l < d.layers; ++l) {
    if (!d.moe.is_moe(l)) continue;
    const MoeConfig c = d.moe.layer_config(l, d.hidden, d.ffn());
    validate(c, M_, "gpu model: block " + std::to_string(l) + "'s MoE layer");
    moe_[std::size_t(l)] = std::make_unique<MoeLayerGpu>(c, M_, alloc, moe_ep_group);
  }
}

// Block l's MoE layer in place of the FFN: x [M, hidden] -> y. Its routing figures merge into
// the layer's step figures on the device (training forwards only, not a recompute's); the host
// reads them after the step (stage_moe_stats, collect_moe_stats). MoE blocks run in bf16 only (fp16 is refused at
// construction).
template <typename T>
void GpuTransformerT<T>::moe_forward(cudaStream_t s, const Unit& U, int l, const T* x, T* y) {
  if constexpr (!std::is_same_v<T, bf16>) {
    CUTRAIN_FAIL("gpu model: MoE blocks run in bf16 only");  // refused at construction already
  } else {
    MoeLayerGpu& layer = *moe_[std::size_t(l)];
    // Evaluation draws with seed 0, as the CPU reference model's (set_moe_mode(false)): only
    // use_rts reads it there (the gate noise is training's), so both devices keep the same routes.
    layer.forward(s, U.w(table_.layer(l).moe), x, y, M_, moe_train_, moe_train_ ? moe_forward_seed_of(moe_micro_) : 0,
                  moe_train_ && moe_seed_words_ ? moe_seed_words_ + moe_micro_ : nullptr);  // eval: never captured
    if (moe_train_ && !moe_recompute_) layer.merge_step_stats(s, /*first=*/moe_micro_ == 0);
  }
}

template <typename T>
void GpuTransformerT<T>::stage_moe_stats(cudaStream_t s) {
  for (const auto& m : moe_)
    if (m) m->stage_step_stats(s);
}

template <typename T>
const std::vector<MoeBlockStats>& GpuTransformerT<T>::collect_moe_stats() {
  moe_stats_.clear();
  for (int l = 0; l < int(moe_.size()); ++l) {
    if (!moe_[std::size_t(l)]) continue;
    MoeBlockStats b = moe_[std::size_t(l)]->staged_step_stats();
    b.layer = l;
    moe_stats_.push_back(b);
  }
  return moe_stats_;
}

template <typename T>
std::string GpuTransformerT<T>::moe_eager_reason() const {
  for (int l = 0; l < int(moe_.size()); ++l)
    if (moe_[std::size_t(l)] && !moe_[std::size_t(l)]->capturable(moe_seed_words_ != nullptr))
      return moe_[std::size_t(l)]->eager_reason(moe_seed_words_ != nullptr);
  return "";
}

template <typename T>
GpuTransformerT<T>::~GpuTransformerT() = default;

template <typename T>
void GpuTransformerT<T>::set_tensor_parallel(TpDeviceGroup* group, const TpSlice& slice) {
  const ModelDims& d = table_.dims();
  CUTRAIN_CHECK(buffers_.empty(), "gpu model: set_tensor_parallel after the workspace was allocated");
  if (!group) {
    tp_ = nullptr;
    tps_ = TpSlice{};
    attn_.heads = d.heads;
    return;
  }
  CUTRAIN_CHECK(d.arch != Arch::Bert, "gpu model: tensor parallelism of the bert architecture is not built");
  CUTRAIN_CHECK(!d.moe.any(), "gpu model: tensor parallelism of MoE blocks is not built");
  CUTRAIN_CHECK((std::is_same_v<T, bf16>),
                "gpu model: tensor parallelism runs in bf16 only (its group sums bf16); fp16 training (fp16.enabled) "
                "refuses it");
  CUTRAIN_CHECK(slice.size == group->size() && slice.rank == group->rank(), "gpu model: a tensor-parallel slice of rank ",
                slice.rank, " of ", slice.size, " given a group in which this is rank ", group->rank(), " of ",
                group->size());
  const int T_ = slice.size;
  CUTRAIN_CHECK(T_ >= 1 && (slice.head_end - slice.head_begin) * T_ == d.heads &&
                    (slice.ffn_end - slice.ffn_begin) * T_ == d.ffn() &&
                    (slice.vocab_end - slice.vocab_begin) * T_ == d.vocab_rows(),
                "gpu model: a tensor-parallel slice of rank ", slice.rank, " of ", T_, " (heads [", slice.head_begin, ", ",
                slice.head_end, "), FFN [", slice.ffn_begin, ", ", slice.ffn_end, "), vocabulary [", slice.vocab_begin,
                ", ", slice.vocab_end, ")) does not hold 1/", T_, " of the model's ", d.heads, " heads, ", d.ffn(),
                " FFN columns and ", d.vocab_rows(), " vocabulary rows (expected parallel::make_tp_slice's)");
  CUTRAIN_CHECK(slice.pieces >= 1 && (slice.pieces == 1 || T_ > 1), "gpu model: Domino's ", slice.pieces,
                " pieces split a tensor-parallel group's all-reduces: expected 1 piece, or a group of more than one "
                "rank, found ", T_);
  CUTRAIN_CHECK(Bfull_ % slice.pieces == 0, "gpu model: Domino's ", slice.pieces,
                " pieces do not divide the micro-batch of ", Bfull_, " sequences (a piece holds whole sequences)");
  CUTRAIN_CHECK(T_ == 1 || drop_layers_.empty(),
                "gpu model: random-LTD with a tensor-parallel group of ", T_, " ranks is not built");
  CUTRAIN_CHECK(T_ == 1 || !distill_, "gpu model: distillation with a tensor-parallel group of ", T_,
                " ranks is not built (the teacher's logits are whole rows)");
  tp_ = group;
  tps_ = slice;
  tp_runs_ = tp_block_runs(d, slice);
  attn_.heads = slice.head_end - slice.head_begin;  // attention over the rank's heads
  tp_ready_.clear();
  tp_done_.clear();
  tp_comm_stream_.reset();
  if (slice.pieces > 1) {
    tp_comm_stream_ = std::make_unique<Stream>();
    for (int p = 0; p < slice.pieces; ++p) {
      tp_ready_.emplace_back(/*timing=*/false);
      tp_done_.emplace_back(/*timing=*/false);
    }
  }
}

template <typename T>
void GpuTransformerT<T>::tp_all_reduce(cudaStream_t s, T* buf, int rows) {
  if (!tp_) return;
  if constexpr (!std::is_same_v<T, bf16>) {
    CUTRAIN_FAIL("gpu model: tensor parallelism runs in bf16 only");  // refused by set_tensor_parallel already
  } else {
    const std::size_t n = std::size_t(rows) * table_.dims().hidden;
    timed(s, "tp_allreduce", cost::Cost{0.0, 2.0 * double(n) * sizeof(bf16)}, [&] { tp_->all_reduce_sum(s, buf, n); });
  }
}

template <typename T>
void GpuTransformerT<T>::set_stage(int first, int end) {
  const ModelDims& d = table_.dims();
  const int n = d.layers + 2;
  CUTRAIN_CHECK(0 <= first && first < end && end <= n, "gpu model: pipeline stage layers [", first, ", ", end,
                "): expected a non-empty range of the model's ", n, " layers (embedding, blocks, head)");
  CUTRAIN_CHECK(buffers_.empty(), "gpu model: set_stage after the workspace was allocated");
  const bool whole = first == 0 && end == n;
  CUTRAIN_CHECK(whole || d.arch == Arch::Simple, "gpu model: a pipeline stage of part of the model (layers [", first,
                ", ", end, ")) is built for the seed architecture only, found --model ",
                d.arch == Arch::Gpt2 ? "gpt2 (its block output is fused into the next LayerNorm and its head reads the "
                                       "embedding)"
                                     : "bert (its head reads the embedding)");
  CUTRAIN_CHECK(whole || !d.moe.any(), "gpu model: a pipeline stage of part of the model with MoE blocks is not built");
  CUTRAIN_CHECK(whole || drop_layers_.empty(),
                "gpu model: a pipeline stage of part of the model with random-LTD is not built");
  stage_first_ = first;
  stage_end_ = end;
}

template <typename T>
void* GpuTransformerT<T>::take(cudaStream_t s, std::size_t bytes) {
  buffers_.emplace_back(alloc_, bytes, s);
  workspace_bytes_ += bytes;
  return buffers_.back().get();
}

template <typename T>
void GpuTransformerT<T>::allocate(cudaStream_t s) {
  const ModelDims& d = table_.dims();
  if (d.arch == Arch::Bert) return allocate_bert(s);
  // Sized for the capacity: any shape of set_shape() runs in these buffers.
  const std::size_t M = cap_, h = d.hidden, F = d.ffn(), V = d.vocab_rows(), H = d.heads;
  auto bf = [&](std::size_t n) { return take_n<T>(s, n); };
  auto f32 = [&](std::size_t n) { return take_n<float>(s, n); };
  // The stage's block inputs and output (every one for the whole model) and its blocks'
  // activations; the other entries stay null.
  const int b0 = block_first(), b1 = block_end();
  xs_.assign(std::size_t(d.layers) + 1, nullptr);
  for (int i = b0; i <= b1; ++i) xs_[std::size_t(i)] = bf(M * h);
  acts_.assign(checkpointing_ ? 1 : std::size_t(d.layers), LayerActs{});
  T* shared_g = recompute_gelu_ && b1 > b0 ? bf(M * F) : nullptr;
  for (std::size_t i = 0; i < acts_.size(); ++i) {
    if (checkpointing_ ? b1 == b0 : int(i) < b0 || int(i) >= b1) continue;
    LayerActs& a = acts_[i];
    a.qkv = bf(M * 3 * h);
    a.att = bf(M * h);
    a.s1 = bf(M * h);
    a.x1 = bf(M * h);
    a.f = bf(M * F);
    a.g = shared_g ? shared_g : bf(M * F);
    a.s2 = bf(M * h);
    a.lse = f32(M * H);  // [rows, H, seq]
    a.mean1 = f32(M);
    a.rstd1 = f32(M);
    a.mean2 = f32(M);
    a.rstd2 = f32(M);
  }
  if (has_head()) logits_ = bf(M * V);
  if (d.arch == Arch::Gpt2) {
    lnf_ = bf(M * h);
    mean_f_ = f32(M);
    rstd_f_ = f32(M);
  }
  if (!drop_layers_.empty()) {  // random-LTD's kept rows (at most M of them)
    xk_.resize(checkpointing_ ? 1 : drop_layers_.size());
    for (auto& x : xk_) x = bf(M * h);
    if (d.arch != Arch::Gpt2) xk_out_ = bf(M * h);
    dxk_ = bf(M * h);
  }
  dx_ = bf(M * h);
  dh_ = bf(M * h);
  d4h_ = bf(M * F);
  dqkv_ = bf(M * 3 * h);
  if (sharded()) {
    // The packed slices of the sharded GEMMs (the widest of QKV's [3 h/T, h], the out-projection's
    // [h, h/T] and FC2's [h, F/T]; gradients up to fp32), the loss's row statistics and the zero
    // position table of ranks other than 0.
    const std::size_t hl = std::size_t(tps_.head_end - tps_.head_begin) * d.head_dim();
    const std::size_t Fp = std::size_t(tps_.ffn_end - tps_.ffn_begin);
    const std::size_t packed = std::max(3 * hl * h, h * Fp);
    tp_w_ = bf(packed);
    tp_b_ = bf(3 * hl);
    tp_gw_ = take(s, packed * sizeof(float));
    tp_gb_ = take(s, 3 * hl * sizeof(float));
    tp_stats_ = f32(3 * M);
    tp_zero_pos_ = bf(std::size_t(Sfull_) * h);
    CUTRAIN_CUDA_CHECK(cudaMemsetAsync(tp_zero_pos_, 0, std::size_t(Sfull_) * h * sizeof(T), s));
  }
  // One scratch for every reduction: the kernels run in order on one stream. Sized for the
  // constructor's shape and for the capacity in rows of S (each size grows with the rows);
  // set_shape() checks a new shape against it.
  const int cap_rows = int((cap_ + std::size_t(Sfull_) - 1) / std::size_t(Sfull_));
  scratch_size_ = std::max<std::size_t>({scratch_bytes(Bfull_, Sfull_), scratch_bytes(cap_rows, Sfull_), 256});
  scratch_ = take(s, scratch_size_);
}

template <typename T>
std::size_t GpuTransformerT<T>::scratch_bytes(int rows, int seq) const {
  const ModelDims& d = table_.dims();
  const int M = rows * seq, h = d.hidden, F = d.ffn(), V = d.vocab_rows();
  std::size_t sc = 0;
  for (int n : {3 * h, h, F, V}) sc = std::max(sc, kernels::bias_grad_scratch_bytes(M, n));
  sc = std::max(sc, kernels::layernorm_backward_scratch_bytes(M, d.hidden));
  sc = std::max(sc, kernels::embedding_backward_scratch_bytes(rows, seq, d.hidden, d.vocab_rows()));
  kernels::AttentionShape a = attn_;
  a.batch = rows;
  a.seq = seq;
  sc = std::max(sc, kernels::attention_backward_scratch_bytes(a, deterministic_attention_));
  sc = std::max(sc, kernels::cross_entropy_scratch_bytes(M));
  sc = std::max(sc, kernels::kd_loss_scratch_bytes(M));
  if (sharded()) {  // the slices' bias gradients and the vocabulary-parallel loss
    const int hl = (tps_.head_end - tps_.head_begin) * d.head_dim(), Fp = tps_.ffn_end - tps_.ffn_begin;
    for (int n : {3 * hl, Fp, vocab_slice()}) sc = std::max(sc, kernels::bias_grad_scratch_bytes(M, n));
    sc = std::max(sc, kernels::vocab_parallel_ce_scratch_bytes(M));
  }
  return sc;
}

template <typename T>
void GpuTransformerT<T>::set_shape(int rows, int seq) {
  if (rows == B_ && seq == S_) return;
  const ModelDims& d = table_.dims();
  CUTRAIN_CHECK(rows > 0 && seq > 0 && seq <= Sfull_ && std::size_t(rows) * std::size_t(seq) <= cap_,
                "gpu model: micro-batch ", rows, " x ", seq, " outside the sequence length ", Sfull_, " and the ",
                cap_, " tokens the workspace holds");
  const bool full = rows == Bfull_ && seq == Sfull_;
  // random-LTD's blocks run at rows x kept of the new shape (kept < seq: set_token_drop after this).
  CUTRAIN_CHECK(full || !d.moe.any(), "gpu model: micro-batch ", rows, " x ", seq,
                " (a sequence-length curriculum) is not built for MoE blocks");
  // BERT: its [PAD]-padded micro-batch cut to a shorter length (issue #20's padding to the longest
  // sequence); the masked-LM head keeps its B x max_pred slots, so the rows stay and the length
  // holds the slots.
  CUTRAIN_CHECK(d.arch != Arch::Bert || (rows == Bfull_ && seq >= K_), "gpu model: bert micro-batch ", rows, " x ",
                seq, ": expected ", Bfull_, " rows of at least max_predictions_per_seq ", K_, " tokens");
  CUTRAIN_CHECK(buffers_.empty() || scratch_bytes(rows, seq) <= scratch_size_, "gpu model: micro-batch ", rows, " x ",
                seq, " needs ", scratch_bytes(rows, seq), " scratch bytes, the workspace has ", scratch_size_);
  B_ = rows;
  S_ = seq;
  M_ = rows * seq;
  attn_.batch = rows;
  attn_.seq = seq;
}

template <typename T>
void GpuTransformerT<T>::set_distillation(const Distillation* d) {
  CUTRAIN_CHECK(!d || table_.dims().arch != Arch::Bert, "gpu model: distillation of BERT's masked-LM head is not built");
  CUTRAIN_CHECK(!d || (std::is_same_v<T, bf16>),
                "gpu model: distillation (Mixture-of-Students) runs in bf16 only (its kd_loss kernel and the teacher's "
                "logits are bf16); fp16 training (fp16.enabled) refuses it");
  CUTRAIN_CHECK(!d || (d->teacher_logits && d->d_kd_loss && d->ld_t >= table_.dims().vocab),
                "gpu model: distillation needs the teacher's logits (leading dimension >= vocab ", table_.dims().vocab,
                ", got ", d ? d->ld_t : 0, ") and a loss word");
  CUTRAIN_CHECK(!d || !sharded(), "gpu model: distillation with a tensor-parallel group of ", tps_.size,
                " ranks is not built (the teacher's logits are whole rows)");
  if (d) distill_ = *d;
  else distill_.reset();
}

template <typename T>
void GpuTransformerT<T>::release_workspace() {
  buffers_.clear();
  xs_.clear();
  acts_.clear();
  logits_ = dx_ = dh_ = d4h_ = dqkv_ = lnf_ = nullptr;
  tp_w_ = tp_b_ = tp_zero_pos_ = nullptr;
  tp_gw_ = tp_gb_ = nullptr;
  tp_stats_ = nullptr;
  xk_.clear();
  xk_out_ = dxk_ = nullptr;
  mean_f_ = rstd_f_ = nullptr;
  key_mask_ = nullptr;
  emb_sum_ = head_d_ = head_g_ = head_n_ = head_x_ = nullptr;
  mlm_pos_ = mlm_labels_ = mlm_slot_ = nullptr;
  mean_e_ = rstd_e_ = mean_h_ = rstd_h_ = nullptr;
  scratch_ = nullptr;
  workspace_bytes_ = 0;
}

template <typename T>
void GpuTransformerT<T>::set_token_drop(int kept, const std::int32_t* d_indices) {
  const bool on = kept > 0 && kept < S_ && !drop_layers_.empty();
  CUTRAIN_CHECK(!on || d_indices, "gpu model: random-LTD with ", kept, " kept tokens needs its indices");
  kept_ = on ? kept : 0;
  drop_idx_ = on ? d_indices : nullptr;
}

template <typename T>
typename GpuTransformerT<T>::Rows GpuTransformerT<T>::kept_rows() const {
  kernels::AttentionShape a = attn_;
  a.seq = kept_;
  return Rows{B_ * kept_, a, dxk_};
}

template <typename T>
int GpuTransformerT<T>::drop_slot(int l) const {
  if (!drop_on_ || kept_ == 0) return -1;
  const auto it = std::lower_bound(drop_layers_.begin(), drop_layers_.end(), l);
  return it != drop_layers_.end() && *it == l ? int(it - drop_layers_.begin()) : -1;
}

// The kept tokens are each sequence's, in ascending position order, and the block sees only them:
// for the causal (GPT) model, causal attention over their order is exactly the causal mask of the
// full sequence restricted to them (token j precedes token i in the kept order iff its position
// is lower), and the positions were added at the embedding, so no mask or position is remapped.
template <typename T>
void GpuTransformerT<T>::dropped_layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a, int slot,
                                           bool recompute) {
  const ModelDims& d = table_.dims();
  const int h = d.hidden;
  const bool gpt2 = d.arch == Arch::Gpt2;
  const Rows kr = kept_rows();
  const std::size_t rows = std::size_t(B_) * kept_;
  T* xk = xk_[checkpointing_ ? 0 : std::size_t(slot)];
  const std::int32_t* idx = drop_idx_ + std::size_t(slot) * rows;
  if (gpt2 && !recompute && l > 0 && drop_slot(l - 1) < 0) {
    // GPT-2's block output (s1 + its MLP's, in dh_) is otherwise summed by the next LN1: here
    // every token needs it (the dropped ones bypass this block with it), so the fused residual
    // LayerNorm writes the sum over all rows; its normalized rows are redone on the kept tokens.
    const LayerIndex& L = table_.layer(l);
    const LayerActs& prev = acts_[checkpointing_ ? 0 : std::size_t(l - 1)];
    timed(s, "ltd_sum", cost::layernorm_residual_forward(M_, h), [&] {
      kernels::layernorm_residual_forward(s, dh_, prev.s1, xs_[l], a.x1, a.mean1, a.rstd1, U.w(L.norm1_w),
                                          U.w(L.norm1_b), M_, h);
    });
  }
  timed(s, "ltd_gather", cost::token_move(rows, h),
        [&] { kernels::token_gather(s, xs_[l], idx, xk, B_, S_, kept_, h); });
  if (gpt2) gpt2_layer_forward(s, U, l, a, nullptr, xk, false, kr);
  else layer_forward(s, U, l, a, xk, xk_out_, kr);
  if (recompute) return;
  // xs_[l+1]: the block's output rows at the kept positions, xs_[l]'s rows (the bypass) at the
  // others, in one pass over the stream.
  timed(s, "ltd_merge", cost::token_merge(std::size_t(M_), rows, h, gpt2), [&] {
    kernels::token_merge(s, xs_[l], gpt2 ? a.s1 : xk_out_, gpt2 ? dh_ : nullptr, idx, xs_[l + 1], B_, S_, kept_, h);
  });
}

template <typename T>
typename GpuTransformerT<T>::Unit GpuTransformerT<T>::unit(ParamAccess& P, cudaStream_t s, int u, char* G, DType gt) {
  const std::size_t es = dtype_size(gt);
  return Unit{&table_, static_cast<const T*>(P.acquire(s, u)), G ? G + P.grad_offset(u) * es : nullptr,
              table_.units().at(std::size_t(u)).begin, es};
}

template <typename T>
void GpuTransformerT<T>::layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a, const T* x_in,
                                   T* x_out, const Rows& rows) {
  if (sharded()) return tp_layer_forward(s, U, l, a, x_in, x_out, rows);
  const LayerIndex& L = table_.layer(l);
  const int h = table_.dims().hidden, F = table_.dims().ffn();
  auto w = [&](int idx) { return U.w(idx); };
  T* proj = dh_;  // free during forward and before a layer's backward uses it
  const auto& A = rows.attn;
  {
    TimedRegion r("attn", s);
    timed(s, "qkv", cost::gemm_forward(rows.M, 3 * h, h), [&] {
      gemm_->forward(s, x_in, w(L.in_proj_w), w(L.in_proj_b), a.qkv, rows.M, 3 * h, h, GemmEpilogue::Bias);
    });
    timed(s, "attention", cost::attention_forward(A.batch, A.seq, A.heads, A.head_dim, A.causal),
          [&] { kernels::attention_forward(s, a.qkv, a.att, a.lse, rows.attn); });
    timed(s, "out_proj", cost::gemm_forward(rows.M, h, h), [&] {
      gemm_->forward(s, a.att, w(L.out_proj_w), w(L.out_proj_b), proj, rows.M, h, h, GemmEpilogue::Bias);
    });
    tp_all_reduce(s, proj, rows.M);  // row-parallel: the heads' partial sums
    timed(s, "ln1", cost::layernorm_residual_forward(rows.M, h), [&] {
      kernels::layernorm_residual_forward(s, proj, x_in, a.s1, a.x1, a.mean1, a.rstd1, w(L.norm1_w), w(L.norm1_b), rows.M,
                                          h);
    });
  }
  if (moe_[std::size_t(l)]) {
    TimedRegion r("moe", s);
    moe_forward(s, U, l, a.x1, proj);
    timed(s, "ln2", cost::layernorm_residual_forward(rows.M, h), [&] {
      kernels::layernorm_residual_forward(s, proj, a.x1, a.s2, x_out, a.mean2, a.rstd2, w(L.norm2_w), w(L.norm2_b), rows.M,
                                          h);
    });
    return;
  }
  {
    TimedRegion r("mlp", s);
    timed(s, "fc1", cost::gemm_forward(rows.M, F, h), [&] {
      gemm_->forward(s, a.x1, w(L.ff0_w), w(L.ff0_b), a.f, rows.M, F, h, GemmEpilogue::Bias);
    });
    timed(s, "gelu", cost::gelu_forward(std::size_t(rows.M) * F), [&] {
      kernels::gelu_forward(s, a.f, nullptr, nullptr, a.g, std::size_t(rows.M), F, kernels::GeluKind::Erf);
    });
    timed(s, "fc2", cost::gemm_forward(rows.M, h, F), [&] {
      gemm_->forward(s, a.g, w(L.ff2_w), w(L.ff2_b), proj, rows.M, h, F, GemmEpilogue::Bias);
    });
    tp_all_reduce(s, proj, rows.M);  // row-parallel: the FFN columns' partial sums
    timed(s, "ln2", cost::layernorm_residual_forward(rows.M, h), [&] {
      kernels::layernorm_residual_forward(s, proj, a.x1, a.s2, x_out, a.mean2, a.rstd2, w(L.norm2_w), w(L.norm2_b), rows.M,
                                          h);
    });
  }
}

template <typename T>
void GpuTransformerT<T>::layer_backward(cudaStream_t s, const Unit& U, DType gt, bool acc, int l, const LayerActs& a,
                                    const T* x_in, const Rows& rows) {
  if (sharded()) return tp_layer_backward(s, U, gt, acc, l, a, x_in, rows);
  const LayerIndex& L = table_.layer(l);
  const int h = table_.dims().hidden, F = table_.dims().ffn();
  const std::size_t es = dtype_size(gt);
  auto w = [&](int idx) { return U.w(idx); };
  auto g = [&](int idx) { return U.g(idx); };
  const auto& A = rows.attn;
  // One linear layer's backward (y = x W^T + b, W [N, K], dy [M, N]): dW and db (accumulated per
  // `acc`; db in the GEMM's epilogue where the measured rule says so), then dx; beta 1 adds dx to
  // what `dx` holds (the residual's share). Regions <name>_dw_db or <name>_dw, <name>_db
  // (linear_param_grads.h), then <name>_dx.
  auto linear_backward = [&](LinearRegions n, const T* dy, const T* x, int w_idx, int b_idx, T* dx, int N, int K,
                             float beta) {
    param_grads(s, n, dy, x, g(w_idx), g(b_idx), gt, acc, rows.M, N, K);
    timed(s, n.dx, cost::gemm_grad_input(rows.M, N, K, beta != 0.f),
          [&] { gemm_->grad_input(s, dy, w(w_idx), dx, rows.M, N, K, beta); });
  };
  if (moe_[std::size_t(l)]) {
    TimedRegion r("moe", s);
    timed(s, "ln2", cost::layernorm_backward(rows.M, h, es, acc), [&] {
      kernels::layernorm_backward(s, rows.dx, a.s2, a.mean2, a.rstd2, w(L.norm2_w), nullptr, rows.dx, g(L.norm2_w),
                                  g(L.norm2_b), gt, acc, scratch_, rows.M, h);
    });
    // rows.dx = d s2 (the residual's share of d x1) += the MoE layer's d x1; aux_grad: the objective's
    // coefficient of l_aux times the micro-batch's loss scale.
    if constexpr (std::is_same_v<T, bf16>)
      moe_[std::size_t(l)]->backward(s, U.w(L.moe), a.x1, rows.dx,
                                     float(table_.dims().moe.loss_coeff) * moe_grad_scale_, rows.dx, U.g(L.moe), gt, acc,
                                     /*dx_accumulate=*/true);
  } else {
    TimedRegion r("mlp", s);
    // rows.dx holds dL/d(block output); LN2 backward in place gives d s2 (= d x1 residual share = d ff out).
    timed(s, "ln2", cost::layernorm_backward(rows.M, h, es, acc), [&] {
      kernels::layernorm_backward(s, rows.dx, a.s2, a.mean2, a.rstd2, w(L.norm2_w), nullptr, rows.dx, g(L.norm2_w),
                                  g(L.norm2_b), gt, acc, scratch_, rows.M, h);
    });
    linear_backward({"fc2_dw", "fc2_db", "fc2_dw_db", "fc2_dx"}, rows.dx, a.g, L.ff2_w, L.ff2_b, d4h_, h, F, 0.f);
    timed(s, "gelu", cost::gelu_backward(std::size_t(rows.M) * F),
          [&] { kernels::gelu_backward(s, d4h_, a.f, d4h_, std::size_t(rows.M) * F, kernels::GeluKind::Erf); });
    linear_backward({"fc1_dw", "fc1_db", "fc1_dw_db", "fc1_dx"}, d4h_, a.x1, L.ff0_w, L.ff0_b, rows.dx, F, h, 1.f);  // rows.dx = d x1
    tp_all_reduce(s, rows.dx, rows.M);  // column-parallel FC1's input gradient
  }
  {
    TimedRegion r("attn", s);
    timed(s, "ln1", cost::layernorm_backward(rows.M, h, es, acc), [&] {
      kernels::layernorm_backward(s, rows.dx, a.s1, a.mean1, a.rstd1, w(L.norm1_w), nullptr, rows.dx, g(L.norm1_w),
                                  g(L.norm1_b), gt, acc, scratch_, rows.M, h);
    });
    linear_backward({"out_proj_dw", "out_proj_db", "out_proj_dw_db", "out_proj_dx"}, rows.dx, a.att, L.out_proj_w, L.out_proj_b, dh_, h, h, 0.f);
    timed(s, "attention", cost::attention_backward(A.batch, A.seq, A.heads, A.head_dim, A.causal),
          [&] {
            kernels::attention_backward(s, a.qkv, a.att, dh_, a.lse, dqkv_, scratch_, rows.attn,
                                        deterministic_attention_);
          });
    linear_backward({"qkv_dw", "qkv_db", "qkv_dw_db", "qkv_dx"}, dqkv_, x_in, L.in_proj_w, L.in_proj_b, rows.dx, 3 * h, h, 1.f);  // rows.dx = d x_in
    tp_all_reduce(s, rows.dx, rows.M);  // column-parallel QKV's input gradient
  }
}

// Embeddings, every block and the output projection into logits_ [M, vocab_rows], then `loss`
// (training's or evaluation's cross-entropy) in the same "head" region: the forward both run.
// Each unit is acquired just before its first kernel and released after its last; the head
// stays acquired for the caller (its backward reads output_w).
template <typename T>
template <typename Loss>
typename GpuTransformerT<T>::Unit GpuTransformerT<T>::forward(cudaStream_t s, ParamAccess& P, char* G, DType gt,
                                                              const std::int32_t* tokens, const std::int32_t* labels,
                                                              int* d_status, Loss&& loss) {
  const ModelDims& d = table_.dims();
  const int h = d.hidden, Vr = d.vocab_rows(), Ln = d.layers;
  const bool gpt2 = d.arch == Arch::Gpt2, bert = d.arch == Arch::Bert;
  char name[16];
  if (!has_embedding()) {
    // A later pipeline stage: its input is in xs_[block_first()] (stage_input()).
  } else if (bert) {
    const Unit E = unit(P, s, table_.embedding_unit(), G, gt);
    bert_embedding_forward(s, E, tokens, d_status);
    P.release(s, table_.embedding_unit());
  } else if (sharded()) {
    const Unit E = unit(P, s, table_.embedding_unit(), G, gt);
    tp_embedding_forward(s, E, tokens, d_status);
    P.release(s, table_.embedding_unit());
  } else {
    const Unit E = unit(P, s, table_.embedding_unit(), G, gt);
    timed(s, "embedding", cost::embedding_forward(B_, S_, h), [&] {
      // Token ids are checked against the real vocabulary: padded rows are never a token.
      kernels::embedding_forward(s, tokens, E.w(table_.embedding()), E.w(table_.pos_embedding()), xs_[0], B_, S_, h,
                                 d.vocab, d_status);
    });
    P.release(s, table_.embedding_unit());
  }
  for (int l = block_first(); l < block_end(); ++l) {
    std::snprintf(name, sizeof name, "layer%02d", l);
    TimedRegion r(name, s);
    const Unit U = unit(P, s, table_.layer_unit(l), G, gt);
    const int slot = drop_slot(l);
    if (bert) {
      bert_layer_forward(s, U, l, acts_[checkpointing_ ? 0 : l]);
    } else if (slot >= 0) {
      dropped_layer_forward(s, U, l, acts_[checkpointing_ ? 0 : l], slot, false);
    } else if (gpt2) {
      const LayerActs* prev = l > 0 ? &acts_[checkpointing_ ? 0 : l - 1] : nullptr;
      // After a dropping block its output is in xs_[l] already (scattered), not to be summed.
      gpt2_layer_forward(s, U, l, acts_[checkpointing_ ? 0 : l], prev, xs_[l], l > 0 && drop_slot(l - 1) < 0,
                         full_rows());
    } else {
      layer_forward(s, U, l, acts_[checkpointing_ ? 0 : l], xs_[l], xs_[l + 1], full_rows());
    }
    P.release(s, table_.layer_unit(l));
  }
  if (!has_head()) return Unit{};  // the stage's output is in xs_[block_end()] (stage_output())
  TimedRegion r("head", s);
  const Unit H = unit(P, s, table_.head_unit(), G, gt);
  if (gpt2 || bert) {
    // The tied head reads wte: the embedding unit again, held until the head's backward is done.
    tied_ = unit(P, s, table_.embedding_unit(), G, gt);
    if (gpt2) gpt2_head_forward(s, H, tied_);
    else bert_head_forward(s, H, tied_, labels, d_status);
    loss();
    return H;
  }
  if (sharded()) {
    tp_logits(s, H, H);
  } else {
    timed(s, "logits", cost::gemm_forward(M_, Vr, h), [&] {
      gemm_->forward(s, xs_[Ln], H.w(table_.output_w()), H.w(table_.output_b()), logits_, M_, Vr, h,
                     GemmEpilogue::Bias);
    });
  }
  loss();
  return H;
}

template <typename T>
void GpuTransformerT<T>::forward_loss(cudaStream_t s, ParamAccess& P, const std::int32_t* tokens,
                                  const std::int32_t* labels, float* d_loss, int* d_status) {
  CUTRAIN_CHECK(whole_model(), "gpu model: forward_loss runs the whole model, this one is pipeline stage layers [",
                stage_first_, ", ", stage_end_, ")");
  if (buffers_.empty()) allocate(s);
  const ModelDims& d = table_.dims();
  TimedRegion ev("eval", s);
  moe_train_ = false;  // eval_capacity_factor, no gate noise
  drop_on_ = false;     // random-LTD drops in training only
  struct TrainAgain {
    bool& t;
    ~TrainAgain() { t = true; }
  } again{moe_train_};
  // BERT: the loss over the head's gathered rows, whose labels the plan checked (d_status[1]).
  const bool bert = d.arch == Arch::Bert;
  forward(s, P, nullptr, dtype_of<T>(), tokens, labels, d_status, [&] {
    if (sharded()) return tp_loss(s, labels, d_loss, d_status, false, 1.f, nullptr);
    timed(s, "cross_entropy", cost::cross_entropy(bert ? P_ : M_, d.vocab), [&] {
      kernels::cross_entropy_forward(s, logits_, bert ? mlm_labels_ : labels, bert ? P_ : M_, d.vocab, d.vocab_rows(),
                                     d_loss, nullptr, bert ? nullptr : d_status + 1, scratch_);
    });
  });
  P.release(s, table_.head_unit());
  if (table_.tied_head()) P.release(s, table_.embedding_unit());
}

template <typename T>
void GpuTransformerT<T>::forward_backward(cudaStream_t s, ParamAccess& P, void* grads, DType gt, bool acc,
                                      const std::int32_t* tokens, const std::int32_t* labels, float grad_scale,
                                      float* d_loss, int* d_status, const float* d_loss_scale) {
  CUTRAIN_CHECK(whole_model(), "gpu model: forward_backward runs the whole model, this one is pipeline stage layers [",
                stage_first_, ", ", stage_end_, ")");
  stage_forward(s, P, grads, gt, acc, tokens, labels, grad_scale, d_loss, d_status, d_loss_scale);
  stage_backward(s, P, grads, gt, acc, tokens);
}

template <typename T>
void* GpuTransformerT<T>::stage_input(cudaStream_t s) {
  if (buffers_.empty()) allocate(s);
  return xs_[std::size_t(block_first())];
}
template <typename T>
void* GpuTransformerT<T>::stage_output(cudaStream_t s) {
  if (buffers_.empty()) allocate(s);
  return xs_[std::size_t(block_end())];
}
template <typename T>
void* GpuTransformerT<T>::stage_grad(cudaStream_t s) {
  if (buffers_.empty()) allocate(s);
  return dx_;
}

template <typename T>
void GpuTransformerT<T>::stage_forward(cudaStream_t s, ParamAccess& P, void* grads, DType gt, bool acc,
                                   const std::int32_t* tokens, const std::int32_t* labels, float grad_scale,
                                   float* d_loss, int* d_status, const float* d_loss_scale) {
  CUTRAIN_CHECK(gt == dtype_of<T>() || gt == DType::F32, "gpu model: gradients must be ", dtype_name(dtype_of<T>()),
                " (the compute dtype) or float32, got ", dtype_name(gt));
  if (buffers_.empty()) allocate(s);
  const ModelDims& d = table_.dims();
  const int V = d.vocab_rows();
  char* G = static_cast<char*>(grads);
  moe_micro_ = acc ? moe_micro_ + 1 : 0;  // the micro-batch of this step (its gate noise, the stats' merge)
  moe_grad_scale_ = grad_scale;
  drop_on_ = true;
  train_ = true;  // BERT's dropout
  struct DropOff {  // the drop (and the dropout) apply to this call's forward and the backward's
    bool& on;
    bool& train;
    ~DropOff() { on = train = false; }
  } drop_off{drop_on_, train_};
  TimedRegion fwd("fwd", s);
  held_head_ = forward(s, P, G, gt, tokens, labels, d_status, [&] {
    // The loss covers the real vocabulary; padded columns get gradient 0. BERT: over the head's
    // gathered rows, whose labels the plan checked (d_status[1]).
    if (sharded()) return tp_loss(s, labels, d_loss, d_status, true, grad_scale, d_loss_scale);
    const bool gathered = d.arch == Arch::Bert;
    const int rows = gathered ? P_ : M_;
    // Distillation (bf16 only: set_distillation refuses it for fp16): its gradient from the
    // student's logits (before the cross-entropy overwrites them) written over the teacher's, then
    // added to the LM loss's.
    if constexpr (std::is_same_v<T, bf16>) {
      if (distill_)
        timed(s, "kd_loss", cost::cross_entropy(rows, d.vocab), [&] {
          kernels::kd_loss_forward_backward(s, logits_, V, distill_->teacher_logits, distill_->ld_t, rows, d.vocab,
                                            distill_->temperature, distill_->beta * grad_scale, nullptr,
                                            distill_->d_kd_loss, distill_->teacher_logits, distill_->ld_t, false,
                                            scratch_);
        });
    }
    timed(s, "cross_entropy", cost::cross_entropy(rows, d.vocab), [&] {
      kernels::cross_entropy_forward_backward(s, logits_, gathered ? mlm_labels_ : labels, rows, d.vocab, V, d_loss,
                                              nullptr, gathered ? nullptr : d_status + 1, scratch_, -100,
                                              grad_scale * (distill_ ? distill_->alpha : 1.f), d_loss_scale);
    });
    if constexpr (std::is_same_v<T, bf16>) {
      if (distill_)
        timed(s, "kd_add", cost::cross_entropy(rows, d.vocab), [&] {
          kernels::kd_add_grad(s, logits_, V, distill_->teacher_logits, distill_->ld_t, rows, d.vocab);
        });
    }
  });
}

template <typename T>
void GpuTransformerT<T>::stage_backward(cudaStream_t s, ParamAccess& P, void* grads, DType gt, bool acc,
                                    const std::int32_t* tokens) {
  CUTRAIN_CHECK(gt == dtype_of<T>() || gt == DType::F32, "gpu model: gradients must be ", dtype_name(dtype_of<T>()),
                " (the compute dtype) or float32, got ", dtype_name(gt));
  CUTRAIN_CHECK(!buffers_.empty(), "gpu model: stage_backward before its stage_forward");
  const ModelDims& d = table_.dims();
  const int h = d.hidden, V = d.vocab_rows(), Ln = d.layers;
  char* G = static_cast<char*>(grads);
  const std::size_t es = dtype_size(gt);
  char name[16];
  const Unit H = held_head_;
  held_head_ = Unit{};
  drop_on_ = true;
  train_ = true;
  struct DropOff {
    bool& on;
    bool& train;
    ~DropOff() { on = train = false; }
  } drop_off{drop_on_, train_};
  TimedRegion bwd("bwd", s);
  const bool gpt2 = d.arch == Arch::Gpt2, bert = d.arch == Arch::Bert;
  if (!has_head()) {
    // A stage before the head: d(its output) is in dx_ (stage_grad()).
  } else if (gpt2 || bert) {
    TimedRegion r("head", s);
    if (gpt2) gpt2_head_backward(s, H, tied_, gt, acc);
    else bert_head_backward(s, H, tied_, gt, acc);
    P.release(s, table_.head_unit());
    P.release(s, table_.embedding_unit());
    P.grads_written(s, table_.head_unit());
  } else if (sharded()) {
    TimedRegion r("head", s);
    tp_head_backward(s, H, H, gt, acc);
    P.release(s, table_.head_unit());
    P.grads_written(s, table_.head_unit());
  } else {
    TimedRegion r("head", s);
    param_grads(s, {"dw", "db", "dw_db", "dx"}, logits_, xs_[Ln], H.g(table_.output_w()), H.g(table_.output_b()), gt,
                acc, M_, V, h);
    timed(s, "dx", cost::gemm_grad_input(M_, V, h, false),
          [&] { gemm_->grad_input(s, logits_, H.w(table_.output_w()), dx_, M_, V, h, 0.f); });
    P.release(s, table_.head_unit());
    P.grads_written(s, table_.head_unit());
  }
  for (int l = block_end() - 1; l >= block_first(); --l) {
    std::snprintf(name, sizeof name, "layer%02d", l);
    TimedRegion r(name, s);
    const LayerActs& a = acts_[checkpointing_ ? 0 : l];
    const Unit U = unit(P, s, table_.layer_unit(l), G, gt);  // the recompute reads the same gathered unit
    if (bert) {
      if (checkpointing_) {
        TimedRegion rc("recompute", s);
        bert_layer_forward(s, U, l, a);  // the same masks (same key); xs_[l+1] gets the same bits
      }
      bert_layer_backward(s, U, gt, acc, l, a);
      P.release(s, table_.layer_unit(l));
      P.grads_written(s, table_.layer_unit(l));
      continue;
    }
    const int slot = drop_slot(l);
    if (slot >= 0) {  // random-LTD: the block's backward on its kept tokens; the dropped rows keep dx_
      const Rows kr = kept_rows();
      const std::size_t rows = std::size_t(B_) * kept_;
      const std::int32_t* idx = drop_idx_ + std::size_t(slot) * rows;
      if (checkpointing_) {
        TimedRegion rc("recompute", s);
        dropped_layer_forward(s, U, l, a, slot, true);
      }
      timed(s, "ltd_gather", cost::token_move(rows, h), [&] { kernels::token_gather(s, dx_, idx, dxk_, B_, S_, kept_, h); });
      const T* xk = xk_[checkpointing_ ? 0 : std::size_t(slot)];
      if (gpt2) gpt2_layer_backward(s, U, gt, acc, l, a, xk, kr);
      else layer_backward(s, U, gt, acc, l, a, xk, kr);
      timed(s, "ltd_scatter", cost::token_move(rows, h),
            [&] { kernels::token_scatter(s, dxk_, nullptr, idx, dx_, B_, S_, kept_, h); });
      P.release(s, table_.layer_unit(l));
      P.grads_written(s, table_.layer_unit(l));
      continue;
    }
    if (checkpointing_) {
      TimedRegion rc("recompute", s);
      moe_recompute_ = true;  // the same routing (same input, params and seed), not counted twice
      if (gpt2) gpt2_layer_forward(s, U, l, a, nullptr, xs_[l], false, full_rows());  // from the stored block input
      else layer_forward(s, U, l, a, xs_[l], xs_[l + 1], full_rows());  // xs_[l+1] is no longer needed: same bits anyway
      moe_recompute_ = false;
    }
    if (gpt2) gpt2_layer_backward(s, U, gt, acc, l, a, xs_[l], full_rows());
    else layer_backward(s, U, gt, acc, l, a, xs_[l], full_rows());
    P.release(s, table_.layer_unit(l));
    P.grads_written(s, table_.layer_unit(l));
  }
  if (!has_embedding()) return;  // d(stage input) is in dx_ (stage_grad())
  const int eu = table_.embedding_unit();
  if (bert) {  // the embeddings' LayerNorm backward reads its weight: the unit is acquired
    TimedRegion r("embedding", s);
    const Unit E = unit(P, s, eu, G, gt);
    bert_embedding_backward(s, E, gt, acc, tokens);
    P.release(s, eu);
    P.grads_written(s, eu);
    return;
  }
  // The embedding backward reads no parameters: its unit is not acquired, only its gradients addressed.
  const Unit E{&table_, nullptr, G + P.grad_offset(eu) * es, table_.units().at(std::size_t(eu)).begin, es};
  // GPT-2: wte's gradient already holds the head's share (written per `acc`), so the lookup's
  // share is added; wpe's, when not accumulating, is cleared first. The seed model writes both:
  // only wpe's rows past this sequence length, which no position reaches, are cleared.
  if (!acc) {
    const ParamTensor& wpe = table_.tensor(table_.pos_embedding());
    const std::size_t from = gpt2 ? 0 : std::size_t(S_) * h * es;
    if (wpe.count * es > from)
      CUTRAIN_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(E.g(table_.pos_embedding())) + from, 0,
                                         wpe.count * es - from, s));
  }
  timed(s, "embedding", cost::embedding_backward(B_, S_, h, es), [&] {
    kernels::embedding_backward(s, dx_, tokens, E.g(table_.embedding()), E.g(table_.pos_embedding()), gt,
                                acc || gpt2, B_, S_, h, V, scratch_);
  });
  if (sharded()) tp_embedding_rows_clear(s, E, gt);  // the lookup's scatter reached every token's row
  P.grads_written(s, table_.embedding_unit());
}

template <typename T>
void GpuTransformerT<T>::param_grads(cudaStream_t s, const LinearRegions& n, const T* dy, const T* x, void* gw,
                                     void* gb, DType gt, bool acc, int M, int N, int K) {
  linear_param_grads(
      s, n, M, N, K, dtype_size(gt), acc,
      [&] { gemm_->grad_weight_bias(s, dy, x, gw, gb, gt, M, N, K, acc, scratch_); },
      [&] { gemm_->grad_weight(s, dy, x, gw, gt, M, N, K, acc); },
      [&] { kernels::bias_grad(s, dy, gb, gt, M, N, acc, scratch_); });
}

template class GpuTransformerT<bf16>;
template class GpuTransformerT<f16>;

std::unique_ptr<GpuModel> make_gpu_transformer(DType compute, const TransformerParams& table, int B, int S,
                                               bool checkpointing, bool causal, CachingAllocator& alloc,
                                               bool recompute_gelu, std::vector<int> drop_layers, int max_pred,
                                               comm::Communicator* moe_ep_group, std::size_t max_tokens,
                                               bool deterministic_attention) {
  switch (compute) {
    case DType::BF16:
      return std::make_unique<GpuTransformerT<bf16>>(table, B, S, checkpointing, causal, alloc, recompute_gelu,
                                                     std::move(drop_layers), max_pred, moe_ep_group, max_tokens,
                                                     deterministic_attention);
    case DType::F16:
      return std::make_unique<GpuTransformerT<f16>>(table, B, S, checkpointing, causal, alloc, recompute_gelu,
                                                    std::move(drop_layers), max_pred, moe_ep_group, max_tokens,
                                                    deterministic_attention);
    default:
      CUTRAIN_FAIL("gpu model: the compute dtype must be bfloat16 or float16, got ", dtype_name(compute));
  }
}

}  // namespace cutrain::model
