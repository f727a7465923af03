// @brief The MoE layer on the GPU (DeepSpeed's deepspeed.moe.layer.MoE at ep_size 1, without
// random token selection): [gate input jitter ->] gate linear (fp32 logits) -> gate (kernels/moe_gate) ->
// permutation into the expert-contiguous buffer -> each expert's fc1, GELU (erf), fc2 -> weighted
// un-permutation; with use_residual (PR-MoE) a dense MLP beside it and the learned 2-way mix
// (kernels/moe_residual); and the backward of all of it, the aux loss's gradient included. Checked
// against model/moe_reference.h.
//
// Two layouts of the permuted rows:
//  - slots (token dropping without an expert-parallel group): DeepSpeed's [E, capacity] buffer,
//    route (s, r) at expert · C + position, the unfilled slots zeroed; the expert GEMMs run as one
//    strided batch of E products over C rows each (kernels/gemm.cuh's *_batched). Every shape is a
//    function of the host's capacity, the counts never leave the device: no host synchronization,
//    CUDA-graph capturable (capturable()). The slots compute E · C rows, k · tokens · capacity
//    factor: at factor 1 the rows of a dense FFN over the k · tokens routes.
//  - packed (no token dropping, where the largest count sizes the work, or with an expert-parallel
//    group): only the kept rows, expert after expert; the per-expert row counts are copied to the
//    host once per forward for the grouped GEMMs (kernels/moe_grouped_gemm.cuh) and the exchange,
//    so that forward synchronizes its stream once and is not capturable.
// Buffers are sized at construction for max_tokens: no allocation per call.
//
// What a forward routed stays on the device: merge_step_stats() folds it into the step's figures
// there (a captured step merges in its graph), read_step_stats() / last_stats() read them on the
// host after the work (each synchronizes the stream).
//
// Expert parallelism (DeepSpeed's ep_size): given the expert-parallel group's communicator (NCCL
// on GPUs), member r of a group of P holds experts [r·E/P, (r+1)·E/P). The forward gates its own
// tokens, exchanges each expert's kept row count with one small all-to-all (in the forward's one
// synchronization), sends its permuted rows to the members holding their experts
// (Communicator::all_to_all_v, the pieces of model/moe_dispatch_plan.h), runs its experts' grouped
// GEMMs on every member's rows and returns the outputs by the reverse exchange; the backward
// mirrors it. A group of one runs the same path (the all-to-all of one rank). The receive buffers
// are sized at construction for the most rows P members can send.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "model/moe_config.h"
#include "model/moe_stats.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "runtime/dtype.h"

namespace cutrain::model {

// What one forward routed (host copies).
struct MoeForwardStats {
  float l_aux = 0;
  int capacity = 0;
  int dropped = 0;                  // routes over capacity (tokens, under top-1)
  std::vector<int> expert_counts;   // routes that chose each expert, before dropping
  std::vector<int> kept_counts;     // rows each expert computed
  int min_load() const;             // min / max of kept_counts
  int max_load() const;
};

class MoeLayerGpu {
 public:
  // max_tokens bounds the tokens of every call (on every member of the group). `ep_group`: the
  // expert-parallel group (null: every expert here, no exchange); it must outlive the layer, and
  // every member calls forward / backward together, in the same order.
  // `packed`: the packed layout even where the slots apply (the two layouts side by side in tests
  // and benchmarks).
  MoeLayerGpu(const MoeConfig& c, int max_tokens, CachingAllocator& alloc, comm::Communicator* ep_group = nullptr,
              bool packed = false);
  ~MoeLayerGpu();
  MoeLayerGpu(const MoeLayerGpu&) = delete;
  MoeLayerGpu& operator=(const MoeLayerGpu&) = delete;

  // y[T,H] from x[T,H] (bf16); params bf16 at moe_param_layout. `train` picks capacity_factor or
  // eval_capacity_factor (and enables noisy_gate_policy). `seed` draws the gate's noise (a
  // function of the step keeps a resumed run's routing); `seed_word` (device, may be null): the
  // seed is read there instead, when the kernels run, so a captured graph draws the noise of the
  // value written before each replay (it must hold until backward). x and params must stay
  // unchanged until backward.
  void forward(cudaStream_t s, const bf16* params, const bf16* x, bf16* y, int tokens, bool train,
               std::uint64_t seed = 0, const std::uint64_t* seed_word = nullptr);

  // The last forward's routing on the host (synchronizes `s`).
  MoeForwardStats last_stats(cudaStream_t s) const;
  // Folds the last forward's routing into the step's figures on the device (`first`: the step's
  // first forward); read_step_stats synchronizes `s` and returns them (l_aux: the mean over the
  // merged forwards; `layer` left 0; an error when no forward was merged).
  void merge_step_stats(cudaStream_t s, bool first);
  MoeBlockStats read_step_stats(cudaStream_t s) const;
  // The same in two halves, so a model's layers share one synchronization: the copy to pinned host
  // memory queued on `s`, then (once `s` is synchronized) its figures.
  void stage_step_stats(cudaStream_t s) const;
  MoeBlockStats staged_step_stats() const;

  // Whether the layer's training forward and backward are free of host synchronization and of
  // per-call host values (the slot layout; no gate noise, or its seed from a device word:
  // `seed_words`, the caller passes one to every training forward): a CUDA graph may hold them.
  bool capturable(bool seed_words = false) const;
  // Why a configuration's layer is not capturable (null when it is): no token dropping, an
  // expert-parallel group, or noise drawn per call (noisy_gate_policy, random token selection,
  // second-expert sampling) with its seed a host value of each step (no `seed_words`).
  static const char* eager_reason(const MoeConfig& c, bool expert_parallel, bool seed_words = false);
  const char* eager_reason(bool seed_words = false) const;

  // After forward: dx[T,H] written (or, `dx_accumulate`, added to: dx may then be dy itself, which
  // is read before dx is first written); grads of `grad_type` (bf16 or fp32) at moe_param_layout,
  // written or (accumulate) added to. With an expert-parallel group the experts this rank does not
  // hold get 0 (or are left as they are when accumulating): their gradients live on their owners. aux_grad = d loss / d l_aux (DeepSpeed: the moe loss coeff).
  void backward(cudaStream_t s, const bf16* params, const bf16* x, const bf16* dy, float aux_grad, bf16* dx,
                void* grads, DType grad_type, bool accumulate, bool dx_accumulate = false);

  const MoeConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cutrain::model
