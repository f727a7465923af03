// Column-major view for cuBLASLt: a row-major W[N,K] is the column-major K×N matrix A = Wᵀ
// (lda K). So y = W x is D(N×1) = Aᵀ·x, dx = Wᵀ dy is D(K×1) = A·dy, and the row-major dW[N,K]
// (column-major K×N) is D(K×N) = x·dyᵀ, an outer product (k = 1).
#include "tools/offload_model/offload_linear_fp32.h"

#include <cstdint>

#include "runtime/allocator.h"
#include "runtime/check.h"

namespace cutrain::tools {

struct Fp32Linear::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Fp32Linear::Fp32Linear(int N, int K, CachingAllocator& alloc) : N_(N), K_(K), alloc_(alloc) {
  CUTRAIN_CHECK(N > 0 && K > 0, "Fp32Linear: N and K must be positive, got N=", N, " K=", K);
  CUTRAIN_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_bytes_ = std::size_t{32} << 20;
  workspace_ = alloc_.allocate(workspace_bytes_);
  try {
    fwd_ = make_plan(N, 1, K, true, false, K, K, N);
    dgrad_ = make_plan(K, 1, N, false, false, K, N, K);
    wgrad_ = make_plan(K, N, 1, false, true, K, N, K);
  } catch (...) {
    delete fwd_;
    delete dgrad_;
    delete wgrad_;
    alloc_.deallocate(workspace_);
    cublasLtDestroy(handle_);
    throw;
  }
}

Fp32Linear::~Fp32Linear() {
  delete fwd_;
  delete dgrad_;
  delete wgrad_;
  if (workspace_) alloc_.deallocate(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

// D(m×n) = op(A)·op(B), A is (ta ? k×m : m×k) with lda, B is (tb ? n×k : k×n) with ldb.
Fp32Linear::Plan* Fp32Linear::make_plan(int m, int n, int k, bool ta, bool tb, int lda, int ldb, int ldd) {
  auto* p = new Plan;
  try {
    CUTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_32F, ta ? k : m, ta ? m : k, lda));
    CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_32F, tb ? n : k, tb ? k : n, ldb));
    CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, m, n, ldd));
    cublasLtMatmulPreference_t pref = nullptr;
    CUTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace_bytes_, sizeof(workspace_bytes_));
    // Layer views start at any fp32 element: only algorithms that take 4-byte alignment.
    const std::uint32_t align = 4;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->d, p->d, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    CUTRAIN_CUBLAS_CHECK(st);
    CUTRAIN_CHECK(found > 0, "Fp32Linear: cuBLASLt has no fp32 algorithm for ", m, "x", n, "x", k, " (transa ", ta,
                  ", transb ", tb, ")");
    p->algo = res.algo;
  } catch (...) {
    delete p;
    throw;
  }
  return p;
}

void Fp32Linear::run(cudaStream_t s, Plan* p, const float* A, const float* B, float* D, float beta) {
  const float alpha = 1.f;
  CUTRAIN_CUBLAS_CHECK(cublasLtMatmul(handle_, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->d, D, p->d, &p->algo,
                                      workspace_, workspace_bytes_, s));
}

void Fp32Linear::forward(cudaStream_t s, const float* x, const float* W, const float* b, float* y) {
  // y = b first, then y += Aᵀ·x (beta = 1).
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(y, b, std::size_t(N_) * 4, cudaMemcpyDeviceToDevice, s));
  run(s, fwd_, W, x, y, 1.f);
}

void Fp32Linear::grad_input(cudaStream_t s, const float* dy, const float* W, float* dx) { run(s, dgrad_, W, dy, dx, 0.f); }

void Fp32Linear::grad_weight(cudaStream_t s, const float* dy, const float* x, float* dW) {
  run(s, wgrad_, x, dy, dW, 0.f);
}

}  // namespace cutrain::tools
