// @brief The Hopper attention experiment's tensor maps over qkv and dO (host): the geometry of
// rows_tma_geometry encoded for the TMA with the 128-byte swizzle and zero fill out of bounds.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/attention.cuh"
#include "runtime/dtype.h"

namespace cutrain::bench::hopper {

// The sm_90a code runs on compute capability 9.0 only, with `smem_bytes` of shared memory per
// block: refused with what was found (`who` names the caller), instead of a bare launch error.
void check_device(const char* who, std::uint32_t smem_bytes);

CUtensorMap encode_qkv_map(const bf16* qkv, const kernels::AttentionShape& shape, int box_rows);
// The same over `slots` = 1 ([B, S, H, D]: the backward's dO) or 3 (qkv) tensors per token.
CUtensorMap encode_rows_map(const bf16* base, const kernels::AttentionShape& shape, int slots, int box_rows);

}  // namespace cutrain::bench::hopper
