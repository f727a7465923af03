// @brief The Hopper attention experiment's tensor map over qkv (host): the geometry of
// qkv_tma_geometry encoded for the TMA with the 128-byte swizzle and zero fill out of bounds.
#pragma once

#include <cuda.h>

#include "kernels/attention.cuh"
#include "runtime/dtype.h"

namespace cutrain::bench::hopper {

CUtensorMap encode_qkv_map(const bf16* qkv, const kernels::AttentionShape& shape, int box_rows);

}  // namespace cutrain::bench::hopper
