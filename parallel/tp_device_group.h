// @brief The GPU model's tensor-parallel group (model::TpDeviceGroup) over a device communicator
// (NCCL; runtime/comm/communicator.h): each block all-reduce is one in-place bf16 sum on the
// model's stream, the vocabulary-parallel loss's statistics fp32 max and sum, so they are captured
// in the step's CUDA graph with the kernels around them. The engine's degree-1 run passes a
// one-rank NCCL communicator: the same calls as a multi-GPU group would make, each summing one
// rank; a degree above 1 the tensor-parallel sub-communicator of the rank grid (ncclCommSplit).
#pragma once

#include <memory>

#include "model/transformer_gpu.h"
#include "runtime/comm/communicator.h"

namespace cutrain::parallel {

class CommTpDeviceGroup final : public model::TpDeviceGroup {
 public:
  // Throws cutrain::Error for a null or host (non-device) communicator.
  explicit CommTpDeviceGroup(std::shared_ptr<comm::Communicator> group);
  int size() const override { return group_->world_size(); }
  int rank() const override { return group_->rank(); }
  void all_reduce_sum(cudaStream_t s, bf16* buf, std::size_t count) override;
  void all_reduce_f32(cudaStream_t s, float* buf, std::size_t count, bool max) override;
  comm::Communicator& group() { return *group_; }

 private:
  std::shared_ptr<comm::Communicator> group_;
};

}  // namespace cutrain::parallel
