// @brief The device's measured peaks the timing report rates kernels against: device-to-device
// copy bandwidth and the bf16 TFLOP/s of one large cuBLASLt GEMM, measured once (~0.3 s).
#pragma once

#include <cuda_runtime.h>

#include "runtime/timing_report.h"

namespace cutrain {

// Allocates ~1.4 GiB with cudaMalloc for the measurement and frees it before returning, so call it
// before the training state takes the memory. Medians of several timed runs after warm-up.
DevicePeaks measure_peaks(cudaStream_t stream = nullptr);

}  // namespace cutrain
