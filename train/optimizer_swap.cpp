#include "train/optimizer_swap.h"

#include "runtime/aio/aio_handle.h"
#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::train {

OptimizerSwap::OptimizerSwap(const TrainConfig& c, CachingAllocator& alloc, cudaStream_t stream,
                             std::vector<std::pair<std::string, Buffer*>> states)
    : cfg_(c.zero_optimization.offload_optimizer), stream_(stream), off_(alloc, stream) {
  CUTRAIN_CHECK(cfg_.device != OffloadTarget::None,
                "offload_optimizer: device \"none\" is not an offload device (expected \"cpu\" or \"nvme\")");
  check_offload_paths(c);
  opts_.device = cfg_.device == OffloadTarget::Nvme ? OffloadDevice::Nvme : OffloadDevice::Cpu;
  opts_.pin_memory = cfg_.pin_memory;
  opts_.nvme_path = cfg_.nvme_path;
  aio::HandleOptions h;
  h.block_size = std::size_t(c.aio.block_size);
  h.queue_depth = c.aio.queue_depth;
  h.intra_op_parallelism = c.aio.intra_op_parallelism;
  h.single_submit = c.aio.single_submit;
  h.overlap_events = c.aio.overlap_events;
  off_.set_aio_options(h);
  std::string list;
  for (auto& [name, buf] : states) {
    off_.add(name, buf);
    names_.push_back(name);
    list += (list.empty() ? "" : ", ") + name;
  }
  const std::string where = cfg_.device == OffloadTarget::Nvme ? "files under " + cfg_.nvme_path
                                                  : std::string(cfg_.pin_memory ? "pinned" : "pageable") + " host memory";
  describe_ = detail::concat("offload_optimizer: ", list, " (", format_bytes(double(bytes())), ") live in ", where,
                             " between steps; read ",
                             cfg_.pipeline_read ? "pipelined (starts with the step, overlaps forward/backward)"
                                                : "blocking (right before the optimizer)",
                             ", write ",
                             cfg_.pipeline_write ? "pipelined (starts after the optimizer launch)"
                                                 : "blocking (right after the optimizer)",
                             "; parameters and gradients stay on the device");
}

std::size_t OptimizerSwap::bytes() const {
  std::size_t n = 0;
  for (const auto& name : names_) n += off_.bytes(name);
  return n;
}

bool OptimizerSwap::swapped_out() const {
  for (const auto& name : names_)
    if (!off_.is_offloaded(name)) return false;
  return true;
}

void OptimizerSwap::begin_step() {
  if (!cfg_.pipeline_read) return;
  NvtxRange r("optimizer_swap_in_start");
  off_.reload(names_, /*non_blocking=*/true);
}

void OptimizerSwap::before_optimizer() {
  NvtxRange r("optimizer_swap_in_wait");
  off_.reload(names_, /*non_blocking=*/false);  // what is still offloaded (all of it without pipeline_read)
  for (const auto& name : names_) off_.wait_resident(name, stream_);
}

void OptimizerSwap::swap_out(bool non_blocking) {
  NvtxRange r("optimizer_swap_out");
  OffloadOptions o = opts_;
  o.non_blocking = non_blocking;
  off_.offload(names_, o);
}

void OptimizerSwap::make_resident() {
  off_.reload(names_, /*non_blocking=*/false);
  for (const auto& name : names_) off_.wait_resident(name, stream_);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace cutrain::train
