#include "parallel/zero_stage3.h"

#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::parallel {

ShardedParams::ShardedParams(std::shared_ptr<comm::Communicator> comm, cudaStream_t comm_stream,
                             const ShardLayout& layout, const model::TransformerParams& table, CachingAllocator& alloc,
                             cudaStream_t compute)
    : comm_(std::move(comm)), comm_stream_(comm_stream), layout_(layout), table_(table) {
  CUTRAIN_CHECK(comm_ != nullptr, "ZeRO stage 3: no communicator");
  CUTRAIN_CHECK(comm_->world_size() == layout_.world, "ZeRO stage 3: the layout is for world size ", layout_.world,
                ", the communicator has ", comm_->world_size());
  CUTRAIN_CHECK(layout_.units.size() == table_.units().size(), "ZeRO stage 3: the layout has ", layout_.units.size(),
                " units, the model ", table_.units().size());
  for (auto& b : gather_buf_)
    if (layout_.gather_elems) b = Buffer(alloc, layout_.gather_elems * sizeof(bf16), compute);
  if (layout_.persistent_elems) persistent_ = Buffer(alloc, layout_.persistent_elems * sizeof(bf16), compute);
}

void ShardedParams::fork(cudaStream_t compute) {
  ready_.record(compute);
  ready_.wait_on(comm_stream_);
}
void ShardedParams::join(cudaStream_t compute) {
  done_.record(comm_stream_);
  done_.wait_on(compute);
}

void ShardedParams::begin_pass(const bf16* shard, const std::vector<int>& order, const OverlapReduce* reduce) {
  CUTRAIN_CHECK(!in_pass_, "ZeRO stage 3: a pass began while another one is open");
  CUTRAIN_CHECK(shard != nullptr, "ZeRO stage 3: no param shard");
  shard_ = shard;
  order_ = order;
  gathered_units_.clear();
  for (int u : order_) {
    CUTRAIN_CHECK(u >= 0 && std::size_t(u) < layout_.units.size(), "ZeRO stage 3: unit ", u, " in the use order");
    if (!layout_.units[std::size_t(u)].persistent) gathered_units_.push_back(u);
  }
  pos_ = next_gather_ = 0;
  live_unit_ = -1;
  reducing_ = reduce != nullptr;
  if (reducing_) {
    CUTRAIN_CHECK(reduce->grads && reduce->grad_shard && reduce->micro_batches >= 1,
                  "ZeRO stage 3: an overlapped reduction needs both gradient buffers and a micro-batch count");
    reduce_ = *reduce;
  }
  written_.assign(layout_.units.size(), 0);
  reduced_ = 0;
  in_pass_ = true;
}

void ShardedParams::end_pass(cudaStream_t s) {
  CUTRAIN_CHECK(in_pass_ && pos_ == order_.size() && live_unit_ < 0, "ZeRO stage 3: the pass used ", pos_, " of ",
                order_.size(), " planned units", live_unit_ >= 0 ? " and left one acquired" : "");
  in_pass_ = false;
  if (!reducing_) return;
  CUTRAIN_CHECK(reduced_ == layout_.units.size(), "ZeRO stage 3: the pass reduced the gradients of ", reduced_, " of ",
                layout_.units.size(), " units");
  join(s);  // the norm and the optimizer read the gradient shard
}

void ShardedParams::grads_written(cudaStream_t s, int u) {
  CUTRAIN_CHECK(in_pass_ && u >= 0 && std::size_t(u) < layout_.units.size(), "ZeRO stage 3: gradients of unit ", u,
                " written outside a pass");
  if (!reducing_ || ++written_[std::size_t(u)] != reduce_.micro_batches) return;
  // The last micro-batch's backward of this unit is done: its gradients are final.
  grads_ready_.record(s);
  grads_ready_.wait_on(comm_stream_);
  reduce_unit(layout_.units[std::size_t(u)], reduce_.grads, reduce_.grad_shard, reduce_.grad_type);
  ++reduced_;
}

void ShardedParams::reduce_unit(const ShardUnit& s, const void* grads, void* grad_shard, DType t) {
  const std::size_t es = dtype_size(t);
  comm_->reduce_scatter(static_cast<const char*>(grads) + s.padded_offset * es,
                        static_cast<char*>(grad_shard) + s.shard_offset * es, s.per_rank, t, comm::ReduceOp::Avg,
                        comm_stream_);
}

void ShardedParams::gather(std::size_t k) {
  const ShardUnit& s = layout_.units[std::size_t(gathered_units_[k])];
  const int slot = int(k % 2);
  // The buffer's previous occupant (use k - 2 of this pass) was released on the compute stream.
  if (k >= 2) free_[slot].wait_on(comm_stream_);
  comm_->all_gather(shard_ + s.shard_offset, gather_buf_[slot].as<bf16>(), s.per_rank, DType::BF16, comm_stream_);
  gathered_[slot].record(comm_stream_);
  ++gathers_issued_;
}

const void* ShardedParams::acquire(cudaStream_t s, int u) {
  CUTRAIN_CHECK(in_pass_ && pos_ < order_.size() && order_[pos_] == u && live_unit_ < 0,
                "ZeRO stage 3: the model acquired unit ", u, " out of the planned order (use ", pos_, " of ",
                order_.size(), ")");
  ++pos_;
  live_unit_ = u;
  const ShardUnit& su = layout_.units[std::size_t(u)];
  if (su.persistent) return persistent_.as<bf16>() + su.persistent_offset;
  NvtxRange range("zero3.acquire");
  const std::size_t k = next_gather_++;
  if (k == 0) {
    fork(s);  // the pass's first gathers come after everything the compute stream did before
    gather(0);
  }
  gathered_[k % 2].wait_on(s);
  // Prefetch: the next gathered unit into the other buffer, overlapping this unit's kernels.
  if (k + 1 < gathered_units_.size()) gather(k + 1);
  return gather_buf_[k % 2].as<bf16>();
}

void ShardedParams::release(cudaStream_t s, int u) {
  CUTRAIN_CHECK(in_pass_ && live_unit_ == u, "ZeRO stage 3: the model released unit ", u, ", the acquired one is ",
                live_unit_);
  live_unit_ = -1;
  if (layout_.units[std::size_t(u)].persistent) return;
  free_[(next_gather_ - 1) % 2].record(s);
}

void ShardedParams::reduce_grads(cudaStream_t compute, const void* grads, void* grad_shard, DType t) {
  NvtxRange range("zero3.reduce_grads");
  fork(compute);
  for (const ShardUnit& s : layout_.units) reduce_unit(s, grads, grad_shard, t);
  join(compute);
}

void ShardedParams::refresh_persistent(cudaStream_t compute, const bf16* shard) {
  if (!layout_.persistent_elems) return;
  NvtxRange range("zero3.refresh_persistent");
  fork(compute);
  for (const ShardUnit& s : layout_.units)
    if (s.persistent)
      comm_->all_gather(shard + s.shard_offset, persistent_.as<bf16>() + s.persistent_offset, s.per_rank, DType::BF16,
                        comm_stream_);
  join(compute);
}

void ShardedParams::gather_padded(cudaStream_t compute, const void* shard, void* padded, DType t) {
  const std::size_t es = dtype_size(t);
  fork(compute);
  for (const ShardUnit& s : layout_.units)
    comm_->all_gather(static_cast<const char*>(shard) + s.shard_offset * es,
                      static_cast<char*>(padded) + s.padded_offset * es, s.per_rank, t, comm_stream_);
  join(compute);
}

}  // namespace cutrain::parallel
