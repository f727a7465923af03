// @brief What CPU tests share without CUDA: a fresh temporary folder and the message of a thrown
// cutrain::Error.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "runtime/error.h"

namespace cutrain::test {

// A new, empty folder under the system's temp directory, unique per process and call:
// <tmp>/cutrain_<prefix>_<tag>_<pid>_<n>.
inline std::filesystem::path fresh_temp_dir(const std::string& prefix, const std::string& tag = "") {
  static int n = 0;
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / ("cutrain_" + prefix + (tag.empty() ? "" : "_" + tag) + "_" +
                                            std::to_string(::getpid()) + "_" + std::to_string(n++));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The message of the cutrain::Error that f throws, or "(no error)".
inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

}  // namespace cutrain::test

// msg contains part (the message is printed when it does not).
#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)
