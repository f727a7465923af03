// @brief The training state copied to host memory in the dtypes it has on the device (bf16 or
// fp32 params, fp32 master, fp32 or bf16 moments): what a checkpoint's files hold, taken in one go
// at a step boundary so that training can go on while it is written (train/checkpoint_writer.h).
// Its storage is pinned when a GPU is present (the device-to-host copies run at the link's speed
// and the aio engine writes from it) and is kept for the next snapshot of the same size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/dtype.h"

namespace cutrain::train {

struct HostState;

// One flat state tensor (the parameter table's layout) in host memory.
class SnapshotTensor {
 public:
  // Storage for `numel` elements of `dtype` (the previous storage when it is big enough).
  void* reserve(DType dtype, std::size_t numel, bool pinned);
  void clear() { numel_ = 0; }  // absent from this snapshot (a layout without fp32 master)
  bool empty() const { return numel_ == 0; }
  DType dtype() const { return dtype_; }
  std::size_t numel() const { return numel_; }
  std::size_t bytes() const { return numel_ * dtype_size(dtype_); }
  const void* data() const { return data_; }
  void* data() { return data_; }

 private:
  DType dtype_ = DType::F32;
  std::size_t numel_ = 0;
  void* data_ = nullptr;
  Buffer pinned_;                  // from the pinned caching allocator
  std::vector<std::byte> plain_;  // CPU-only machines
};

struct StateSnapshot {
  SnapshotTensor params, master, exp_avg, exp_avg_sq, compensation;  // compensation: bf16, when kept
  bool pinned = false;  // storage pinned (its owner sets it: whether a GPU is present)
  std::size_t bytes() const {
    return params.bytes() + master.bytes() + exp_avg.bytes() + exp_avg_sq.bytes() + compensation.bytes();
  }
};

// The snapshot of a host state: params in `h.param_dtype`, the master in fp32, the moments in
// `h.moment_dtype`, the compensation in bf16 (exact: they came from those dtypes).
void snapshot_from_host_state(const HostState& h, StateSnapshot& out);
// A tensor's elements as fp32.
std::vector<float> to_floats(const SnapshotTensor& t);
// The other way (every element to fp32; the dtypes kept in param_dtype / moment_dtype).
HostState host_state_from_snapshot(const StateSnapshot& s);

}  // namespace cutrain::train
