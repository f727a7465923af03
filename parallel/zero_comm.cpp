#include "parallel/zero_comm.h"

#include "kernels/reduce.cuh"
#include "model/transformer_params.h"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::parallel {

std::vector<Range> stage0_ranges(const model::TransformerParams& table, bool overlap_comm, std::size_t bucket_elems) {
  if (!overlap_comm) return {{0, table.flat_size()}};
  std::vector<TensorSpan> spans;
  for (const auto& t : table.tensors()) spans.push_back({t.name, t.offset, t.count});
  std::vector<Range> out;
  // Between buckets only flat-buffer padding is skipped: zero on every rank, never written.
  for (const auto& b : make_buckets(spans, bucket_elems)) out.push_back(b.range);
  return out;
}

ZeroComm::ZeroComm(std::shared_ptr<comm::Communicator> comm, const ZeroPlan& plan, const ZeroCommOptions& config,
                   const model::TransformerParams& table, DType grad_type, CachingAllocator& alloc, cudaStream_t compute)
    : comm_(std::move(comm)), plan_(plan), grad_type_(grad_type) {
  CUTRAIN_CHECK(comm_ != nullptr, "ZeroComm: no communicator");
  CUTRAIN_CHECK(plan_.mode != ZeroMode::None, "ZeroComm: ZeRO mode 'none' has no collectives");
  CUTRAIN_CHECK(comm_->world_size() == plan_.world && comm_->rank() == plan_.rank, "ZeroComm: the communicator is rank ",
                comm_->rank(), " of ", comm_->world_size(), ", the plan expects rank ", plan_.rank, " of ", plan_.world);
  CUTRAIN_CHECK(plan_.part.numel == table.flat_size(), "ZeroComm: plan over ", plan_.part.numel,
                " elements, the model's flat buffer has ", table.flat_size());
  CUTRAIN_CHECK(config.reduce_bucket_size > 0, "zero_optimization.reduce_bucket_size must be positive, found ",
                config.reduce_bucket_size);
  if (plan_.mode == ZeroMode::AllReduce)
    buckets_ = stage0_ranges(table, config.overlap_comm, std::size_t(config.reduce_bucket_size));
  nvtx_name_stream(comm_stream_.get(), "cutrain.comm");
  sumsq_ = Buffer(alloc, sizeof(double), compute);
}

void ZeroComm::fork(cudaStream_t compute) {
  ready_.record(compute);
  ready_.wait_on(comm_stream_.get());
}
void ZeroComm::join(cudaStream_t compute) {
  done_.record(comm_stream_.get());
  done_.wait_on(compute);
}

void ZeroComm::reduce_grads(cudaStream_t compute, void* grads) {
  NvtxRange range("nccl");
  fork(compute);
  const std::size_t es = dtype_size(grad_type_);
  if (plan_.mode == ZeroMode::AllReduce) {
    for (const Range& r : buckets_)
      comm_->all_reduce(static_cast<char*>(grads) + r.begin * es, r.size(), grad_type_, comm::ReduceOp::Avg,
                        comm_stream_.get());
  } else {
    // In place: rank r's result lands at its own slice of the send buffer (NCCL's in-place rule).
    const std::size_t per = plan_.part.per_rank;
    char* g = static_cast<char*>(grads);
    comm_->reduce_scatter(g, g + std::size_t(plan_.rank) * per * es, per, grad_type_, comm::ReduceOp::Avg,
                          comm_stream_.get());
  }
  join(compute);
}

void ZeroComm::global_norm(cudaStream_t compute, const void* grads, float max_norm, float* norm, float* clip_scale,
                           int* nonfinite, void* scratch, const float* loss_scale) {
  if (plan_.mode == ZeroMode::AllReduce) {
    // Identical reduced gradients on every rank: the single-process kernel gives the same bits everywhere.
    kernels::grad_norm_clip(compute, grads, grad_type_, plan_.part.numel, max_norm, norm, clip_scale, nonfinite,
                            scratch, loss_scale);
    return;
  }
  const Range r = plan_.norm_range();
  const std::size_t es = dtype_size(grad_type_);
  global_norm_of_shard(compute, static_cast<const char*>(grads) + r.begin * es, r.size(), max_norm, norm, clip_scale,
                       nonfinite, scratch, loss_scale);
}

void ZeroComm::global_norm_of_shard(cudaStream_t compute, const void* grads, std::size_t count, float max_norm,
                                    float* norm, float* clip_scale, int* nonfinite, void* scratch,
                                    const float* loss_scale) {
  double* s = sumsq_.as<double>();
  kernels::grad_sumsq(compute, grads, grad_type_, count, s, scratch);
  fork(compute);
  comm_->all_reduce_sum_f64(s, 1, comm_stream_.get());
  join(compute);
  kernels::grad_norm_from_sumsq(compute, s, max_norm, norm, clip_scale, nonfinite, loss_scale);
}

void ZeroComm::gather_params(cudaStream_t compute, void* params, DType param_type) {
  if (plan_.mode != ZeroMode::Partitioned) return;
  NvtxRange range("nccl");
  const std::size_t per = plan_.part.per_rank;
  fork(compute);
  char* p = static_cast<char*>(params);
  comm_->all_gather(p + std::size_t(plan_.rank) * per * dtype_size(param_type), p, per, param_type,
                    comm_stream_.get());
  join(compute);
}

void ZeroComm::gather_state(cudaStream_t compute, const void* part_buf, void* full, DType t) {
  CUTRAIN_CHECK(plan_.mode == ZeroMode::Partitioned, "ZeroComm::gather_state: the state is not partitioned");
  fork(compute);
  comm_->all_gather(part_buf, full, plan_.part.per_rank, t, comm_stream_.get());
  join(compute);
}

}  // namespace cutrain::parallel
