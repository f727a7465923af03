// @brief The sm90 attention pair's tensor maps over qkv and dO (host): the geometry of
// rows_tma_geometry encoded for the TMA (bf16 or fp16 elements) with the 128-byte swizzle and zero
// fill out of bounds.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/attention.cuh"
#include "runtime/dtype.h"

namespace cutrain::kernels::sm90 {

// The sm_90a code runs on compute capability 9.0 only, with `smem_bytes` of shared memory per
// block: refused with what was found (`who` names the caller), instead of a bare launch error.
void check_device(const char* who, std::uint32_t smem_bytes);

// The current device's multiprocessor count (the persistent forward's grid, FwdConfig::grid_ctas).
int multiprocessors();

// setmaxnreg.inc waits for the registers another warpgroup frees, so a kernel whose warpgroups
// move registers must get at launch at least the sum of their counts (`need`, over `threads`
// threads); a build that gives fewer would hang, so it is refused (`who` names the schedule).
void check_register_pool(const void* kernel, int threads, int need, const char* who);

// E: bf16 or f16 (instances of both), the map's element type.
template <typename E>
CUtensorMap encode_qkv_map(const E* qkv, const AttentionShape& shape, int box_rows);
// The same over `slots` = 1 ([B, S, H, D]: the backward's dO) or 3 (qkv) tensors per token.
template <typename E>
CUtensorMap encode_rows_map(const E* base, const AttentionShape& shape, int slots, int box_rows);

// The fast backward's fp32 dQ accumulator [B, S, H, D] as a 4-D map (D, H, S, B) for the TMA's
// reduce-add: boxes of 32 columns x 64 rows of one (batch, head), 128-byte swizzle.
CUtensorMap encode_dq_acc_map(float* dq_acc, const AttentionShape& shape);

}  // namespace cutrain::kernels::sm90
