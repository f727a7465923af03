// @brief The cuBLASLt wrapper of kernels/gemm.cuh: row-major <-> column-major mapping, the plan
// cache (descriptor + layouts + heuristic algorithm per shape), and the unfused epilogue fallback.
//
// ---- Row-major <-> column-major, worked out once ----
// cuBLASLt is column-major. A row-major matrix X[R,C] (leading dim C) is, byte for byte, the
// column-major matrix Xᵀ[C,R] with the same leading dim C. So every product below is written for
// the transposed (column-major) outputs, D = op(A)·op(B) with D [m,n] column-major:
//
//   forward     y[M,N]  = x[M,K]·W[N,K]ᵀ   ⇔  yᵀ[N,M]  = W·xᵀ:
//               A = W   (col-major [K,N], ld K) with op T → [N,K];  B = x (col-major [K,M], ld K), op N
//               m = N, n = M, k = K, D = y with ld N. Bias has length m = N (one per output feature),
//               the GELU aux is [m,n] ld N = row-major [M,N], like y.
//   grad_input  dx[M,K] = dy[M,N]·W[N,K]   ⇔  dxᵀ[K,M] = Wᵀ·dyᵀ:
//               A = W   (col-major [K,N], ld K), op N;  B = dy (col-major [N,M], ld N), op N
//               m = K, n = M, k = N, D = dx with ld K; the DGELU aux is [K,M] ld K = row-major [M,K].
//   grad_weight dW[N,K] = dy[M,N]ᵀ·x[M,K] ⇔  dWᵀ[K,N] = xᵀ·dy:
//               A = x   (col-major [K,M], ld K), op N;  B = dy (col-major [N,M], ld N), op T → [M,N]
//               m = K, n = N, k = M, D = dW with ld K. The bias gradient db[N] = Σ_rows dy is BGRADB:
//               one value per column of D (n = N), B = dy reduced over k = M.
#include "kernels/gemm.cuh"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/common/vec.cuh"
#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {

namespace {

// ---------------------------------------------------------------------------------------------
// Unfused epilogue fallback (GELU aux leading dim not divisible by 8, or no fused algorithm)
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float gelu_tanh_f(float x) {
  const float kC = 0.7978845608028654f;  // sqrt(2/pi)
  const float u = kC * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.f + tanhf(u));
}

__device__ __forceinline__ float gelu_tanh_grad_f(float x) {
  const float kC = 0.7978845608028654f;
  const float x2 = x * x;
  const float t = tanhf(kC * (x + 0.044715f * x2 * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kC * (1.f + 3.f * 0.044715f * x2);
}

// pre[r,c] += bias[c] in place (bias may be null: pre is already biased); when y is non-null also
// y = gelu_tanh(pre). `pre` holds the GEMM result on entry.
template <typename T>
__global__ void bias_gelu_fallback_kernel(T* __restrict__ pre, const T* __restrict__ bias, T* __restrict__ y,
                                          std::size_t n, int cols) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    float v = to_f32(pre[i]);
    if (bias) {
      v += to_f32(bias[i % cols]);
      pre[i] = from_f32<T>(v);
    }
    if (y) y[i] = from_f32<T>(gelu_tanh_f(v));
  }
}

// g[i] *= gelu_tanh'(pre[i]), in place.
template <typename T>
__global__ void dgelu_tanh_inplace_kernel(T* __restrict__ g, const T* __restrict__ pre, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    g[i] = from_f32<T>(to_f32(g[i]) * gelu_tanh_grad_f(to_f32(pre[i])));
}

unsigned elementwise_grid(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 132u * 16u));
}

// ---------------------------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------------------------

enum class Op : std::uint8_t { Forward, GradInput, GradWeight };
const char* op_name(Op op) {
  switch (op) {
    case Op::Forward: return "forward";
    case Op::GradInput: return "grad_input";
    case Op::GradWeight: return "grad_weight";
  }
  return "?";
}

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "bias+gelu_aux";
    case CUBLASLT_EPILOGUE_DGELU: return "dgelu";
    case CUBLASLT_EPILOGUE_BGRADB: return "bgradb";
    default: return "other";
  }
}

// The alignment the heuristic may assume for a pointer: its lowest set address bit, capped at
// cuBLASLt's default assumption of 256 bytes (null pointers are not read: 256). With strided
// batches every batch's start counts: the stride's bytes bound it too.
std::uint32_t alignment_of(const void* p, std::int64_t stride_bytes = 0) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a == 0) return 256;
  a |= static_cast<std::uintptr_t>(stride_bytes);
  return static_cast<std::uint32_t>(std::min<std::uintptr_t>(a & (~a + 1), 256));
}

std::int64_t elem_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// One cuBLASLt matmul in column-major terms: D[m,n] = alpha·op(A)·op(B) + beta·D, with epilogue.
struct Matmul {
  Op op;
  cublasOperation_t ta, tb;
  int m, n, k;
  const void* a; std::int64_t lda;
  const void* b; std::int64_t ldb;
  void* d; std::int64_t ldd;
  cudaDataType_t d_type;
  float beta = 0.f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  std::int64_t aux_ld = 0;
  cudaDataType_t ab_type = CUDA_R_16BF;  // A, B (and the bias of the forward): the 16-bit storage type
  // Strided batches: `batch` products, batch i at a + i·stride_a, b + i·stride_b, d + i·stride_d
  // (elements).
  int batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_d = 0;
};

template <typename T>
constexpr cudaDataType_t cuda_type() {
  return std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
}
const char* cuda_type_name(cudaDataType_t t) {
  return t == CUDA_R_32F ? "fp32" : t == CUDA_R_16F ? "fp16" : "bf16";
}

std::uint32_t align_a(const Matmul& mm) { return alignment_of(mm.a, mm.batch > 1 ? mm.stride_a * 2 : 0); }
std::uint32_t align_b(const Matmul& mm) { return alignment_of(mm.b, mm.batch > 1 ? mm.stride_b * 2 : 0); }
std::uint32_t align_d(const Matmul& mm) {
  return alignment_of(mm.d, mm.batch > 1 ? mm.stride_d * elem_bytes(mm.d_type) : 0);
}

// Everything that changes the descriptor or the heuristic's answer. Alignments are part of it
// because the heuristic picks different algorithms for differently aligned pointers.
using PlanKey = std::tuple<int /*op*/, int, int, int, int /*ta*/, int /*tb*/, int /*epilogue*/, int /*d_type*/,
                           int /*ab_type*/, bool /*beta != 0*/, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t,
                           int /*batch*/, std::int64_t, std::int64_t, std::int64_t /*strides*/>;

PlanKey key_of(const Matmul& mm) {
  return PlanKey{static_cast<int>(mm.op), mm.m, mm.n, mm.k, static_cast<int>(mm.ta), static_cast<int>(mm.tb),
                 static_cast<int>(mm.epilogue), static_cast<int>(mm.d_type), static_cast<int>(mm.ab_type), mm.beta != 0.f,
                 align_a(mm), align_b(mm), align_d(mm), alignment_of(mm.bias),
                 alignment_of(mm.aux), mm.batch, mm.stride_a, mm.stride_b, mm.stride_d};
}

// A descriptor, its four layouts and the chosen algorithm. `has_algo` false records that the
// heuristic found none (so a fused epilogue is not asked again; the caller falls back).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct PreferenceGuard {
  cublasLtMatmulPreference_t p = nullptr;
  ~PreferenceGuard() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
};

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  CUTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

template <typename T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
  CUTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

// The per-call pointers of the epilogue (the rest of the descriptor is fixed per plan).
void set_epilogue_pointers(cublasLtMatmulDesc_t desc, const Matmul& mm) {
  if (mm.bias) set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, mm.bias);
  if (mm.aux) set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, mm.aux);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Gemm::Impl
// ---------------------------------------------------------------------------------------------

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  CachingAllocator* alloc = nullptr;
  Buffer ws_buffer;            // from the allocator, or
  void* ws_raw = nullptr;      // from cudaMalloc when no allocator is given
  void* ws = nullptr;
  std::size_t ws_bytes = 0;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  std::size_t fallbacks = 0;  // calls that took the unfused epilogue path
  std::size_t bias_grad_epilogues = 0;  // grad_weight_bias calls whose db came from BGRADB

  ~Impl() {
    plans.clear();
    ws_buffer.reset();
    if (ws_raw) cudaFree(ws_raw);
    if (handle) cublasLtDestroy(handle);
  }

  std::unique_ptr<Plan> make_plan(const Matmul& mm, bool required) const {
    auto plan = std::make_unique<Plan>();
    CUTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<std::int32_t>(mm.ta));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<std::int32_t>(mm.tb));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(mm.epilogue));
    // The forward's bias is the storage type; a bias gradient (BGRADB) is written in D's type, cuBLASLt's
    // default for it, said explicitly.
    if (mm.bias) {
      const cudaDataType_t bias_type = mm.epilogue == CUBLASLT_EPILOGUE_BGRADB ? mm.d_type : mm.ab_type;
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(bias_type));
    }
    // The aux matrix takes D's type (the storage type) by default, which is what we store.
    if (mm.aux) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, mm.aux_ld);
    set_epilogue_pointers(plan->desc, mm);  // the heuristic reads their alignment

    // Layouts as stored (column-major): op N stores [rows, cols] of op(X); op T stores its transpose.
    const bool at = mm.ta == CUBLAS_OP_T, bt = mm.tb == CUBLAS_OP_T;
    CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, mm.ab_type, at ? mm.k : mm.m, at ? mm.m : mm.k, mm.lda));
    CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, mm.ab_type, bt ? mm.n : mm.k, bt ? mm.k : mm.n, mm.ldb));
    CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, mm.d_type, mm.m, mm.n, mm.ldd));
    CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, mm.d_type, mm.m, mm.n, mm.ldd));
    if (mm.batch > 1) {
      const std::int32_t count = mm.batch;
      const std::pair<cublasLtMatrixLayout_t, std::int64_t> strided[] = {
          {plan->a, mm.stride_a}, {plan->b, mm.stride_b}, {plan->c, mm.stride_d}, {plan->d, mm.stride_d}};
      for (const auto& [layout, stride] : strided) {
        CUTRAIN_CUBLAS_CHECK(
            cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
        CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                              &stride, sizeof(stride)));
      }
    }

    PreferenceGuard pref;
    CUTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
    set_pref(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(ws_bytes));
    set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a(mm));
    set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b(mm));
    set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d(mm));
    set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d(mm));

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->c, plan->d, pref.p,
                                                       1, &result, &found);
    // NOT_SUPPORTED means "no algorithm for this combination": recorded as such, not thrown. An
    // optional (fused-epilogue) plan records any refusal, so the caller falls back.
    if (required && st != CUBLAS_STATUS_NOT_SUPPORTED) CUTRAIN_CUBLAS_CHECK(st);
    plan->has_algo = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (plan->has_algo) plan->algo = result.algo;
    return plan;
  }

  // Runs `mm`. Returns false when cuBLASLt has no algorithm for it and `required` is false (the
  // caller then falls back); throws a clear error when `required`.
  bool run(cudaStream_t s, const Matmul& mm, bool required) {
    const PlanKey key = key_of(mm);
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, make_plan(mm, required)).first;
    Plan& plan = *it->second;
    if (!plan.has_algo) {
      CUTRAIN_CHECK(!required, "Gemm::", op_name(mm.op), ": cuBLASLt's heuristic found no algorithm for column-major m=",
                    mm.m, " n=", mm.n, " k=", mm.k, " (transa=", mm.ta == CUBLAS_OP_T ? "T" : "N",
                    " transb=", mm.tb == CUBLAS_OP_T ? "T" : "N", ", epilogue ", epilogue_name(mm.epilogue),
                    ", inputs ", cuda_type_name(mm.ab_type), ", output ", cuda_type_name(mm.d_type), ", beta ", mm.beta,
                    ", workspace ", ws_bytes, " B, alignments A/B/D ", align_a(mm), "/", align_b(mm),
                    "/", align_d(mm), " B, batches ", mm.batch, ")");
      return false;
    }
    set_epilogue_pointers(plan.desc, mm);
    const float alpha = 1.f;
    const cublasStatus_t st = cublasLtMatmul(handle, plan.desc, &alpha, mm.a, plan.a, mm.b, plan.b, &mm.beta, mm.d,
                                             plan.c, mm.d, plan.d, &plan.algo, ws, ws_bytes, s);
    // An optional fused epilogue that cuBLASLt refuses at launch (its argument checks run on the
    // host, before anything is queued) is remembered as unavailable and the caller falls back.
    if (!required && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
      plan.has_algo = false;
      return false;
    }
    CUTRAIN_CUBLAS_CHECK(st);
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
// Argument checks (all before any launch, so a bad call leaves every output untouched)
// ---------------------------------------------------------------------------------------------

namespace {

void check_dims(const char* fn, int M, int N, int K) {
  CUTRAIN_CHECK(M > 0 && N > 0 && K > 0, fn, ": M, N, K must all be > 0, got M=", M, " N=", N, " K=", K);
}

void check_ptr(const char* fn, const char* name, const void* p, std::size_t elem_bytes) {
  CUTRAIN_CHECK(p != nullptr, fn, ": `", name, "` must not be null");
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(p) % elem_bytes == 0, fn, ": `", name, "` must be aligned to its ",
                elem_bytes, "-byte element, got address ", p);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Gemm
// ---------------------------------------------------------------------------------------------

Gemm::Gemm(CachingAllocator* alloc, std::size_t workspace_bytes) : impl_(new Impl) {
  try {
    CUTRAIN_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
    handle_ = impl_->handle;
    impl_->alloc = alloc;
    impl_->ws_bytes = workspace_bytes;
    if (workspace_bytes > 0) {
      if (alloc) {
        impl_->ws_buffer = Buffer(*alloc, workspace_bytes);
        impl_->ws = impl_->ws_buffer.get();
      } else {
        CUTRAIN_CUDA_CHECK(cudaMalloc(&impl_->ws_raw, workspace_bytes));
        impl_->ws = impl_->ws_raw;
      }
    }
  } catch (...) {
    delete impl_;
    throw;
  }
}

Gemm::~Gemm() { delete impl_; }

std::size_t Gemm::plan_count() const { return impl_->plans.size(); }
std::size_t Gemm::workspace_bytes() const { return impl_->ws_bytes; }
std::size_t Gemm::fallback_count() const { return impl_->fallbacks; }
std::size_t Gemm::bias_grad_epilogue_count() const { return impl_->bias_grad_epilogues; }

template <typename T>
void Gemm::forward(cudaStream_t s, const T* x, const nondeduced_t<T>* w, const nondeduced_t<T>* bias, T* y, int M,
                   int N, int K, GemmEpilogue ep, nondeduced_t<T>* aux) {
  const char* fn = "Gemm::forward";
  check_dims(fn, M, N, K);
  check_ptr(fn, "x", x, 2);
  check_ptr(fn, "w", w, 2);
  check_ptr(fn, "y", y, 2);
  switch (ep) {
    case GemmEpilogue::None:
      CUTRAIN_CHECK(bias == nullptr && aux == nullptr, fn, ": epilogue None takes no bias/aux, got bias=", bias,
                    " aux=", static_cast<const void*>(aux), " (use GemmEpilogue::Bias or BiasGeluTanh)");
      break;
    case GemmEpilogue::Bias:
      check_ptr(fn, "bias", bias, 2);
      CUTRAIN_CHECK(aux == nullptr, fn, ": epilogue Bias writes no aux, got aux=", static_cast<const void*>(aux));
      break;
    case GemmEpilogue::BiasGeluTanh:
      check_ptr(fn, "bias", bias, 2);
      check_ptr(fn, "aux", aux, 2);
      CUTRAIN_CHECK(aux != y, fn, ": aux (the pre-activation) must not alias y");
      break;
    default:
      CUTRAIN_FAIL(fn, ": unknown epilogue ", static_cast<int>(ep));
  }
  NvtxRange range("gemm_fwd");

  Matmul mm{Op::Forward, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, x, K, y, N, cuda_type<T>()};
  mm.ab_type = cuda_type<T>();
  if (ep == GemmEpilogue::None) {
    impl_->run(s, mm, true);
    return;
  }
  // Fused when cuBLASLt can (the GELU aux ld = N must be divisible by 8; bias/aux alignment is the
  // heuristic's call). Otherwise, in order of preference: the Bias epilogue into aux, then a GELU
  // pass (the pre-activation is still rounded once); or the plain GEMM, then one pass that adds
  // the bias (and applies GELU).
  const bool gelu = ep == GemmEpilogue::BiasGeluTanh;
  Matmul with_bias = mm;
  with_bias.bias = bias;
  with_bias.epilogue = CUBLASLT_EPILOGUE_BIAS;
  if (gelu && N % 8 == 0) {
    Matmul fused = with_bias;
    fused.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    fused.aux = aux;
    fused.aux_ld = N;
    if (impl_->run(s, fused, false)) return;
  }
  T* pre = gelu ? aux : y;
  with_bias.d = pre;
  const bool bias_done = impl_->run(s, with_bias, false);
  if (bias_done && !gelu) return;
  ++impl_->fallbacks;
  if (!bias_done) {
    mm.d = pre;
    impl_->run(s, mm, true);
  }
  const std::size_t n = std::size_t(M) * N;
  bias_gelu_fallback_kernel<T><<<elementwise_grid(n), 256, 0, s>>>(pre, bias_done ? nullptr : bias, gelu ? y : nullptr,
                                                                 n, N);
  CUTRAIN_LAUNCH_CHECK("bias_gelu_fallback_kernel");
}

template <typename T>
void Gemm::forward_fp32(cudaStream_t s, const T* x, const nondeduced_t<T>* w, float* y, int M, int N, int K) {
  const char* fn = "Gemm::forward_fp32";
  check_dims(fn, M, N, K);
  check_ptr(fn, "x", x, 2);
  check_ptr(fn, "w", w, 2);
  check_ptr(fn, "y", y, 4);
  NvtxRange range("gemm_fwd_fp32");
  Matmul mm{Op::Forward, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, x, K, y, N, CUDA_R_32F};
  mm.ab_type = cuda_type<T>();
  impl_->run(s, mm, true);
}

template <typename T>
void Gemm::grad_input(cudaStream_t s, const T* dy, const nondeduced_t<T>* w, T* dx, int M, int N, int K, float beta,
                      const nondeduced_t<T>* dgelu_tanh_aux) {
  const char* fn = "Gemm::grad_input";
  check_dims(fn, M, N, K);
  check_ptr(fn, "dy", dy, 2);
  check_ptr(fn, "w", w, 2);
  check_ptr(fn, "dx", dx, 2);
  if (dgelu_tanh_aux) {
    check_ptr(fn, "dgelu_tanh_aux", dgelu_tanh_aux, 2);
    CUTRAIN_CHECK(beta == 0.f, fn, ": the DGELU epilogue needs beta = 0, got beta=", beta,
                  " (accumulate the GELU gradient separately)");
  }
  NvtxRange range("gemm_dgrad");

  Matmul mm{Op::GradInput, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, w, K, dy, N, dx, K, cuda_type<T>()};
  mm.ab_type = cuda_type<T>();
  mm.beta = beta;
  if (!dgelu_tanh_aux) {
    impl_->run(s, mm, true);
    return;
  }
  if (K % 8 == 0) {
    Matmul fused = mm;
    fused.epilogue = CUBLASLT_EPILOGUE_DGELU;
    fused.aux = const_cast<T*>(dgelu_tanh_aux);  // read-only in backward; cuBLASLt's attribute is void*
    fused.aux_ld = K;
    if (impl_->run(s, fused, false)) return;
  }
  ++impl_->fallbacks;
  impl_->run(s, mm, true);
  const std::size_t n = std::size_t(M) * K;
  dgelu_tanh_inplace_kernel<T><<<elementwise_grid(n), 256, 0, s>>>(dx, dgelu_tanh_aux, n);
  CUTRAIN_LAUNCH_CHECK("dgelu_tanh_inplace_kernel");
}

template <typename T>
void Gemm::grad_weight(cudaStream_t s, const T* dy, const nondeduced_t<T>* x, void* dw, DType dw_type, int M, int N,
                       int K, bool accumulate) {
  const char* fn = "Gemm::grad_weight";
  check_dims(fn, M, N, K);
  CUTRAIN_CHECK(dw_type == dtype_of<T>() || dw_type == DType::F32, fn, ": dw_type must be ",
                dtype_name(dtype_of<T>()), " (the inputs' type) or float32, got ", dtype_name(dw_type));
  check_ptr(fn, "dy", dy, 2);
  check_ptr(fn, "x", x, 2);
  check_ptr(fn, "dw", dw, dtype_size(dw_type));
  NvtxRange range("gemm_wgrad");

  Matmul mm{Op::GradWeight, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x, K, dy, N, dw, K,
            dw_type == DType::F32 ? CUDA_R_32F : cuda_type<T>()};
  mm.ab_type = cuda_type<T>();
  mm.beta = accumulate ? 1.f : 0.f;
  impl_->run(s, mm, true);
}

template <typename T>
void Gemm::grad_weight_bias(cudaStream_t s, const T* dy, const nondeduced_t<T>* x, void* dw, void* db,
                            DType grad_type, int M, int N, int K, bool accumulate, void* scratch, BiasGradPath path) {
  const char* fn = "Gemm::grad_weight_bias";
  check_dims(fn, M, N, K);
  CUTRAIN_CHECK(grad_type == dtype_of<T>() || grad_type == DType::F32, fn, ": grad_type must be ",
                dtype_name(dtype_of<T>()), " (the inputs' type) or float32, got ", dtype_name(grad_type));
  CUTRAIN_CHECK(path == BiasGradPath::Measured || path == BiasGradPath::Epilogue || path == BiasGradPath::Kernel, fn,
                ": unknown bias-gradient path ", static_cast<int>(path));
  check_ptr(fn, "dy", dy, 2);
  check_ptr(fn, "x", x, 2);
  check_ptr(fn, "dw", dw, dtype_size(grad_type));
  check_ptr(fn, "db", db, dtype_size(grad_type));
  CUTRAIN_CHECK(db != dw, fn, ": db must not alias dw (both at ", dw, ")");
  CUTRAIN_CHECK(scratch != nullptr, fn, ": `scratch` must not be null (the fallback's bias_grad needs ",
                bias_grad_scratch_bytes(M, N), " bytes for M=", M, " N=", N, ")");
  check_ptr(fn, "scratch", scratch, 4);
  NvtxRange range("gemm_wgrad_bgrad");

  const bool epilogue = !accumulate && (path == BiasGradPath::Epilogue ||
                                        (path == BiasGradPath::Measured && bias_grad_epilogue_wins(M, N, K)));
  if (epilogue) {
    Matmul mm{Op::GradWeight, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x, K, dy, N, dw, K,
              grad_type == DType::F32 ? CUDA_R_32F : cuda_type<T>()};
    mm.ab_type = cuda_type<T>();
    mm.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    mm.bias = db;
    if (impl_->run(s, mm, false)) {
      ++impl_->bias_grad_epilogues;
      return;
    }
    ++impl_->fallbacks;
  }
  grad_weight(s, dy, x, dw, grad_type, M, N, K, accumulate);
  bias_grad(s, dy, db, grad_type, M, N, accumulate, scratch);
}

template void Gemm::forward<bf16>(cudaStream_t, const bf16*, const bf16*, const bf16*, bf16*, int, int, int, GemmEpilogue,
                                  bf16*);
template void Gemm::forward_fp32<bf16>(cudaStream_t, const bf16*, const bf16*, float*, int, int, int);
template void Gemm::grad_input<bf16>(cudaStream_t, const bf16*, const bf16*, bf16*, int, int, int, float, const bf16*);
template void Gemm::grad_weight<bf16>(cudaStream_t, const bf16*, const bf16*, void*, DType, int, int, int, bool);
template void Gemm::forward<f16>(cudaStream_t, const f16*, const f16*, const f16*, f16*, int, int, int, GemmEpilogue,
                                  f16*);
template void Gemm::forward_fp32<f16>(cudaStream_t, const f16*, const f16*, float*, int, int, int);
template void Gemm::grad_input<f16>(cudaStream_t, const f16*, const f16*, f16*, int, int, int, float, const f16*);
template void Gemm::grad_weight<f16>(cudaStream_t, const f16*, const f16*, void*, DType, int, int, int, bool);
template void Gemm::grad_weight_bias<bf16>(cudaStream_t, const bf16*, const bf16*, void*, void*, DType, int, int, int,
                                           bool, void*, BiasGradPath);
template void Gemm::grad_weight_bias<f16>(cudaStream_t, const f16*, const f16*, void*, void*, DType, int, int, int,
                                          bool, void*, BiasGradPath);
namespace {

void check_batches(const char* fn, int batches) {
  CUTRAIN_CHECK(batches > 0, fn, ": batches must be > 0, got ", batches);
}

}  // namespace

void Gemm::forward_batched(cudaStream_t s, const bf16* x, const bf16* w, bf16* y, int batches, int M, int N, int K) {
  const char* fn = "Gemm::forward_batched";
  check_batches(fn, batches);
  check_dims(fn, M, N, K);
  check_ptr(fn, "x", x, 2);
  check_ptr(fn, "w", w, 2);
  check_ptr(fn, "y", y, 2);
  NvtxRange range("gemm_fwd_batched");
  Matmul mm{Op::Forward, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, x, K, y, N, CUDA_R_16BF};
  mm.batch = batches;
  mm.stride_a = std::int64_t(N) * K;
  mm.stride_b = std::int64_t(M) * K;
  mm.stride_d = std::int64_t(M) * N;
  impl_->run(s, mm, true);
}

void Gemm::grad_input_batched(cudaStream_t s, const bf16* dy, const bf16* w, bf16* dx, int batches, int M, int N,
                              int K) {
  const char* fn = "Gemm::grad_input_batched";
  check_batches(fn, batches);
  check_dims(fn, M, N, K);
  check_ptr(fn, "dy", dy, 2);
  check_ptr(fn, "w", w, 2);
  check_ptr(fn, "dx", dx, 2);
  NvtxRange range("gemm_dgrad_batched");
  Matmul mm{Op::GradInput, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, w, K, dy, N, dx, K, CUDA_R_16BF};
  mm.batch = batches;
  mm.stride_a = std::int64_t(N) * K;
  mm.stride_b = std::int64_t(M) * N;
  mm.stride_d = std::int64_t(M) * K;
  impl_->run(s, mm, true);
}

void Gemm::grad_weight_batched(cudaStream_t s, const bf16* dy, const bf16* x, void* dw, DType dw_type, int batches,
                               int M, int N, int K, bool accumulate) {
  const char* fn = "Gemm::grad_weight_batched";
  check_batches(fn, batches);
  check_dims(fn, M, N, K);
  CUTRAIN_CHECK(dw_type == DType::BF16 || dw_type == DType::F32, fn, ": dw_type must be bfloat16 or float32, got ",
                dtype_name(dw_type));
  check_ptr(fn, "dy", dy, 2);
  check_ptr(fn, "x", x, 2);
  check_ptr(fn, "dw", dw, dtype_size(dw_type));
  NvtxRange range("gemm_wgrad_batched");
  Matmul mm{Op::GradWeight, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x, K, dy, N, dw, K,
            dw_type == DType::F32 ? CUDA_R_32F : CUDA_R_16BF};
  mm.beta = accumulate ? 1.f : 0.f;
  mm.batch = batches;
  mm.stride_a = std::int64_t(M) * K;
  mm.stride_b = std::int64_t(M) * N;
  mm.stride_d = std::int64_t(N) * K;
  impl_->run(s, mm, true);
}

}  // namespace cutrain::kernels
