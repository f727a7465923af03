// @brief One kernel call as a named region (internal to model/): NVTX always, CUDA events under
// --timing_report, with the FLOPs and bytes the call must compute and move (kernel_costs.h).
#pragma once

#include <cuda_runtime.h>

#include "model/kernel_costs.h"
#include "runtime/timing.h"

namespace cutrain::model {

template <typename Launch>
void timed(cudaStream_t s, const char* name, cost::Cost c, Launch&& launch) {
  TimedRegion r(name, s, c.flops, c.bytes);
  launch();
}

}  // namespace cutrain::model
