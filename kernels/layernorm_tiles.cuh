// @brief The LayerNorm family's tile table and shape rules (internal to layernorm.cu / layernorm_bwd.cu).
//
// Vector paths need cols % 8 == 0 and 16-byte aligned pointers; otherwise the scalar tile runs.
// Each path is one tile struct below, chosen by cols; kernels are templated on it.
#pragma once

#include <initializer_list>

#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"

namespace cutrain::kernels::ln {

constexpr int kMinCols = 64, kMaxCols = 16384;

// Forward, cols <= 1024: a row per warp, kRowsPerBlock rows per block, up to kMaxVpt vectors of
// 8 per lane (the kernel instance takes VPT = ceil(cols / 256)).
struct FwdWarpRow {
  static constexpr bool kWarpRow = true;
  static constexpr int kRowsPerBlock = 8, kMaxVpt = 4, kThreads = kRowsPerBlock * kWarpSize;
};
// Forward (every width above FwdWarpRow) and backward past BwdTeam's 8192 columns: a row per
// block of up to 512 threads, 4 vectors each.
struct BlockRow {
  static constexpr bool kWarpRow = false;
  static constexpr int kVpt = 4, kMaxThreads = 512, kFinalLanes = 16;
};
// Backward up to 8192 columns: a team of TW warps per row (TW = the power of two that covers the
// row at kVpt vectors per thread), teams packed to kBlockWarps per block, kDepth rows prefetched;
// the grid aims at kWarpsPerSm resident warps (2 blocks at <= 128 registers).
struct BwdTeam {
  static constexpr int kVpt = 2, kBlockWarps = 8, kDepth = 1, kWarpsPerSm = 16, kMaxTeamWarps = 16;
  static constexpr int kFinalLanes = 32;  // finalize: wider, so a 1024-column shape keeps more loads in flight
  static constexpr int kMaxCols = kMaxTeamWarps * kWarpSize * kVpt * kBf16PerVec;  // 8192
};
// Any shape or alignment: one block per row, several passes over global memory; the backward's
// parameter partials come from (32, kPartialRows) blocks.
struct Scalar {
  static constexpr int kThreads = 256, kPartialRows = 8, kFinalLanes = 16;
};

constexpr bool use_warp_rows(int cols) { return cols <= FwdWarpRow::kMaxVpt * kWarpSize * kBf16PerVec; }
constexpr bool use_bwd_team(int cols) { return cols <= BwdTeam::kMaxCols; }
constexpr int block_row_threads(int cols) {
  return ceil_div(ceil_div(cols / kBf16PerVec, BlockRow::kVpt), kWarpSize) * kWarpSize;
}

inline void check_shape(const char* what, int rows, int cols) {
  CUTRAIN_CHECK(rows > 0, what, ": rows must be positive, got ", rows);
  CUTRAIN_CHECK(cols >= kMinCols && cols <= kMaxCols, what, ": hidden size (cols) must be in [", kMinCols, ", ",
                kMaxCols, "], got ", cols);
}

inline bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && !is_aligned16(p)) return false;
  return true;
}

}  // namespace cutrain::kernels::ln
