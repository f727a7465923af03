// @brief Small text helpers for messages, for any room.
#pragma once

#include <string>
#include <vector>

namespace cutrain {

// "a, b, c": the names a message lists.
inline std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

}  // namespace cutrain
