#include "parallel/tp_device_group.h"

#include "runtime/error.h"

namespace cutrain::parallel {

CommTpDeviceGroup::CommTpDeviceGroup(std::shared_ptr<comm::Communicator> group) : group_(std::move(group)) {
  CUTRAIN_CHECK(group_ != nullptr, "tensor parallel (gpu): expected the group's communicator, found none");
  CUTRAIN_CHECK(group_->device() >= 0, "tensor parallel (gpu): expected a device communicator (nccl), found ",
                group_->backend_name());
}

void CommTpDeviceGroup::all_reduce_sum(cudaStream_t s, bf16* buf, std::size_t count) {
  group_->all_reduce(buf, count, DType::BF16, comm::ReduceOp::Sum, s);
}

void CommTpDeviceGroup::all_reduce_f32(cudaStream_t s, float* buf, std::size_t count, bool max) {
  group_->all_reduce(buf, count, DType::F32, max ? comm::ReduceOp::Max : comm::ReduceOp::Sum, s);
}

}  // namespace cutrain::parallel
