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

#define CUTRAIN_NCCL_CHECK(expr) \
  CUTRAIN_CHECK_STATUS(ncclResult_t, expr, ncclSuccess, ::cutrain::detail::throw_nccl, #expr)
