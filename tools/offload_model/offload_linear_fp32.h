// @brief fp32 matrix-vector products of a Linear(K -> N) layer for micro batch 1 (the offload
// example's float32 mode), through cuBLASLt with fp32 compute. Row-major PyTorch layouts: W[N,K].
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace cutrain {
class CachingAllocator;
class Buffer;
}

namespace cutrain::tools {

class Fp32Linear {
 public:
  Fp32Linear(int N, int K, CachingAllocator& alloc);
  ~Fp32Linear();
  Fp32Linear(const Fp32Linear&) = delete;
  Fp32Linear& operator=(const Fp32Linear&) = delete;

  void forward(cudaStream_t s, const float* x, const float* W, const float* b, float* y);  // y = W x + b
  void grad_input(cudaStream_t s, const float* dy, const float* W, float* dx);           // dx = Wᵀ dy
  void grad_weight(cudaStream_t s, const float* dy, const float* x, float* dW);          // dW = dy xᵀ

 private:
  struct Plan;
  Plan* make_plan(int m, int n, int k, bool ta, bool tb, int lda, int ldb, int ldd);
  void run(cudaStream_t s, Plan* p, const float* A, const float* B, float* D, float beta);
  int N_, K_;
  cublasLtHandle_t handle_ = nullptr;
  Plan *fwd_ = nullptr, *dgrad_ = nullptr, *wgrad_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  CachingAllocator& alloc_;
};

}  // namespace cutrain::tools
