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
  pos_ = 0;
  window_.reset(gathered_units_.size());
  live_.clear();
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
  CUTRAIN_CHECK(in_pass_ && pos_ == order_.size() && live_.empty(), "ZeRO stage 3: the pass used ", pos_, " of ",
                order_.size(), " planned units", live_.empty() ? "" : " and left units acquired");
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

void ShardedParams::issue_gathers(cudaStream_t compute) {
  // Gather j is the prefetch of use j once use j - 1 is acquired, and may overwrite its buffer
  // once use j - 2 is released.
  while (window_.can_issue()) {
    const std::size_t j = window_.issue();
    if (j == 0) fork(compute);  // the pass's first gathers come after everything the compute stream did before
    gather(j);
  }
}

const void* ShardedParams::acquire(cudaStream_t s, int u) {
  CUTRAIN_CHECK(in_pass_ && pos_ < order_.size() && order_[pos_] == u, "ZeRO stage 3: the model acquired unit ", u,
                " out of the planned order (use ", pos_, " of ", order_.size(), ")");
  for (const Live& l : live_)
    CUTRAIN_CHECK(l.unit != u, "ZeRO stage 3: the model acquired unit ", u, " while holding it");
  CUTRAIN_CHECK(live_.size() < 2, "ZeRO stage 3: the model acquired unit ", u, " while holding two others (",
                live_[0].unit, " and ", live_[1].unit, "); at most two units are live");
  ++pos_;
  const ShardUnit& su = layout_.units[std::size_t(u)];
  if (su.persistent) {
    live_.push_back({u, kPersistent});
    return persistent_.as<bf16>() + su.persistent_offset;
  }
  NvtxRange range("zero3.acquire");
  const std::size_t k = window_.acquire();
  issue_gathers(s);  // gather k (when not prefetched) and the prefetch of k + 1
  CUTRAIN_CHECK(window_.issued() > k, "ZeRO stage 3: unit ", u, "'s gather waits for the release of gathered use ", k - 2,
                " (unit ", gathered_units_[k - 2], "), still held: at most two gathered units are live");
  live_.push_back({u, k});
  gathered_[k % 2].wait_on(s);
  return gather_buf_[k % 2].as<bf16>();
}

void ShardedParams::release(cudaStream_t s, int u) {
  auto it = live_.begin();
  while (it != live_.end() && it->unit != u) ++it;
  CUTRAIN_CHECK(in_pass_ && it != live_.end(), "ZeRO stage 3: the model released unit ", u, ", which it does not hold");
  const std::size_t k = it->use;
  live_.erase(it);
  if (k == kPersistent) return;
  free_[k % 2].record(s);
  window_.release(k);
  issue_gathers(s);  // the gather waiting for this buffer, when its use's predecessor is acquired
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
