// @brief The GPU forward and backward of the model as a list of kernel calls (kernels/*.cuh):
// the BF16 example's post-LN blocks, GPT-2's pre-LN blocks (transformer_gpu_gpt2.cpp) or BERT's
// encoder and masked-LM head (transformer_gpu_bert.cpp; docs/bert.md), fused cross-entropy, every layer's gradients landing in the flat gradient buffer. Activations and
// scratch come from the caching allocator once, at the first call, so the call sequence is static
// (CUDA-graph capturable): no allocation, no host sync. MoE blocks (MoeDims) keep that with token
// dropping (model/moe_layer.h's slot layout; a gate noise's seeds from set_moe_seed_words); without
// dropping or with an expert-parallel group each MoE layer syncs its stream once per forward for
// the routing counts, so such a model is not capturable (moe_capturable()).
// random-LTD (set_token_drop): a dropping block runs on the gathered kept tokens of each sequence
// (kernels/token_drop.cuh) and its output is scattered back; the dropped rows bypass it.
// BERT's masked-LM head runs on the labelled rows only (kernels/mlm_gather.cuh): B x max_pred
// slots gathered from the final hidden rows, d(hidden) scattered back.
// The compute dtype: GpuTransformerT<T> holds its parameters' copy, activations and 16-bit gradients
// in T, bf16 or fp16 (fp16 training; the kernels' fp16 instances, fp32 math), one class template
// instantiated for both; GpuModel is what the engine holds, make_gpu_transformer the one place
// that picks T from a DType. MoE blocks are bf16 only (their layer is not templated).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention.cuh"
#include "kernels/gemm.cuh"
#include "model/linear_param_grads.h"
#include "model/moe_layer.h"
#include "model/moe_stats.h"
#include "model/tensor_parallel.h"
#include "model/tp_slice_runs.h"
#include "model/transformer_params.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace cutrain::model {

// Where the model finds each parameter unit's weights and writes its gradients (units:
// TransformerParams::units()). The plain engine: one flat buffer (FlatParams). ZeRO stage 3:
// a unit gathered into a buffer of its own just before use (parallel/zero_stage3.h).
class ParamAccess {
 public:
  virtual ~ParamAccess() = default;
  // Before the first kernel on `s` that reads unit `u`'s params: the unit's params (of the model's
  // compute dtype), indexed from the unit's first element (tensor t at t.offset - unit.begin).
  // Valid on `s` until release().
  virtual const void* acquire(cudaStream_t s, int u) = 0;
  // After the last kernel on `s` that reads them.
  virtual void release(cudaStream_t s, int u) = 0;
  // Element offset of unit u's gradients in the gradient buffer (tensors keep their in-unit offsets).
  virtual std::size_t grad_offset(int u) const = 0;
  // After the last kernel on `s` that writes unit u's gradients in one micro-batch's backward.
  virtual void grads_written(cudaStream_t s, int u) {}
};

// Every unit in one flat buffer of 16-bit params (`param_type`: bf16 or fp16) at its
// TransformerParams offsets; gradients likewise.
class FlatParams final : public ParamAccess {
 public:
  FlatParams(const TransformerParams& table, const void* params, DType param_type = DType::BF16)
      : table_(table), params_(static_cast<const char*>(params)), es_(dtype_size(param_type)) {}
  const void* acquire(cudaStream_t, int u) override { return params_ + table_.units().at(std::size_t(u)).begin * es_; }
  void release(cudaStream_t, int) override {}
  std::size_t grad_offset(int u) const override { return table_.units().at(std::size_t(u)).begin; }

 private:
  const TransformerParams& table_;
  const char* params_;
  std::size_t es_;
};

// The tensor-parallel group of the GPU model (Megatron's layout): this rank's place in it and the
// in-place sums (and the loss's max) over its ranks on a stream. parallel/tp_device_group.h
// implements it over a device communicator (NCCL); the tests over a loopback transport of threads.
// The model issues the blocks' all-reduces through it: forward after the out-projection and FC2
// (the row-parallel partial sums), backward after FC1's and QKV's input gradients (the
// column-parallel inputs); with more than one rank also the vocabulary-parallel embedding's lookup
// (forward), the loss's row max and (sum-exp, target logit) (forward, fp32) and the head's input
// gradient (backward). Every rank of the group calls each one with the same count, in the same order.
class TpDeviceGroup {
 public:
  virtual ~TpDeviceGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual void all_reduce_sum(cudaStream_t s, bf16* buf, std::size_t count) = 0;
  // fp32 in place: the sum, or with `max` the maximum (the vocabulary-parallel loss's statistics).
  virtual void all_reduce_f32(cudaStream_t s, float* buf, std::size_t count, bool max) = 0;
};

// Knowledge distillation (Mixture-of-Students; kernels/kd_loss.cuh) for the next forward_backward
// calls: the teacher's logits of the same micro-batch (bf16 [B*S, ld_t], the first vocab columns
// real; overwritten: the distillation's gradient is written over them), the temperature, the
// term's weight beta and the LM loss's weight alpha. The objective's logits gradient is then
// grad_scale * (alpha * d ce + beta * d(T^2 * mean KL)), the MoE aux loss's share unchanged, and
// T^2 * mean KL (without beta) goes to *d_kd_loss (device fp32). bf16 only (the fp16 model refuses
// it); not for BERT (its head runs on gathered rows).
struct GpuDistillation {
  bf16* teacher_logits = nullptr;
  int ld_t = 0;
  float temperature = 1.f, beta = 1.f, alpha = 1.f;
  float* d_kd_loss = nullptr;
};

// The model as the engine and the pipeline drive it, whatever its compute dtype
// (GpuTransformerT<T> below, which documents each call). The stage hand-over buffers are of the
// compute dtype ([B*S, hidden] elements of dtype_size(compute_dtype()) bytes).
class GpuModel {
 public:
  virtual ~GpuModel() = default;
  virtual DType compute_dtype() const = 0;
  virtual void forward_backward(cudaStream_t s, ParamAccess& params, void* grads, DType grad_type, bool accumulate,
                                const std::int32_t* tokens, const std::int32_t* labels, float grad_scale,
                                float* d_loss, int* d_status, const float* d_loss_scale = nullptr) = 0;
  virtual void forward_loss(cudaStream_t s, ParamAccess& params, const std::int32_t* tokens,
                            const std::int32_t* labels, float* d_loss, int* d_status) = 0;
  virtual void set_stage(int first, int end) = 0;
  virtual bool whole_model() const = 0;
  virtual void stage_forward(cudaStream_t s, ParamAccess& params, void* grads, DType grad_type, bool accumulate,
                             const std::int32_t* tokens, const std::int32_t* labels, float grad_scale, float* d_loss,
                             int* d_status, const float* d_loss_scale = nullptr) = 0;
  virtual void stage_backward(cudaStream_t s, ParamAccess& params, void* grads, DType grad_type, bool accumulate,
                              const std::int32_t* tokens) = 0;
  virtual void* stage_input(cudaStream_t s) = 0;
  virtual void* stage_output(cudaStream_t s) = 0;
  virtual void* stage_grad(cudaStream_t s) = 0;
  virtual void set_tensor_parallel(TpDeviceGroup* group, const TpSlice& slice) = 0;
  virtual int tp_forward_all_reduces() const = 0;
  virtual int tp_backward_all_reduces() const = 0;
  virtual void set_shape(int rows, int seq) = 0;
  virtual int rows() const = 0;
  virtual int seq() const = 0;
  virtual void set_distillation(const GpuDistillation* d) = 0;
  virtual void set_moe_step(std::uint64_t seed, int step) = 0;
  virtual const std::vector<MoeBlockStats>& moe_stats() const = 0;
  virtual void stage_moe_stats(cudaStream_t s) = 0;
  virtual const std::vector<MoeBlockStats>& collect_moe_stats() = 0;
  virtual void set_moe_seed_words(const std::uint64_t* d_words) = 0;
  virtual std::uint64_t moe_forward_seed_of(int micro) const = 0;
  virtual std::string moe_eager_reason() const = 0;
  virtual void set_token_drop(int kept, const std::int32_t* d_indices) = 0;
  virtual bool moe_capturable() const = 0;
  virtual void set_dropout(std::uint64_t seed, std::uint32_t step, const std::uint32_t* d_step = nullptr) = 0;
  virtual int mlm_slots() const = 0;
  virtual void release_workspace() = 0;
  virtual std::size_t workspace_bytes() const = 0;
};

template <typename T>
class GpuTransformerT final : public GpuModel {
 public:
  // B×S tokens per micro-batch (S <= dims.max_seq). `checkpointing`: keep only each block's
  // input and recompute the block in backward. GPT-2 is causal whatever `causal` says, BERT
  // bidirectional (its padding keys masked); BERT refuses random-LTD (`drop_layers`).
  // `recompute_gelu` (GPT-2; llm.c's -r 1): one GELU output buffer shared by the blocks, the
  // output recomputed from the stored pre-activation in backward (a GELU pass per block for
  // (layers - 1) x B x S x 4C T values less memory).
  // `drop_layers`: the blocks random-LTD may drop tokens in (their kept-token buffers are part of
  // the workspace; set_token_drop switches the drop on and off).
  // `max_pred` (BERT: max_predictions_per_seq, in [0, S]): the masked-LM head's slots per sequence;
  // the head runs on B x max_pred rows, each sequence's labelled rows (label != -100) gathered in
  // order (docs/bert.md). 0: S slots, room for any labels (the head then runs on B x S rows). A
  // sequence with more labelled rows than slots is an error reported through d_status[1]. Must be 0
  // for the other architectures.
  // `moe_ep_group`: the MoE blocks' expert-parallel group (model/moe_layer.h; null: every expert
  // here); it must outlive the model. `max_tokens`: the most tokens a micro-batch of set_shape() may
  // hold (0: B x S); the workspace is allocated for it once. T = fp16 refuses MoE blocks (their
  // layer is bf16 only).
  // `deterministic_attention`: the attention backward without order-dependent atomics (the same
  // bits every run); false: dQ by fp32 reduce-adds, faster at head dim 64, with the larger scratch
  // that needs (kernels/attention.cuh).
  GpuTransformerT(const TransformerParams& table, int B, int S, bool checkpointing, bool causal,
                  CachingAllocator& alloc, bool recompute_gelu = false, std::vector<int> drop_layers = {},
                  int max_pred = 0, comm::Communicator* moe_ep_group = nullptr, std::size_t max_tokens = 0,
                  bool deterministic_attention = true);
  ~GpuTransformerT() override;
  GpuTransformerT(const GpuTransformerT&) = delete;
  GpuTransformerT& operator=(const GpuTransformerT&) = delete;
  DType compute_dtype() const override { return dtype_of<T>(); }

  // Forward to the loss and the whole backward of one micro-batch. params: where each unit's T
  // params are (acquired in the order zero_shard_layout.h's stage3_use_order gives); grads: flat
  // of `grad_type` (T or fp32) at params.grad_offset of each unit, written (accumulate=false)
  // or added to (accumulate=true);
  // tokens, labels: device int32 [B*S]. Writes the mean loss to *d_loss (device fp32) and the
  // first bad token / label index + 1 to d_status[0] / d_status[1] (device ints, 0 when valid;
  // d_status[0] is only raised, so the caller clears it, d_status[1] is written). BERT:
  // d_status[1] = -(b + 1) when sequence b is the first with more labelled rows than max_pred
  // (a bad label is reported first).
  // `grad_scale` multiplies the loss gradient (1/accumulation for averaged micro-batches);
  // `d_loss_scale` (device fp32, may be null): fp16's loss scale, multiplied in on the device (a
  // captured graph reads each step's), so every gradient is that many times the true one.
  void forward_backward(cudaStream_t s, ParamAccess& params, void* grads, DType grad_type, bool accumulate,
                        const std::int32_t* tokens, const std::int32_t* labels, float grad_scale, float* d_loss,
                        int* d_status, const float* d_loss_scale = nullptr) override;

  // A pipeline stage's share (parallel/pipeline_plan.h): the layers [first, end) of the model's
  // sequence, 0 the embedding, 1 + l block l, L + 1 the head; the default is the whole model
  // [0, L + 2). Set before the first call: only the span's activations are allocated. A partial
  // span is built for the seed architecture's dense blocks without random-LTD: GPT-2 fuses a
  // block's output into the next LayerNorm and its head, like BERT's, reads the embedding unit.
  void set_stage(int first, int end) override;
  int stage_first() const { return stage_first_; }
  int stage_end() const { return stage_end_; }
  bool whole_model() const override { return stage_first_ == 0 && stage_end_ == table_.dims().layers + 2; }
  // One micro-batch of the stage, in two calls: forward_backward() is stage_forward() then
  // stage_backward() over the whole model. The forward starts from the tokens (with the
  // embedding) or from stage_input() (the previous stage's output, put there by the caller) and
  // ends in the loss (with the head: the fused cross-entropy's loss into *d_loss and its gradient,
  // scaled by grad_scale) or in stage_output(). The backward starts from the loss (with the head)
  // or from stage_grad() (the next stage's input gradient, put there by the caller) and leaves
  // the gradient of the stage's input in stage_grad() (without the embedding). `acc` as in
  // forward_backward: false for the step's first micro-batch. The head unit stays acquired from
  // the forward to the backward.
  // `d_loss_scale` as in forward_backward.
  void stage_forward(cudaStream_t s, ParamAccess& params, void* grads, DType grad_type, bool accumulate,
                     const std::int32_t* tokens, const std::int32_t* labels, float grad_scale, float* d_loss,
                     int* d_status, const float* d_loss_scale = nullptr) override;
  void stage_backward(cudaStream_t s, ParamAccess& params, void* grads, DType grad_type, bool accumulate,
                      const std::int32_t* tokens) override;
  // The stage's activation hand-over buffers [B*S, hidden] of T (the workspace allocated on `s` first).
  void* stage_input(cudaStream_t s) override;
  void* stage_output(cudaStream_t s) override;
  void* stage_grad(cudaStream_t s) override;

  // Tensor parallelism (TpDeviceGroup above; null: none) with this rank's slice
  // (parallel/tensor_parallel_plan.h's make_tp_slice; size and rank those of the group). Seed and
  // GPT-2 dense blocks, bf16, set before the first call. A group of one rank runs the whole model
  // with the blocks' all-reduces (each the rank's own values). With more ranks the model computes
  // its slice only (Megatron's layout): QKV and FC1 column-parallel (its heads' q, k, v rows, its
  // FFN rows), the out-projection and FC2 row-parallel (the matching columns; their biases, and the
  // residual shares the backward's GEMMs add, on the group's rank 0 only, so the sums hold them
  // once), attention over its heads, the token embedding and the head vocabulary-parallel (its
  // vocabulary rows; kernels/vocab_parallel_loss.cuh's loss, the logits never gathered). The
  // parameters keep the flat layout of the whole model (the CPU backend's convention): the rank's
  // slices and the replicated tensors hold values, every other element must be zero (the lookup of
  // another rank's token reads a zero row); gradients are written to the rank's slices and the
  // replicated tensors only (every rank's replicated gradients are equal), the other elements are
  // left alone (the token embedding's other rows, which its backward scatters into, are zeroed).
  // The column and row slices that are not contiguous in the flat layout (QKV's three parts, the
  // out-projection's and FC2's columns) are copied into packed scratch for each GEMM and their
  // gradients copied back (cudaMemcpy2DAsync, captured with the step). Domino (slice.pieces > 1,
  // dividing every micro-batch's sequences): each block's sub-layers run piece by piece, each
  // piece's all-reduce on the model's communication stream as soon as its partial sum is queued
  // (an event), so it runs while the next piece computes; a piece's next sub-layer waits for its
  // own all-reduce, and the block ends when every piece's has finished. Random-LTD, distillation,
  // BERT and MoE blocks are refused with a group of more than one rank.
  void set_tensor_parallel(TpDeviceGroup* group, const TpSlice& slice) override;
  // The group's all-reduces one forward_backward issues (forward, backward; the recompute of
  // activation checkpointing adds the blocks' forward ones again): 2 per block each way, and with
  // more than one rank the embedding's and the loss's two (forward) and the head's (backward).
  // Domino's pieces each issue the blocks' all-reduces of their rows.
  int tp_forward_all_reduces() const override {
    return tp_ ? 2 * table_.dims().layers * tps_.pieces + (sharded() ? 3 : 0) : 0;
  }
  int tp_backward_all_reduces() const override {
    return tp_ ? 2 * table_.dims().layers * tps_.pieces + (sharded() ? 1 : 0) : 0;
  }

  // Evaluation: the forward and the mean loss of one micro-batch, no gradients (logits kept).
  // Writes *d_loss and d_status[0..1] like forward_backward.
  void forward_loss(cudaStream_t s, ParamAccess& params, const std::int32_t* tokens, const std::int32_t* labels,
                    float* d_loss, int* d_status) override;

  // MoE blocks: the gate noise's seed of the next step's forwards (moe_forward_seed(seed, step,
  // micro-batch)), and what each MoE block routed over the micro-batches since the last
  // forward_backward with accumulate = false (one entry per MoE block, in block order): merged on
  // the device during the step; stage_moe_stats queues their copies to the host on `s` after a
  // training forward_backward, collect_moe_stats reads them once `s` was synchronized (the step's
  // own sync), moe_stats() the last read.
  void set_moe_step(std::uint64_t seed, int step) override {
    moe_seed_ = seed;
    moe_step_ = step;
  }
  void stage_moe_stats(cudaStream_t s) override;
  const std::vector<MoeBlockStats>& collect_moe_stats() override;
  // The gate noise's seeds on the device (uint64 [micro-batches], may be null): micro-batch m's
  // training forwards read word m (written before each step: moe_forward_seed_of(m)) when their
  // kernels run, so a step captured in a CUDA graph draws each replay's noise; the noisy MoE
  // layers are then capturable. The words must stay valid while the model runs.
  void set_moe_seed_words(const std::uint64_t* d_words) override { moe_seed_words_ = d_words; }
  std::uint64_t moe_forward_seed_of(int micro) const override { return moe_forward_seed(moe_seed_, moe_step_, micro); }
  const std::vector<MoeBlockStats>& moe_stats() const override { return moe_stats_; }
  // random-LTD for the next forward_backward calls (forward_loss never drops): each drop block
  // keeps `kept` tokens per sequence at the positions `d_indices` (device int32 [drop_layers
  // (ascending), rows, kept] of the current shape (set_shape first), ascending per sequence:
  // model/token_drop_plan.h's layout), which must stay valid on the stream until the backward is
  // done. kept 0 or >= the current seq: no drop. The call
  // sequence depends on `kept` (kernel shapes), not on the indices: a graph captured for one kept
  // count replays for any indices at that count.
  void set_token_drop(int kept, const std::int32_t* d_indices) override;
  // Whether every MoE block's training pass is capturable (MoeLayerGpu::capturable; true without
  // MoE blocks), and why not (empty when it is).
  bool moe_capturable() const override { return moe_eager_reason().empty(); }
  std::string moe_eager_reason() const override;

  // A sequence-length curriculum: the next calls run `rows` sequences of `seq` tokens (tokens and
  // labels [rows*seq]; positions 0 .. seq-1, attention, the loss's mean and every kernel's rows
  // over them), in the workspace allocated once for the constructor's capacity: seq <= S and
  // rows x seq <= max_tokens. The call sequence depends on the shape (kernel shapes), so a CUDA
  // graph holds for one shape. MoE blocks keep the constructor's B x S; random-LTD's drop blocks
  // run at rows x kept of the shape; BERT keeps its B rows and takes seq >= max_pred (its padded
  // micro-batch cut shorter).
  void set_shape(int rows, int seq) override;
  int rows() const override { return B_; }
  int seq() const override { return S_; }

  // BERT's dropout (model/bert_config.h's sites): the seed and optimizer step of the next
  // forward_backward calls' masks (forward_loss never drops); `d_step` (device uint32, may be
  // null): the kernels read the step there instead, so a CUDA graph captured once draws the masks
  // of the step the engine writes before each replay. Micro-batch k of a step (k forward_backward
  // calls with accumulate since the last without) draws its own masks.
  void set_dropout(std::uint64_t seed, std::uint32_t step, const std::uint32_t* d_step = nullptr) override {
    drop_seed_ = seed;
    drop_step_ = step;
    drop_step_ptr_ = d_step;
  }
  // Workspace bytes each of BERT's memory flags (BertConfig) saves for a model of `dims` at B x S
  // with or without activation checkpointing: what workspace_bytes() is smaller by with the flag
  // on (docs/bert.md gives the formulas). 0 for another architecture.
  struct BertFlagSavings {
    std::size_t normalize_invertible = 0, gelu_checkpoint = 0, attn_dropout_checkpoint = 0;
  };
  // `max_pred`: the constructor's (the head's rows).
  static BertFlagSavings bert_flag_savings(const ModelDims& dims, int B, int S, bool checkpointing, int max_pred = 0);
  // BERT's masked-LM head slots per sequence for the constructor's `max_pred` at seq S (0: S).
  static int mlm_slots(int S, int max_pred) { return max_pred > 0 ? max_pred : S; }
  int mlm_slots() const override { return K_; }

  // Knowledge distillation (GpuDistillation above) for the next forward_backward calls; null: the
  // LM loss alone. T = fp16 refuses it.
  using Distillation = GpuDistillation;
  void set_distillation(const Distillation* d) override;
  // The logits of the last forward_loss (T [B*S, vocab_rows]; BERT: the head's rows): a
  // teacher's, read by the student's distillation. Valid until the next call on this model.
  T* logits() const { return logits_; }

  // Whether forward_backward acquires the embedding unit for the embedding backward (after the
  // blocks' backward): BERT's embedding LayerNorm reads its weight; GPT-2's and the seed model's
  // lookup backward reads no parameters. With a tied head (TransformerParams::tied_head) the head
  // also acquires the embedding unit, right after the head unit, and releases both after the
  // head's backward (parallel/zero_shard_layout.h's stage3_use_order).
  static bool embedding_backward_reads_params(const ModelDims& dims) { return dims.arch == Arch::Bert; }

  // Returns activations and scratch to the allocator; the next call allocates them again.
  void release_workspace() override;
  // Bytes of activations + scratch this model holds once allocated (0 before the first call).
  std::size_t workspace_bytes() const override { return workspace_bytes_; }

 private:
  struct LayerActs {
    T *qkv, *att, *s1, *x1, *f, *g, *s2;
    float *lse, *mean1, *rstd1, *mean2, *rstd2;
  };
  // One acquired unit: its params and (in backward) its gradients, indexed by tensor.
  struct Unit {
    const TransformerParams* table;
    const T* params;       // the unit's first element
    char* grads;           // the unit's first gradient element (null in forward)
    std::size_t begin;     // the unit's first flat element
    std::size_t es;        // gradient element bytes
    const T* w(int t) const { return params + (table->tensor(t).offset - begin); }
    void* g(int t) const { return grads + (table->tensor(t).offset - begin) * es; }
  };
  Unit unit(ParamAccess& P, cudaStream_t s, int u, char* G, DType gt);
  void allocate(cudaStream_t s);
  // One workspace buffer of `bytes` from the allocator on `s`, counted in workspace_bytes_; n
  // elements of E.
  void* take(cudaStream_t s, std::size_t bytes);
  template <typename E>
  E* take_n(cudaStream_t s, std::size_t n) {
    return static_cast<E*>(take(s, n * sizeof(E)));
  }
  // Leaves the head unit acquired (released by the caller after the loss or the head backward).
  template <typename Loss>  // defined and instantiated in transformer_gpu.cpp only
  Unit forward(cudaStream_t s, ParamAccess& P, char* G, DType gt, const std::int32_t* tokens,
               const std::int32_t* labels, int* d_status, Loss&& loss);
  // The rows a block runs on: all B x S tokens, or random-LTD's B x kept (attention over `kept`
  // per sequence); `dx`: the buffer holding d(block output) in backward, d(block input) after it.
  struct Rows {
    int M;
    kernels::AttentionShape attn;
    T* dx;
  };
  Rows full_rows() const { return Rows{M_, attn_, dx_}; }
  Rows kept_rows() const;
  int drop_slot(int l) const;  // block l's slot in drop_layers_ when the drop is on, else -1
  void layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a, const T* x_in, T* x_out,
                     const Rows& rows);
  void layer_backward(cudaStream_t s, const Unit& U, DType gt, bool acc, int l, const LayerActs& a, const T* x_in,
                      const Rows& rows);
  // A dropping block's forward: its kept tokens gathered from xs_[l] into xk, the block on them,
  // xs_[l+1] = xs_[l] with the kept rows replaced by the block's output. `recompute`: activation
  // checkpointing's second forward, which leaves xs_[l+1] alone.
  void dropped_layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a, int slot, bool recompute);
  // GPT-2 (x1 = LN1(x_in), s1 = x_in + attn, s2 = LN2(s1), f = fc(s2), g = gelu_tanh(f), the MLP's
  // output left in dh_). `fuse`: x_in = prev->s1 + dh_ (the previous block's output) is computed
  // here, by LN1's residual add; otherwise (block 0, after a dropping block, the recompute, a
  // dropping block's kept tokens) x_in is already there.
  void gpt2_layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a, const LayerActs* prev, T* x_in,
                          bool fuse, const Rows& rows);
  // rows.dx: d(block output) in, d x_in out.
  void gpt2_layer_backward(cudaStream_t s, const Unit& U, DType gt, bool acc, int l, const LayerActs& a,
                           const T* x_in, const Rows& rows);
  // The final LayerNorm and the tied logits; the head's backward down to dx_ = d x_L.
  void gpt2_head_forward(cudaStream_t s, const Unit& H, const Unit& E);
  void gpt2_head_backward(cudaStream_t s, const Unit& H, const Unit& E, DType gt, bool acc);

  // BERT (transformer_gpu_bert.cpp): the embeddings (lookup, LayerNorm, dropout into xs_[0]); a
  // block from xs_[l] to xs_[l+1] (Pre-LN: x1 = LN_attn(x), s1 = a, s2 = LN_out(a); Post-LN: s1 =
  // LN_attn's input, x1 = a, s2 = LN_out's input); the head on the P_ gathered rows (the plan from
  // the labels, the rows of xs_[L] into head_x_, final LayerNorm for Pre-LN, transform, tied
  // decoder + bias into logits_ [P_, vocab_rows]); each one's backward with dx_ = d(its output)
  // in, d(its input) out (the head's: d(head_x_) scattered into dx_, zeros elsewhere).
  void allocate_bert(cudaStream_t s);
  void bert_embedding_forward(cudaStream_t s, const Unit& E, const std::int32_t* tokens, int* d_status);
  void bert_embedding_backward(cudaStream_t s, const Unit& E, DType gt, bool acc, const std::int32_t* tokens);
  void bert_layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a);
  void bert_layer_backward(cudaStream_t s, const Unit& U, DType gt, bool acc, int l, const LayerActs& a);
  void bert_head_forward(cudaStream_t s, const Unit& H, const Unit& E, const std::int32_t* labels, int* d_status);
  void bert_head_backward(cudaStream_t s, const Unit& H, const Unit& E, DType gt, bool acc);
  kernels::DropoutKey bert_key(std::uint32_t layer) const {
    return kernels::DropoutKey{drop_seed_, drop_step_, layer, drop_step_ptr_};
  }
  float bert_hidden_p() const;  // the hidden dropout of the running forward (0 outside training)
  kernels::AttentionOptions bert_attention(int l) const;

  // The per-call shape and mask for the next calls; what the workspace was allocated for.
  // Scratch bytes for a micro-batch of rows x seq.
  std::size_t scratch_bytes(int rows, int seq) const;
  const TransformerParams& table_;
  int B_, S_, M_;      // the shape of the next calls (set_shape; the constructor's B x S by default)
  int Bfull_, Sfull_;  // the constructor's
  std::size_t cap_;    // tokens the workspace holds per micro-batch (>= Bfull_ x Sfull_)
  std::size_t scratch_size_ = 0;
  int stage_first_ = 0, stage_end_ = 0;  // set_stage(): pipeline layers [first, end)
  // The blocks of the stage [block_first(), block_end()).
  int block_first() const { return std::max(stage_first_, 1) - 1; }
  int block_end() const { return std::min(stage_end_, table_.dims().layers + 1) - 1; }
  bool has_embedding() const { return stage_first_ == 0; }
  bool has_head() const { return stage_end_ == table_.dims().layers + 2; }
  Unit held_head_{};  // stage_forward's head unit, released by stage_backward
  TpDeviceGroup* tp_ = nullptr;
  TpSlice tps_;  // this rank's slice (the whole model without a group)
  bool sharded() const { return tp_ && tps_.size > 1; }
  // The tensor-parallel sum of buf [rows, hidden] (nothing without a group).
  void tp_all_reduce(cudaStream_t s, T* buf, int rows);
  TpBlockRuns tp_runs_;  // the slice's runs in a block's tensors (model/tp_slice_runs.h)
  // The runs of `src` (a tensor's first element, of `es`-byte elements) into the packed `dst`, and back.
  void pack(cudaStream_t s, void* dst, const void* src, const SliceRuns& r, std::size_t es) const;
  void unpack(cudaStream_t s, void* dst, const void* src, const SliceRuns& r, std::size_t es) const;
  // A row-parallel or column-parallel weight's gradient through packed scratch `pg` (of the
  // gradient's dtype): the rank's runs of g gathered first when accumulating, the GEMM's dW into
  // pg, scattered back.
  void packed_grad_weight(cudaStream_t s, const T* dy, const T* x, void* g, DType gt, bool acc, int M, int N, int K,
                          const SliceRuns& r);
  // The same with the bias gradient into `db` (not packed) from the GEMM (Gemm::grad_weight_bias).
  void packed_grad_weight_bias(cudaStream_t s, const T* dy, const T* x, void* g, void* db, DType gt, bool acc, int M,
                               int N, int K, const SliceRuns& r);
  // A linear layer's dW into gw and db into gb (y = x·Wᵀ + b, dy [M, N], x [M, K]; added to when
  // `acc`), timed as linear_param_grads names them (transformer_gpu.cpp).
  void param_grads(cudaStream_t s, const LinearRegions& n, const T* dy, const T* x, void* gw, void* gb, DType gt,
                   bool acc, int M, int N, int K);
  // A row-parallel layer's (fc2, out_proj) dW through packed scratch and its whole db, as
  // linear_param_grads times them (regions `<layer>_dw_db`, or `<layer>_dw` and `<layer>_db`).
  void tp_row_param_grads(cudaStream_t s, const char* layer, const T* dy, const T* x, void* gw, void* gb, DType gt,
                          bool acc, int M, int N, int K, const SliceRuns& r);
  // The qkv projection's dW and its db of the rank's head slices (packed through tp_gb_), the same way.
  void tp_qkv_param_grads(cudaStream_t s, const T* dq, const T* x, void* gw, void* gb, DType gt, bool acc, int M,
                          int N, int K);
  // The sharded blocks and head (transformer_gpu_tp.cpp); rows.dx as in layer_backward.
  void tp_layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a, const T* x_in, T* x_out,
                        const Rows& rows);
  void tp_layer_backward(cudaStream_t s, const Unit& U, DType gt, bool acc, int l, const LayerActs& a, const T* x_in,
                         const Rows& rows);
  void tp_gpt2_layer_forward(cudaStream_t s, const Unit& U, int l, const LayerActs& a, const LayerActs* prev, T* x_in,
                             bool fuse, const Rows& rows);
  void tp_gpt2_layer_backward(cudaStream_t s, const Unit& U, DType gt, bool acc, int l, const LayerActs& a,
                              const T* x_in, const Rows& rows);
  // The vocabulary-parallel embedding (the lookup on the flat table, whose other rows are zero;
  // the positions on rank 0 only; the sum over the group) and its backward (the other rows zeroed).
  void tp_embedding_forward(cudaStream_t s, const Unit& E, const std::int32_t* tokens, int* d_status);
  void tp_embedding_rows_clear(cudaStream_t s, const Unit& E, DType gt);
  // The logits of the rank's vocabulary rows [M, vocab slice] from the head's input.
  void tp_logits(cudaStream_t s, const Unit& H, const Unit& E);
  // The vocabulary-parallel loss (three passes, two all-reduces); `grad`: the logits' gradient in place.
  void tp_loss(cudaStream_t s, const std::int32_t* labels, float* d_loss, int* d_status, bool grad, float grad_scale,
               const float* d_loss_scale);
  // The head's backward from the rank's logits gradient down to dx_ (GPT-2: through LN_f).
  void tp_head_backward(cudaStream_t s, const Unit& H, const Unit& E, DType gt, bool acc);
  int vocab_slice() const { return tps_.vocab_end - tps_.vocab_begin; }
  // Packed scratch of the sharded GEMMs (weights of T, gradients of the widest gradient dtype),
  // the loss's row statistics [3 x rows] and rank != 0's zero position table.
  T *tp_w_ = nullptr, *tp_b_ = nullptr, *tp_zero_pos_ = nullptr;
  void *tp_gw_ = nullptr, *tp_gb_ = nullptr;
  float* tp_stats_ = nullptr;
  // Domino: piece p's all-reduce of buf [rows, hidden] (on the communication stream after what `s`
  // queued, or with one piece on `s` itself), and `s` waiting for it.
  void tp_reduce_piece(cudaStream_t s, T* buf, int rows, int p);
  void tp_wait_piece(cudaStream_t s, int p);
  std::unique_ptr<Stream> tp_comm_stream_;
  std::vector<Event> tp_ready_, tp_done_;  // per piece: its partial sum queued; its all-reduce done
  int K_ = 0, P_ = 0;  // BERT: the head's slots per sequence and rows (B_ x K_); 0 otherwise
  bool checkpointing_;
  bool recompute_gelu_;
  bool deterministic_attention_;
  kernels::AttentionShape attn_;
  CachingAllocator& alloc_;
  std::unique_ptr<kernels::Gemm> gemm_;
  std::vector<Buffer> buffers_;
  std::vector<T*> xs_;          // block inputs: xs_[0] = embeddings, xs_[L] = final hidden
  std::vector<LayerActs> acts_;    // one per layer (one shared set with checkpointing)
  T *logits_ = nullptr, *dx_ = nullptr, *dh_ = nullptr, *d4h_ = nullptr, *dqkv_ = nullptr;
  T* lnf_ = nullptr;                            // GPT-2: LN_f(x_L)
  float *mean_f_ = nullptr, *rstd_f_ = nullptr;
  Unit tied_{};                                    // GPT-2: the embedding unit the head reads (wte)
  // MoE: block l's layer (null for a dense block); the mode of the forward running (training
  // capacity and noise, or evaluation); a recompute's forward merges no stats; the last read
  // step figures.
  std::vector<std::unique_ptr<MoeLayerGpu>> moe_;
  void moe_forward(cudaStream_t s, const Unit& U, int l, const T* x, T* y);
  std::vector<MoeBlockStats> moe_stats_;
  bool moe_train_ = true, moe_recompute_ = false;
  float moe_grad_scale_ = 1.f;  // the running forward_backward's grad_scale
  int moe_micro_ = 0, moe_step_ = 0;
  std::uint64_t moe_seed_ = 0;
  const std::uint64_t* moe_seed_words_ = nullptr;
  void* scratch_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::optional<Distillation> distill_;  // set_distillation's, for forward_backward
  // random-LTD: the blocks that may drop (ascending), the drop of the next forward_backward
  // (kept 0: off), the kept tokens' inputs (one per drop block, one shared with checkpointing),
  // the seed model's block output on them, and their gradient.
  std::vector<int> drop_layers_;
  int kept_ = 0;
  const std::int32_t* drop_idx_ = nullptr;
  bool drop_on_ = false;  // during forward_backward only
  std::vector<T*> xk_;
  T *xk_out_ = nullptr, *dxk_ = nullptr;
  // BERT: the dropout key and whether the running forward trains (dropout on); the key mask
  // [B*S] (null without a pad_id); the embeddings' LayerNorm input and statistics; the head's
  // transform (dense output, its GELU, the LayerNorm of that).
  std::uint64_t drop_seed_ = 0;
  std::uint32_t drop_step_ = 0;
  const std::uint32_t* drop_step_ptr_ = nullptr;
  bool train_ = false;
  std::uint8_t* key_mask_ = nullptr;
  T *emb_sum_ = nullptr, *head_d_ = nullptr, *head_g_ = nullptr, *head_n_ = nullptr;
  // The head's plan (kernels::mlm_gather_plan: positions and labels [P_], each row's slot [M_])
  // and its gathered input rows [P_, h].
  std::int32_t *mlm_pos_ = nullptr, *mlm_labels_ = nullptr, *mlm_slot_ = nullptr;
  T* head_x_ = nullptr;
  float *mean_e_ = nullptr, *rstd_e_ = nullptr, *mean_h_ = nullptr, *rstd_h_ = nullptr;
};

// The seed / GPT-2 / BERT model on bf16 storage (what the tests and tools of bf16 training name).
using GpuTransformer = GpuTransformerT<bf16>;

// The model on `compute` (BF16 or F16) storage: the single place a DType picks T.
std::unique_ptr<GpuModel> make_gpu_transformer(DType compute, const TransformerParams& table, int B, int S,
                                               bool checkpointing, bool causal, CachingAllocator& alloc,
                                               bool recompute_gelu = false, std::vector<int> drop_layers = {},
                                               int max_pred = 0, comm::Communicator* moe_ep_group = nullptr,
                                               std::size_t max_tokens = 0, bool deterministic_attention = true);

}  // namespace cutrain::model
