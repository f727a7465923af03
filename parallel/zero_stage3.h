// @brief ZeRO stage 3 in the GPU engine, the device side: the model's parameter units gathered
// just before use into one of two gather buffers, the next unit prefetched into the other while
// the current one computes; the per-unit gradient reduce-scatter into the rank's gradient shard;
// the persistent units' refresh after the optimizer step; and gathered copies of shard-layout
// state (save_state). Layout and index spaces: parallel/zero_shard_layout.h.
//
// Ordering (all collectives on ZeroComm's one communication stream, so every rank issues them in
// the same order): the pass's k-th gathered use goes into buffer k % 2. The compute stream waits
// for gather k before the unit's first kernel (acquire); releasing the use records a "free" event
// on the compute stream, and gather k + 2 waits for it before overwriting the buffer. Gather k + 2
// is issued as soon as use k + 1 is acquired (the prefetch, one use ahead) and use k is released,
// whichever comes last on the host: a tied head holds two units at once (the head and the
// embedding unit, from the head's forward through its backward), so the next unit's gather then
// waits for the head's release instead of overlapping it. At most two gathered units are live.
// The first gather of a pass waits for everything the compute stream did before. Every event is
// recorded and waited within the same pass, so a pass can be captured in a CUDA graph.
//
// With overlap_comm, a unit's gradient reduce-scatter starts as soon as the pass's last backward
// of that unit has written them (the last micro-batch), overlapping the rest of the backward; the
// compute stream joins them at end_pass. Without it, reduce_grads runs after backward. Both
// reduce the same data with the same collectives: the results are identical.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "model/transformer_gpu.h"
#include "parallel/zero_shard_layout.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "runtime/device.h"

namespace cutrain::parallel {

class ShardedParams final : public model::ParamAccess {
 public:
  // `comm_stream`: ZeroComm's communication stream (outlives this object). Allocates the two
  // gather buffers (layout.gather_elems each) and the persistent buffer, bf16.
  ShardedParams(std::shared_ptr<comm::Communicator> comm, cudaStream_t comm_stream, const ShardLayout& layout,
                const model::TransformerParams& table, CachingAllocator& alloc, cudaStream_t compute);

  // One pass of the model (a step's micro-batches, or an eval forward): the units are acquired in
  // exactly `order` (zero_shard_layout.h's stage3_use_order; checked). `shard`: this rank's bf16
  // param shard (read again every pass: an offload reload moves it). `reduce`: a training pass
  // whose gradients are reduce-scattered during backward (overlap_comm) into `grad_shard`, from
  // the gradient buffer `grads` of dtype `grad_type`, once each unit's `micro_batches`-th backward
  // has written them; null when the pass reduces nothing.
  struct OverlapReduce {
    const void* grads = nullptr;
    void* grad_shard = nullptr;
    DType grad_type = DType::BF16;
    int micro_batches = 1;
  };
  void begin_pass(const bf16* shard, const std::vector<int>& order, const OverlapReduce* reduce = nullptr);
  // Checks that every use of the order happened; with `reduce`, that every unit was reduced, and
  // the compute stream `s` waits for the reductions.
  void end_pass(cudaStream_t s);

  const void* acquire(cudaStream_t s, int u) override;  // bf16 (stage 3 is refused with fp16)
  void release(cudaStream_t s, int u) override;
  std::size_t grad_offset(int u) const override { return layout_.units.at(std::size_t(u)).padded_offset; }
  void grads_written(cudaStream_t s, int u) override;

  // After the last backward: every unit's gradients (padded layout, `t`) reduce-scattered
  // (average) into this rank's gradient shard (shard layout).
  void reduce_grads(cudaStream_t compute, const void* grads, void* grad_shard, DType t);
  // The persistent units gathered from the param shard into the persistent buffer (after each
  // optimizer step, at start and after a load).
  void refresh_persistent(cudaStream_t compute, const bf16* shard);
  // Collective: a shard-layout state of dtype `t` gathered into `padded` (layout.padded_elems).
  void gather_padded(cudaStream_t compute, const void* shard, void* padded, DType t);

  const ShardLayout& layout() const { return layout_; }
  std::size_t gathers_issued() const { return gathers_issued_; }  // over the object's life (tests)

 private:
  void fork(cudaStream_t compute);
  void join(cudaStream_t compute);
  void gather(std::size_t k);  // the pass's k-th gathered use into buffer k % 2, on the comm stream
  // Issues every gather the acquired and released uses allow (see the ordering above).
  void issue_gathers(cudaStream_t compute);
  void reduce_unit(const ShardUnit& s, const void* grads, void* grad_shard, DType t);  // on the comm stream

  std::shared_ptr<comm::Communicator> comm_;
  cudaStream_t comm_stream_;
  ShardLayout layout_;
  const model::TransformerParams& table_;
  Buffer gather_buf_[2], persistent_;
  Event gathered_[2]{Event(false), Event(false)}, free_[2]{Event(false), Event(false)};
  Event ready_{false}, done_{false};
  // The current pass.
  const bf16* shard_ = nullptr;
  std::vector<int> order_;     // every use
  std::vector<int> gathered_units_;  // the non-persistent uses, in order
  std::size_t pos_ = 0;
  GatherWindow window_;  // which gathers the acquired and released uses allow
  struct Live {
    int unit;
    std::size_t use;  // its gathered use, or kPersistent
  };
  static constexpr std::size_t kPersistent = ~std::size_t(0);
  std::vector<Live> live_;  // the acquired, not yet released units (at most two)
  bool in_pass_ = false;
  bool reducing_ = false;
  OverlapReduce reduce_;
  std::vector<int> written_;  // per unit: backwards that wrote its gradients in this pass
  std::size_t reduced_ = 0;
  Event grads_ready_{false};
  std::size_t gathers_issued_ = 0;
};

}  // namespace cutrain::parallel
