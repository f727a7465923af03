#include "runtime/check.h"

#include <cerrno>
#include <cstring>

namespace cutrain {

Error::Error(std::string message, const char* file, int line)
    : std::runtime_error(message), message_(std::move(message)), file_(file), line_(line) {}

std::string Error::location() const { return detail::concat(file_ ? file_ : "?", ":", line_); }

namespace detail {

void throw_error(std::string message, const char* file, int line) { throw Error(std::move(message), file, line); }

static std::string cuda_text(cudaError_t err) {
  return concat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

void throw_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  std::string msg = concat(expr, " failed: ", cuda_text(err));
  if (err == cudaErrorMemoryAllocation) throw OutOfMemoryError(std::move(msg), file, line);
  throw Error(std::move(msg), file, line);
}

void throw_cublas(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw Error(concat(expr, " failed: ", cublasLtGetStatusName(st), " (", cublasLtGetStatusString(st), ")"), file,
              line);
}

void throw_errno(int err, const char* expr, const char* file, int line) {
  throw Error(concat(expr, " failed: errno ", err, " (", std::strerror(err), ")"), file, line);
}

void throw_launch(cudaError_t err, const char* kernel, const char* file, int line) {
  throw Error(concat("launch of ", kernel, " failed: ", cuda_text(err)), file, line);
}

}  // namespace detail
}  // namespace cutrain
