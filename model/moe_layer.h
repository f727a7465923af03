// @brief The MoE layer on the GPU (DeepSpeed's deepspeed.moe.layer.MoE at ep_size 1, without
// random token selection): [gate input jitter ->] gate linear (fp32 logits) -> gate (kernels/moe_gate) ->
// permutation into the expert-contiguous buffer -> each expert's fc1, GELU (erf), fc2 as grouped
// GEMMs -> weighted un-permutation; with use_residual (PR-MoE) a dense MLP beside it and the
// learned 2-way mix (kernels/moe_residual); and the backward of all of it, the aux loss's gradient
// included. Checked against model/moe_reference.h.
//
// The gate's per-expert row counts are copied to the host once per forward (the grouped GEMMs need
// them there): the forward synchronizes its stream once and is not CUDA-graph capturable.
// Activations come from the caching allocator at each forward and are kept for the backward.
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
  MoeLayerGpu(const MoeConfig& c, int max_tokens, CachingAllocator& alloc, comm::Communicator* ep_group = nullptr);
  ~MoeLayerGpu();
  MoeLayerGpu(const MoeLayerGpu&) = delete;
  MoeLayerGpu& operator=(const MoeLayerGpu&) = delete;

  // y[T,H] from x[T,H] (bf16); params bf16 at moe_param_layout. `train` picks capacity_factor or
  // eval_capacity_factor (and enables noisy_gate_policy). `seed` draws the gate's noise (a
  // function of the step keeps a resumed run's routing). x and params must stay unchanged until
  // backward.
  MoeForwardStats forward(cudaStream_t s, const bf16* params, const bf16* x, bf16* y, int tokens, bool train,
                          std::uint64_t seed = 0);

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
