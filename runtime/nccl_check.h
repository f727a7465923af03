// @brief CUTRAIN_NCCL_CHECK: checked NCCL calls (only for code built with NCCL).
#pragma once

#include <nccl.h>

#include "runtime/error.h"

namespace cutrain::detail {
[[noreturn]] inline void throw_nccl(ncclResult_t r, const char* expr, const char* file, int line) {
  throw_error(concat(expr, " failed: NCCL error ", static_cast<int>(r), " (", ncclGetErrorString(r),
                     ")", r == ncclSystemError || r == ncclRemoteError ? concat("; ", ncclGetLastError(nullptr)) : ""),
              file, line);
}
}  // namespace cutrain::detail

#define CUTRAIN_NCCL_CHECK(expr)                                                       \
  do {                                                                                 \
    ncclResult_t cutrain_r_ = (expr);                                                  \
    if (cutrain_r_ != ncclSuccess) \
      ::cutrain::detail::throw_nccl(cutrain_r_, #expr, __FILE__, __LINE__);            \
  } while (0)
