// @brief The GPU model's tensor-parallel group (model::TpDeviceGroup) over a device communicator
// (NCCL; runtime/comm/communicator.h): each block all-reduce is one in-place bf16 sum on the
// model's stream, so it is captured in the step's CUDA graph with the kernels around it. The
// engine's degree-1 run passes a one-rank NCCL communicator: the same calls as a multi-GPU group
// would make, each summing one rank.
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
  void all_reduce_sum(cudaStream_t s, bf16* buf, std::size_t count) override;
  comm::Communicator& group() { return *group_; }

 private:
  std::shared_ptr<comm::Communicator> group_;
};

}  // namespace cutrain::parallel
