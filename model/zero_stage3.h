// @brief ZeRO stage 3 in the GPU engine, the device side: the model's parameter units gathered
// just before use into one of two gather buffers, the next unit prefetched into the other while
// the current one computes; the per-unit gradient reduce-scatter into the rank's gradient shard;
// the persistent units' refresh after the optimizer step; and gathered copies of shard-layout
// state (save_state). Layout and index spaces: model/zero_shard_layout.h.
//
// Ordering (all collectives on ZeroComm's one communication stream, so every rank issues them in
// the same order): gather k goes into buffer k % 2. The compute stream waits for gather k before
// the unit's first kernel (acquire); releasing the unit records a "free" event on the compute
// stream, and gather k + 2 (issued at acquire of k + 1) waits for it before overwriting the
// buffer. The first gather of a pass waits for everything the compute stream did before. Every
// event is recorded and waited within the same pass, so a pass can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "model/transformer_gpu.h"
#include "model/zero_shard_layout.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "runtime/device.h"

namespace cutrain::model {

class ShardedParams final : public ParamAccess {
 public:
  // `comm_stream`: ZeroComm's communication stream (outlives this object). Allocates the two
  // gather buffers (layout.gather_elems each) and the persistent buffer, bf16.
  ShardedParams(std::shared_ptr<comm::Communicator> comm, cudaStream_t comm_stream, const ShardLayout& layout,
                const TransformerParams& table, CachingAllocator& alloc, cudaStream_t compute);

  // One pass of the model (a step's micro-batches, or an eval forward): the units are acquired in
  // exactly `order` (zero_shard_layout.h's stage3_use_order; checked). `shard`: this rank's bf16
  // param shard (read again every pass: an offload reload moves it).
  void begin_pass(const bf16* shard, const std::vector<int>& order);
  void end_pass();  // checks that every use of the order happened

  const bf16* acquire(cudaStream_t s, int u) override;
  void release(cudaStream_t s, int u) override;
  std::size_t grad_offset(int u) const override { return layout_.units.at(std::size_t(u)).padded_offset; }

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

  std::shared_ptr<comm::Communicator> comm_;
  cudaStream_t comm_stream_;
  ShardLayout layout_;
  const TransformerParams& table_;
  Buffer gather_buf_[2], persistent_;
  Event gathered_[2]{Event(false), Event(false)}, free_[2]{Event(false), Event(false)};
  Event ready_{false}, done_{false};
  // The current pass.
  const bf16* shard_ = nullptr;
  std::vector<int> order_;     // every use
  std::vector<int> gathered_units_;  // the non-persistent uses, in order
  std::size_t pos_ = 0, next_gather_ = 0;
  int live_unit_ = -1;  // the acquired, not yet released unit
  bool in_pass_ = false;
  std::size_t gathers_issued_ = 0;
};

}  // namespace cutrain::model
