// @brief Which implementation of a kernel family a launcher runs. Older versions stay selectable
// so one benchmark run measures them side by side ("layernorm/bwd/16384x4096@v1") and the tests
// check every one; Default is the version the measurements picked.
#pragma once

namespace cutrain::kernels {

enum class KernelVersion : int { Default = 0, V1 = 1, V2 = 2, V3 = 3 };

}  // namespace cutrain::kernels
