// @brief cuBLASLt GEMMs for the model's linear layers, with fused epilogues.
//
// Conventions (all row-major, PyTorch layouts): activations x[M,K], weights W[N,K] (nn.Linear's
// [out, in]), outputs y[M,N]. bf16 or fp16 storage (the member templates' T; instances of both),
// fp32 accumulation (CUBLAS_COMPUTE_32F). Algorithms are chosen by the
// cuBLASLt heuristic once per (shape, epilogue, dtype) and cached; the workspace is allocated once
// at construction (from the caching allocator when one is given).
//
// Pointers need only element alignment (2 B for bf16 / fp16, 4 B for fp32); the heuristic is told each
// pointer's real alignment, so misaligned or odd-shaped operands get a (slower) algorithm that
// supports them. Fused GELU/DGELU epilogues need the aux leading dimension (N resp. K) divisible
// by 8; otherwise (or when cuBLASLt offers no fused algorithm for an epilogue) the same result is
// computed as a plain GEMM plus an elementwise kernel (counted by fallback_count()).
// A Gemm owns one workspace: use it from one stream at a time (or one Gemm per stream); it is not
// thread-safe. Destroy it only after the work queued through it is done.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gemm_bias_grad_rule.h"
#include "runtime/dtype.h"

namespace cutrain {
class CachingAllocator;
}

namespace cutrain::kernels {

enum class GemmEpilogue {
  None,
  Bias,          // y = x·Wᵀ + bias
  BiasGeluTanh,  // y = gelu_tanh(x·Wᵀ + bias), pre-activation written to `aux` (cuBLASLt's GELU is the
                 //   tanh approximation; the model's exact-erf GELU is Bias + kernels/gelu)
};

// Where Gemm::grad_weight_bias takes db from. Measured is the production choice (the models'):
// the rule of kernels/gemm_bias_grad_rule.h. Epilogue and Kernel force one path per call, for the
// tests and the benchmark that measure both.
enum class BiasGradPath {
  Measured,  // bias_grad_in_epilogue(M, N, K, accumulate)
  Epilogue,  // cuBLASLt's BGRADB whenever it can (not with accumulate); else the kernel
  Kernel,    // the GEMM, then kernels::bias_grad
};

class Gemm {
 public:
  // `alloc` (may be null: plain cudaMalloc) provides the workspace of `workspace_bytes`.
  explicit Gemm(CachingAllocator* alloc = nullptr, std::size_t workspace_bytes = 32u << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[M,N] = x[M,K] · W[N,K]ᵀ (+ bias[N]); with BiasGeluTanh also aux[M,N] = pre-activation.
  template <typename T>
  void forward(cudaStream_t s, const T* x, const nondeduced_t<T>* w, const nondeduced_t<T>* bias, T* y, int M, int N,
               int K, GemmEpilogue ep = GemmEpilogue::None, nondeduced_t<T>* aux = nullptr);

  // y[M,N] = x[M,K] · W[N,K]ᵀ with an fp32 output (no epilogue): logits that are not rounded to
  // bf16 (the MoE gate's, which top-k routing reads).
  template <typename T>
  void forward_fp32(cudaStream_t s, const T* x, const nondeduced_t<T>* w, float* y, int M, int N, int K);

  // dx[M,K] = dy[M,N] · W[N,K]  (+ beta · dx: beta = 1 accumulates, e.g. a residual gradient).
  // With dgelu_tanh_aux non-null: dx = (dy·W) ⊙ gelu_tanh'(aux[M,K]) (cuBLASLt DGELU epilogue);
  // beta must then be 0 (an error otherwise: cuBLASLt would apply gelu' to the accumulated sum).
  template <typename T>
  void grad_input(cudaStream_t s, const T* dy, const nondeduced_t<T>* w, T* dx, int M, int N, int K, float beta = 0.f,
                  const nondeduced_t<T>* dgelu_tanh_aux = nullptr);

  // dW[N,K] = dy[M,N]ᵀ · x[M,K]  (+ dW when accumulate). dW is T or fp32 (`dw_type`).
  template <typename T>
  void grad_weight(cudaStream_t s, const T* dy, const nondeduced_t<T>* x, void* dw, DType dw_type, int M, int N, int K,
                   bool accumulate);

  // grad_weight plus the bias gradient db[N] = Σ_rows dy[M,N] (+ db when accumulate), both of
  // `grad_type` (T or fp32). In the GEMM's epilogue (cuBLASLt BGRADB: the reduction of B = dy over
  // the GEMM's k = M, written, never accumulated, in fp32 math rounded once to grad_type) when
  // `path` says so and accumulate is false; otherwise, or when cuBLASLt refuses it (no algorithm,
  // db's alignment or type: recorded in the plan cache, counted by fallback_count()), the GEMM and
  // then kernels::bias_grad through `scratch` (bias_grad_scratch_bytes(M, N) bytes; required, since
  // the fallback is decided by cuBLASLt after the checks).
  template <typename T>
  void grad_weight_bias(cudaStream_t s, const T* dy, const nondeduced_t<T>* x, void* dw, void* db, DType grad_type,
                        int M, int N, int K, bool accumulate, void* scratch,
                        BiasGradPath path = BiasGradPath::Measured);

  // Strided batches of the three products above without epilogue: `batches` independent products
  // over contiguous stacks, batch i at x + i·M·K, W + i·N·K, y + i·M·N (and dy / dx / dW alike):
  // MoE's experts over their fixed capacity slots (model/moe_layer.h), one cuBLASLt call each.
  void forward_batched(cudaStream_t s, const bf16* x, const bf16* w, bf16* y, int batches, int M, int N, int K);
  void grad_input_batched(cudaStream_t s, const bf16* dy, const bf16* w, bf16* dx, int batches, int M, int N, int K);
  void grad_weight_batched(cudaStream_t s, const bf16* dy, const bf16* x, void* dw, DType dw_type, int batches, int M,
                           int N, int K, bool accumulate);

  cublasLtHandle_t handle() const { return handle_; }
  // Number of cached matmul plans (descriptor + layouts + heuristic algorithm), one per distinct
  // (op, M, N, K, epilogue, output type, beta != 0, pointer alignments) seen so far.
  std::size_t plan_count() const;
  std::size_t workspace_bytes() const;
  // Calls so far that computed a Bias / BiasGeluTanh / DGELU epilogue, or a bias gradient that asked
  // for the BGRADB epilogue, unfused (plain GEMM plus an elementwise pass or kernels::bias_grad)
  // because cuBLASLt could not fuse it (odd leading dim, alignment, type, no algorithm). A
  // grad_weight_bias call whose path or accumulate sends it to the kernel is not a fallback.
  std::size_t fallback_count() const;
  // grad_weight_bias calls so far whose db came from the GEMM's epilogue.
  std::size_t bias_grad_epilogue_count() const;

 private:
  struct Impl;
  Impl* impl_;
  cublasLtHandle_t handle_ = nullptr;
};

// db[N] = Σ_rows dy[M,N] (+ db when accumulate), fp32 math, deterministic (fixed reduction order,
// no float atomics). dy is bf16 or fp16 (instances of both); db is bf16, fp16 or fp32. N <= 8192 on sm_90+: one launch of 8-block clusters, no
// scratch (may be null); wider (or without clusters): two launches through `scratch` of
// bias_grad_scratch_bytes(M, N) bytes.
std::size_t bias_grad_scratch_bytes(int M, int N);
template <typename TS>
void bias_grad(cudaStream_t s, const TS* dy, void* db, DType db_type, int M, int N, bool accumulate,
               void* scratch);

}  // namespace cutrain::kernels
