// @brief Checked calls: CUDA runtime, cuBLAS(Lt), system calls, and the kernel-launch check.
// Each failure throws cutrain::Error with the expression, file:line and the library's message.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "runtime/error.h"

namespace cutrain::detail {
[[noreturn]] void throw_cuda(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t st, const char* expr, const char* file, int line);
[[noreturn]] void throw_errno(int err, const char* expr, const char* file, int line);
[[noreturn]] void throw_launch(cudaError_t err, const char* kernel, const char* file, int line);
}  // namespace cutrain::detail

#define CUTRAIN_CUDA_CHECK(expr) \
  CUTRAIN_CHECK_STATUS(cudaError_t, expr, cudaSuccess, ::cutrain::detail::throw_cuda, #expr)

#define CUTRAIN_CUBLAS_CHECK(expr) \
  CUTRAIN_CHECK_STATUS(cublasStatus_t, expr, CUBLAS_STATUS_SUCCESS, ::cutrain::detail::throw_cublas, #expr)

// For POSIX calls that return -1 and set errno.
#define CUTRAIN_SYS_CHECK(expr)                                                        \
  do {                                                                                 \
    if ((expr) == -1) \
      ::cutrain::detail::throw_errno(errno, #expr, __FILE__, __LINE__);                \
  } while (0)

// After every <<<...>>> launch: reports configuration errors (bad grid, too much shared
// memory) at the launch site, without synchronizing.
#define CUTRAIN_LAUNCH_CHECK(kernel_name) \
  CUTRAIN_CHECK_STATUS(cudaError_t, cudaGetLastError(), cudaSuccess, ::cutrain::detail::throw_launch, kernel_name)
