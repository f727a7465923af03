// @brief ZeRO in the GPU engine, the collectives: the gradient reduction after backward, the
// global gradient norm, and the all-gather of the updated 16-bit params, on a communication stream
// ordered against the compute stream by events (fork/join, so it can be captured in the step's
// CUDA graph).
//
// Stage 0 (ZeroMode::AllReduce): the flat gradient buffer is all-reduced (averaged) after the
// last micro-batch's backward; with overlap_comm, in buckets of reduce_bucket_size elements along
// tensor boundaries (partition.h's make_buckets), all launched after backward: the buckets do not
// overlap backward, only each other's launch latency. Every rank then has the same gradients and
// computes the same norm (the single-process kernel), so the NaN/Inf skip is identical everywhere.
// Stage 3 (ZeroMode::Sharded): the norm over the gradient shard (global_norm_of_shard); the
// gathers and the per-unit reduce-scatter live in parallel/zero_stage3.h, on this object's stream.
// Stages 1-2 (ZeroMode::Partitioned): one in-place reduce-scatter (average) of the padded flat
// gradient buffer; rank r's reduced partition is grads[r*per_rank, (r+1)*per_rank). The norm is
// the sum of squares of each rank's (real) partition, all-reduced in fp64, then the usual formula:
// the same global norm, clip coefficient and skip flag on every rank.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "model/transformer_params.h"
#include "parallel/zero_plan.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "runtime/device.h"

namespace cutrain::parallel {

// What the collectives take from zero_optimization: overlap_comm (stage 0 in buckets along tensor
// boundaries) and the bucket size in elements.
struct ZeroCommOptions {
  bool overlap_comm = false;
  std::int64_t reduce_bucket_size = 500000000;
};

class ZeroComm {
 public:
  // `plan.mode` must not be None. `grad_type`: the flat gradient buffer's dtype.
  ZeroComm(std::shared_ptr<comm::Communicator> comm, const ZeroPlan& plan, const ZeroCommOptions& options,
           const model::TransformerParams& table, DType grad_type, CachingAllocator& alloc, cudaStream_t compute);

  // After the last backward, on `compute`: the gradient reduction of the mode (see above).
  void reduce_grads(cudaStream_t compute, void* grads);
  // The global norm of the reduced gradients into norm / clip_scale / nonfinite (device words).
  // `scratch`: kernels::grad_norm_scratch_bytes bytes. `loss_scale` (device, may be null): fp16's
  // loss scale the gradients carry (kernels::grad_norm_clip: the norm unscaled, 1/scale in clip_scale).
  void global_norm(cudaStream_t compute, const void* grads, float max_norm, float* norm, float* clip_scale,
                   int* nonfinite, void* scratch, const float* loss_scale = nullptr);
  // The same over `count` elements of this rank's reduced gradients at `grads` (Sharded: the
  // gradient shard): fp64 sum of squares all-reduced, then the usual formula.
  void global_norm_of_shard(cudaStream_t compute, const void* grads, std::size_t count, float max_norm, float* norm,
                            float* clip_scale, int* nonfinite, void* scratch, const float* loss_scale = nullptr);
  // After the optimizer (Partitioned): every rank's updated partition of the 16-bit params (bf16 or
  // fp16: `param_type`) into the full flat buffer (in place). No-op for AllReduce.
  void gather_params(cudaStream_t compute, void* params, DType param_type = DType::BF16);
  // Collective (every rank calls it): the full padded flat buffer of a partitioned state.
  // `part_buf`: this rank's per_rank elements of `t`; `full`: world x per_rank elements.
  void gather_state(cudaStream_t compute, const void* part_buf, void* full, DType t);

  const std::vector<Range>& buckets() const { return buckets_; }
  comm::Communicator& communicator() { return *comm_; }
  // The communication stream: stage 3's gathers use it too, so every collective of a rank is
  // issued on one stream in one order.
  cudaStream_t stream() const { return comm_stream_.get(); }

 private:
  // compute -> comm stream fork, and the join back.
  void fork(cudaStream_t compute);
  void join(cudaStream_t compute);

  std::shared_ptr<comm::Communicator> comm_;
  ZeroPlan plan_;
  DType grad_type_;
  std::vector<Range> buckets_;        // AllReduce: the all-reduce launches over the flat buffer
  Stream comm_stream_;
  Event ready_{false}, done_{false};
  Buffer sumsq_;  // one fp64: this rank's sum of squares, then the global one
};

// The all-reduce ranges of stage 0: the whole real buffer in one launch without overlap_comm,
// else buckets of at most `bucket_elems` along tensor boundaries. Pure (tests).
std::vector<Range> stage0_ranges(const model::TransformerParams& table, bool overlap_comm, std::size_t bucket_elems);

}  // namespace cutrain::parallel
