// @brief cutrain::Error, the one exception type of the project, and the message builder.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace cutrain {

// Every failure in cutrain throws this: what failed and, for library calls, the library's own
// message (what() == message(), the text a user sees), and the source location that threw it
// (file(), line(), location(): diagnostics, printed by the program only with CUTRAIN_DEBUG=1).
// Callers (tests, the training loop) can catch and recover.
class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line);
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }
  std::string location() const;  // "file:line"

 private:
  std::string message_;
  const char* file_;
  int line_;
};

// Out-of-memory is an Error a caller may want to tell apart (retry smaller, offload, ...).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
[[noreturn]] void throw_error(std::string message, const char* file, int line);
}  // namespace detail

}  // namespace cutrain

// Argument / state validation: CUTRAIN_CHECK(rows > 0, "rows must be positive, got ", rows);
#define CUTRAIN_CHECK(cond, ...)                                                               \
  do {                                                                                         \
    if (!(cond)) \
      ::cutrain::detail::throw_error(::cutrain::detail::concat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

// The one shape of a checked library call: `call` evaluated once into a `type`; any status but `ok`
// goes to `report(status, what, __FILE__, __LINE__)`, a [[noreturn]] reporter that throws
// cutrain::Error with the library's message (CUTRAIN_CUDA_CHECK and its siblings in check.h and
// nccl_check.h).
#define CUTRAIN_CHECK_STATUS(type, call, ok, report, what)  \
  do {                                                      \
    type cutrain_status_ = (call);                          \
    if (cutrain_status_ != (ok)) \
      report(cutrain_status_, what, __FILE__, __LINE__);    \
  } while (0)

#define CUTRAIN_FAIL(...) \
  ::cutrain::detail::throw_error(::cutrain::detail::concat(__VA_ARGS__), __FILE__, __LINE__)
