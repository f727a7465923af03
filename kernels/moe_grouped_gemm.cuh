// @brief Grouped GEMM over MoE experts with unequal token counts: one cuBLAS call
// (cublasGemmGroupedBatchedEx, CUDA 12.5+) for every expert's product, forward and the two
// backward GEMMs.
//
// Layouts follow kernels/gemm.cuh per group g (an expert): rows[g] consecutive rows of the
// activations x (group g starts at row Σ_{h<g} rows[h]), weights stacked [G, N, K] (nn.Linear's
// [out, in] per expert), bf16 storage, fp32 accumulation. `rows` is a host array: the counts come
// from the gate on the device, so the caller copies them to the host once per forward
// (not capturable in a CUDA graph). Groups with 0 rows take no GEMM; their weight gradient is
// zeroed (or left as is when accumulating).
//
// A combination cublasGemmGroupedBatchedEx refuses (status NOT_SUPPORTED / INVALID_VALUE before
// anything is queued, e.g. an fp32 weight gradient from bf16 inputs where this cuBLAS does not
// offer it) runs as one cuBLASLt GEMM per group through kernels/gemm's wrapper instead, remembered
// per operation and counted by fallback_count(). One stream at a time, like Gemm.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "runtime/dtype.h"

namespace cutrain::kernels {

class GroupedGemm {
 public:
  // max_groups bounds `groups` of every call (the device pointer arrays are sized once).
  explicit GroupedGemm(int max_groups);
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // y_g[rows_g, N] = x_g[rows_g, K] · W_g[N, K]ᵀ
  void forward(cudaStream_t s, const bf16* x, const bf16* w, bf16* y, const int* rows, int groups, int N, int K);
  // dx_g[rows_g, K] = dy_g[rows_g, N] · W_g[N, K] (+ beta · dx_g)
  void grad_input(cudaStream_t s, const bf16* dy, const bf16* w, bf16* dx, const int* rows, int groups, int N, int K,
                  float beta = 0.f);
  // dW_g[N, K] = dy_g[rows_g, N]ᵀ · x_g[rows_g, K] (+ dW_g when accumulate); dW bf16 or fp32.
  void grad_weight(cudaStream_t s, const bf16* dy, const bf16* x, void* dw, DType dw_type, const int* rows,
                   int groups, int N, int K, bool accumulate);

  // Calls that ran as the per-group cuBLASLt loop because the grouped call was refused.
  std::size_t fallback_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cutrain::kernels
