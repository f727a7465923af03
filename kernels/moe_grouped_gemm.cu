// @brief kernels/moe_grouped_gemm.cuh: the grouped cuBLAS call, its device pointer arrays, and the
// per-group cuBLASLt fallback.
//
// Row-major <-> column-major as in kernels/gemm.cu, per group g with r = rows[g]:
//   forward     y_g = x_g·W_gᵀ:   m = N, n = r, k = K;  A = W_g (op T, lda K), B = x_g (op N, ldb K), C ldc N
//   grad_input  dx_g = dy_g·W_g:  m = K, n = r, k = N;  A = W_g (op N, lda K), B = dy_g (op N, ldb N), C ldc K
//   grad_weight dW_g = dy_gᵀ·x_g: m = K, n = N, k = r;  A = x_g (op N, lda K), B = dy_g (op T, ldb N), C ldc K
// Every group is its own cuBLAS "group" of one problem (their n or k differ). The A/B/C pointer
// arrays live on the device: a one-block kernel writes them from a by-value parameter, so they
// are ordered on the stream like the GEMM that reads them (no pinned staging buffer to guard).
#include "kernels/moe_grouped_gemm.cuh"

#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "kernels/gemm.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {
namespace {

constexpr int kChunk = 128;  // problems per grouped call: the pointer parameter stays under 4 KB

struct PointerChunk {
  const void* p[3][kChunk];  // A, B, C of each problem
  int n;
};
static_assert(sizeof(PointerChunk) <= 4096, "the pointer chunk must fit a kernel parameter");

__global__ void write_pointers_kernel(PointerChunk chunk, void** dst) {
  const int i = threadIdx.x;
  if (i >= chunk.n) return;
  for (int j = 0; j < 3; ++j) dst[j * kChunk + i] = const_cast<void*>(chunk.p[j][i]);
}

enum class Op { Forward, GradInput, GradWeightBf16, GradWeightF32 };

// One problem in column-major terms.
struct Problem {
  const void* a;
  const void* b;
  void* c;
  int m, n, k, lda, ldb, ldc;
};

}  // namespace

struct GroupedGemm::Impl {
  cublasHandle_t handle = nullptr;
  int max_groups = 0;
  void** dev_ptrs = nullptr;  // ceil(max_groups / kChunk) regions of 3·kChunk pointers
  Gemm lt{nullptr, 32u << 20};      // the per-group fallback
  std::map<Op, bool> refused;       // operations the grouped call refused once
  std::size_t fallbacks = 0;

  ~Impl() {
    if (dev_ptrs) cudaFree(dev_ptrs);
    if (handle) cublasDestroy(handle);
  }

  // Runs `probs` (all with the same transposes and C type) through the grouped call. Returns false
  // when cuBLAS refuses the combination (nothing queued then).
  bool grouped(cudaStream_t s, Op op, const std::vector<Problem>& probs, cublasOperation_t ta, cublasOperation_t tb,
               cudaDataType_t c_type, float beta) {
    if (refused[op]) return false;
    CUTRAIN_CUBLAS_CHECK(cublasSetStream(handle, s));
    for (std::size_t c0 = 0; c0 < probs.size(); c0 += kChunk) {
      const int n = static_cast<int>(std::min<std::size_t>(kChunk, probs.size() - c0));
      PointerChunk chunk{};
      chunk.n = n;
      std::vector<int> m(n), nn(n), k(n), lda(n), ldb(n), ldc(n), size(n, 1);
      std::vector<cublasOperation_t> tas(n, ta), tbs(n, tb);
      std::vector<float> alpha(n, 1.f), betas(n, beta);
      for (int i = 0; i < n; ++i) {
        const Problem& p = probs[c0 + i];
        chunk.p[0][i] = p.a;
        chunk.p[1][i] = p.b;
        chunk.p[2][i] = p.c;
        m[i] = p.m, nn[i] = p.n, k[i] = p.k, lda[i] = p.lda, ldb[i] = p.ldb, ldc[i] = p.ldc;
      }
      void** region = dev_ptrs + (c0 / kChunk) * 3 * kChunk;
      write_pointers_kernel<<<1, kChunk, 0, s>>>(chunk, region);
      CUTRAIN_LAUNCH_CHECK("write_pointers_kernel");
      const cublasStatus_t st = cublasGemmGroupedBatchedEx(
          handle, tas.data(), tbs.data(), m.data(), nn.data(), k.data(), alpha.data(), region, CUDA_R_16BF,
          lda.data(), region + kChunk, CUDA_R_16BF, ldb.data(), betas.data(),
          region + 2 * kChunk, c_type, ldc.data(), n,
          size.data(), CUBLAS_COMPUTE_32F);
      if (c0 == 0 && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
        refused[op] = true;
        return false;
      }
      CUTRAIN_CUBLAS_CHECK(st);
    }
    return true;
  }
};

GroupedGemm::GroupedGemm(int max_groups) : impl_(std::make_unique<Impl>()) {
  CUTRAIN_CHECK(max_groups > 0, "GroupedGemm: max_groups must be > 0, got ", max_groups);
  impl_->max_groups = max_groups;
  CUTRAIN_CUBLAS_CHECK(cublasCreate(&impl_->handle));
  const std::size_t regions = (max_groups + kChunk - 1) / kChunk;
  CUTRAIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&impl_->dev_ptrs), regions * 3 * kChunk * sizeof(void*)));
}

GroupedGemm::~GroupedGemm() = default;

std::size_t GroupedGemm::fallback_count() const { return impl_->fallbacks; }

namespace {

void check_call(const char* fn, const void* a, const void* b, const void* c, const int* rows, int groups,
                int max_groups, int N, int K) {
  CUTRAIN_CHECK(groups > 0 && groups <= max_groups, fn, ": groups must be in [1, ", max_groups, "], got ", groups);
  CUTRAIN_CHECK(N > 0 && K > 0, fn, ": N and K must be > 0, got N=", N, " K=", K);
  CUTRAIN_CHECK(a && b && c && rows, fn, ": the operands and the host `rows` array must be non-null");
  for (int g = 0; g < groups; ++g)
    CUTRAIN_CHECK(rows[g] >= 0, fn, ": rows[", g, "] must be >= 0, got ", rows[g]);
}

}  // namespace

void GroupedGemm::forward(cudaStream_t s, const bf16* x, const bf16* w, bf16* y, const int* rows, int groups, int N,
                          int K) {
  check_call("GroupedGemm::forward", x, w, y, rows, groups, impl_->max_groups, N, K);
  NvtxRange range("grouped_gemm_fwd");
  std::vector<Problem> probs;
  std::int64_t row = 0;
  for (int g = 0; g < groups; row += rows[g], ++g) {
    if (rows[g] == 0) continue;
    probs.push_back({w + std::int64_t(g) * N * K, x + row * K, y + row * N, N, rows[g], K, K, K, N});
  }
  if (probs.empty() || impl_->grouped(s, Op::Forward, probs, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, 0.f)) return;
  ++impl_->fallbacks;
  for (std::size_t i = 0; i < probs.size(); ++i)
    impl_->lt.forward(s, static_cast<const bf16*>(probs[i].b), static_cast<const bf16*>(probs[i].a), nullptr,
                      static_cast<bf16*>(probs[i].c), probs[i].n, N, K);
}

void GroupedGemm::grad_input(cudaStream_t s, const bf16* dy, const bf16* w, bf16* dx, const int* rows, int groups,
                             int N, int K, float beta) {
  check_call("GroupedGemm::grad_input", dy, w, dx, rows, groups, impl_->max_groups, N, K);
  NvtxRange range("grouped_gemm_dgrad");
  std::vector<Problem> probs;
  std::int64_t row = 0;
  for (int g = 0; g < groups; row += rows[g], ++g) {
    if (rows[g] == 0) continue;
    probs.push_back({w + std::int64_t(g) * N * K, dy + row * N, dx + row * K, K, rows[g], N, K, N, K});
  }
  if (probs.empty() || impl_->grouped(s, Op::GradInput, probs, CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, beta)) return;
  ++impl_->fallbacks;
  for (const Problem& p : probs)
    impl_->lt.grad_input(s, static_cast<const bf16*>(p.b), static_cast<const bf16*>(p.a), static_cast<bf16*>(p.c),
                         p.n, N, K, beta);
}

void GroupedGemm::grad_weight(cudaStream_t s, const bf16* dy, const bf16* x, void* dw, DType dw_type, const int* rows,
                              int groups, int N, int K, bool accumulate) {
  const char* fn = "GroupedGemm::grad_weight";
  check_call(fn, dy, x, dw, rows, groups, impl_->max_groups, N, K);
  CUTRAIN_CHECK(dw_type == DType::BF16 || dw_type == DType::F32, fn, ": dW must be bf16 or fp32");
  NvtxRange range("grouped_gemm_wgrad");
  const std::size_t esz = dw_type == DType::F32 ? 4 : 2;
  std::vector<Problem> probs;
  std::int64_t row = 0;
  for (int g = 0; g < groups; row += rows[g], ++g) {
    char* dwg = static_cast<char*>(dw) + std::size_t(g) * N * K * esz;
    if (rows[g] == 0) {
      if (!accumulate) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(dwg, 0, std::size_t(N) * K * esz, s));
      continue;
    }
    probs.push_back({x + row * K, dy + row * N, dwg, K, N, rows[g], K, N, K});
  }
  const Op op = dw_type == DType::F32 ? Op::GradWeightF32 : Op::GradWeightBf16;
  const cudaDataType_t ct = dw_type == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  if (probs.empty() || impl_->grouped(s, op, probs, CUBLAS_OP_N, CUBLAS_OP_T, ct, accumulate ? 1.f : 0.f)) return;
  ++impl_->fallbacks;
  for (const Problem& p : probs)
    impl_->lt.grad_weight(s, static_cast<const bf16*>(p.b), static_cast<const bf16*>(p.a), p.c, dw_type, p.k, N, K,
                          accumulate);
}

}  // namespace cutrain::kernels
