// @brief Which implementation of a kernel family a launcher runs. Older versions stay selectable
// so one benchmark run measures them side by side ("layernorm/bwd/16384x4096@v1") and the tests
// check every one; Default is the version the measurements picked.
#pragma once

#include <string>

namespace cutrain::kernels {

enum class KernelVersion : int { Default = 0, V1 = 1, V2 = 2, V3 = 3 };

// "default", "v1", "v2", "v3": for test traces and error messages. (Appended, not "v" + string:
// that form draws GCC 12's false -Wrestrict at every inlined call site.)
inline std::string version_name(KernelVersion v) {
  if (v == KernelVersion::Default) return "default";
  std::string name(1, 'v');
  name += std::to_string(static_cast<int>(v));
  return name;
}

}  // namespace cutrain::kernels
