// @brief Test kernel of a known duration (spins on %globaltimer).
#pragma once

#include <cuda_runtime.h>

namespace cutrain::test {
// Runs one block for `microseconds` of wall time on `s`; `sink` is one device word it writes.
void spin_for(cudaStream_t s, double microseconds, unsigned long long* sink);
}  // namespace cutrain::test
