#include "runtime/peaks.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace cutrain {

namespace {

// cudaMalloc'd scratch freed on every path (the measurement can throw half-way).
struct DeviceScratch {
  void* p = nullptr;
  explicit DeviceScratch(std::size_t bytes) { CUTRAIN_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceScratch() {
    if (p) cudaFree(p);
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
};

double median_ms(cudaStream_t s, int warmup, int iters, const std::function<void()>& launch) {
  for (int i = 0; i < warmup; ++i) launch();
  Event a, b;
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    a.record(s);
    launch();
    b.record(s);
    b.synchronize();
    ms.push_back(b.elapsed_ms(a));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Random bf16 in [-1, 1): a constant fill would draw less power and overstate the GEMM peak.
void fill_random_bf16(void* dst, std::size_t elems, cudaStream_t s) {
  std::vector<std::uint16_t> tile(std::size_t(1) << 20);
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& v : tile) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = f32_to_bf16_bits(float(double(x >> 11) / double(1ull << 53) * 2.0 - 1.0));
  }
  auto* d = static_cast<std::uint16_t*>(dst);
  for (std::size_t off = 0; off < elems; off += tile.size()) {
    const std::size_t n = std::min(tile.size(), elems - off);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(d + off, tile.data(), n * 2, cudaMemcpyHostToDevice, s));
  }
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));  // `tile` is pageable and about to go
}

double measure_copy_gbps(cudaStream_t s) {
  const std::size_t bytes = std::size_t(512) << 20;
  DeviceScratch a(bytes), b(bytes);
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(a.p, 0x3C, bytes, s));
  const double ms = median_ms(s, 2, 10, [&] {
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, s));
  });
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

// D[n,n] = A·B in bf16 with fp32 accumulation, "TN" (the layout cuBLASLt is fastest at).
double measure_gemm_tflops(cudaStream_t s) {
  const int n = 8192;
  const std::size_t elems = std::size_t(n) * n, ws_bytes = std::size_t(32) << 20;
  DeviceScratch A(elems * 2), B(elems * 2), D(elems * 2), ws(ws_bytes);
  fill_random_bf16(A.p, elems, s);
  fill_random_bf16(B.p, elems, s);
  struct Lt {
    cublasLtHandle_t h = nullptr;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~Lt() {
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      if (d) cublasLtMatrixLayoutDestroy(d);
      if (b) cublasLtMatrixLayoutDestroy(b);
      if (a) cublasLtMatrixLayoutDestroy(a);
      if (op) cublasLtMatmulDescDestroy(op);
      if (h) cublasLtDestroy(h);
    }
  } lt;
  CUTRAIN_CUBLAS_CHECK(cublasLtCreate(&lt.h));
  CUTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
  CUTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
  CUTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
  CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_16BF, n, n, n));
  CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_16BF, n, n, n));
  CUTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.d, CUDA_R_16BF, n, n, n));
  CUTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&lt.pref));
  CUTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  CUTRAIN_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt.h, lt.op, lt.a, lt.b, lt.d, lt.d, lt.pref, 1, &res, &found));
  CUTRAIN_CHECK(found > 0, "measure_peaks: cuBLASLt offers no algorithm for a ", n, "^3 bf16 GEMM");
  const float alpha = 1.f, beta = 0.f;
  const double ms = median_ms(s, 3, 10, [&] {
    CUTRAIN_CUBLAS_CHECK(cublasLtMatmul(lt.h, lt.op, &alpha, A.p, lt.a, B.p, lt.b, &beta, D.p, lt.d, D.p, lt.d,
                                        &res.algo, ws.p, ws_bytes, s));
  });
  return 2.0 * double(n) * n * n / (ms * 1e-3) / 1e12;
}

}  // namespace

DevicePeaks measure_peaks(cudaStream_t stream) {
  DevicePeaks p;
  p.device = device_info().name;
  p.datasheet_tflops = datasheet_bf16_tflops(p.device);
  p.copy_gbps = measure_copy_gbps(stream);
  p.gemm_tflops = measure_gemm_tflops(stream);
  return p;
}

}  // namespace cutrain
