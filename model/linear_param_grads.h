// @brief A linear layer's parameter gradients (dW and db) as timed regions (internal to model/): one
// region "<layer>_dw_db" where kernels/gemm_bias_grad_rule.h puts db in the weight-gradient GEMM's
// epilogue (Gemm::grad_weight_bias), else the two regions "<layer>_dw" (the GEMM) and "<layer>_db"
// (kernels::bias_grad), so the timing report names what ran. The models pass the calls, since the
// tensor-parallel blocks route dW (and a sliced db) through packed buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/gemm_bias_grad_rule.h"
#include "model/kernel_costs.h"
#include "model/timed_call.h"

namespace cutrain::model {

// The region names of one linear layer's backward.
struct LinearRegions {
  const char *dw, *db, *dw_db, *dx;
};

// y = x·Wᵀ + b with dy [M, N], x [M, K]; gradients of `g_bytes` per element, added to when `acc`.
// `fused()` computes both through Gemm::grad_weight_bias (its default path, the same rule; a
// cuBLASLt refusal falls back inside it and is counted by Gemm::fallback_count()); `dw()` and `db()`
// are the separate GEMM and reduction.
template <typename Fused, typename Dw, typename Db>
void linear_param_grads(cudaStream_t s, const LinearRegions& n, std::size_t M, std::size_t N, std::size_t K,
                        std::size_t g_bytes, bool acc, Fused&& fused, Dw&& dw, Db&& db) {
  if (kernels::bias_grad_in_epilogue(int(M), int(N), int(K), acc)) {
    timed(s, n.dw_db, cost::gemm_grad_weight_bias(M, N, K, g_bytes), fused);
    return;
  }
  timed(s, n.dw, cost::gemm_grad_weight(M, N, K, g_bytes, acc), dw);
  timed(s, n.db, cost::bias_grad(M, N, g_bytes, acc), db);
}

}  // namespace cutrain::model
