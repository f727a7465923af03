// @brief Dropout kernels (kernels/dropout.cuh): one grid-stride kernel, one thread per group of 4
// elements (one Philox call gives the group's 4 x 32 bits), templated on the dtype, on the
// bias + residual fusion, on whether anything is dropped (p = 0: no Philox bits drawn, every
// element kept at scale 1, the same bits as the dropping path would give) and on 4-wide vector
// accesses (all pointers aligned, and for the fusion
// cols % 4 == 0 so a group stays in one row); anything else takes the scalar instance. fp32 math
// with explicit round-to-nearest operations (no contraction into fma), so the CPU reference
// (tests/reference/dropout_ref.h) gets the same bits.
#include "kernels/dropout.cuh"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/common/chunk_io.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {

namespace {

constexpr int kThreads = 256;

struct DropoutArgs {
  DropoutKey key;
  std::uint32_t threshold;
  float scale;
  const void* x;
  const void* bias;
  const void* residual;
  void* out;
  std::size_t n, cols;
};

template <typename T>
__device__ __forceinline__ float to_f(const T* p, std::size_t i) { return to_f32(p[i]); }
template <typename T>
__device__ __forceinline__ void put(T* p, std::size_t i, float v) { p[i] = from_f32<T>(v); }

template <typename T, bool kBR, bool kDrop, bool kVec>
__global__ void __launch_bounds__(kThreads) dropout_kernel(DropoutArgs a) {
  const T* x = static_cast<const T*>(a.x);
  const T* bias = static_cast<const T*>(a.bias);
  const T* res = static_cast<const T*>(a.residual);
  T* out = static_cast<T*>(a.out);
  const std::size_t groups = (a.n + 3) / 4;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t g = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const std::size_t e0 = 4 * g;
    float v[4], b[4] = {0.f, 0.f, 0.f, 0.f}, rs[4] = {0.f, 0.f, 0.f, 0.f};
    const bool whole = kVec && e0 + 4 <= a.n;
    if (whole) {
      load_c<4>(x + e0, v);
      if constexpr (kBR) {
        load_c<4>(bias + e0 % a.cols, b);
        load_c<4>(res + e0, rs);
      }
    } else {
      for (int k = 0; k < 4 && e0 + k < a.n; ++k) {
        v[k] = to_f(x, e0 + k);
        if constexpr (kBR) {
          b[k] = to_f(bias, (e0 + k) % a.cols);
          rs[k] = to_f(res, e0 + k);
        }
      }
    }
    PhiloxWords r{};
    if constexpr (kDrop) r = dropout_bits(a.key, g);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float t = kBR ? __fadd_rn(v[k], b[k]) : v[k];
      if constexpr (kDrop) t = dropout_keep(r.w[k], a.threshold) ? __fmul_rn(t, a.scale) : 0.f;
      v[k] = kBR ? __fadd_rn(rs[k], t) : t;
    }
    if (whole) {
      if constexpr (sizeof(T) == 2) {
        const std::uint32_t unused[4] = {0, 0, 0, 0};
        store_c<4>(out + e0, v, false, unused);
      } else {
        store_c<4>(out + e0, v);
      }
    } else {
      for (int k = 0; k < 4 && e0 + k < a.n; ++k) put(out, e0 + k, v[k]);
    }
  }
}

unsigned grid_for(std::size_t n) {
  int dev = 0, sms = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const std::size_t want = ceil_div<std::size_t>(ceil_div<std::size_t>(n, 4), kThreads);
  return static_cast<unsigned>(std::clamp<std::size_t>(want, 1, static_cast<std::size_t>(sms) * 8));
}

template <typename T, bool kBR, bool kDrop>
void launch_typed(cudaStream_t s, const DropoutArgs& a, bool vec) {
  if (vec) dropout_kernel<T, kBR, kDrop, true><<<grid_for(a.n), kThreads, 0, s>>>(a);
  else dropout_kernel<T, kBR, kDrop, false><<<grid_for(a.n), kThreads, 0, s>>>(a);
  CUTRAIN_LAUNCH_CHECK(kBR ? "bias_dropout_residual_kernel" : "dropout_kernel");
}

template <typename T, bool kBR>
void launch_typed(cudaStream_t s, const DropoutArgs& a, bool vec) {
  // threshold 0 (p = 0, or p below 2^-33): every element kept and the scale rounds to 1 in fp32.
  if (a.threshold > 0) launch_typed<T, kBR, true>(s, a, vec);
  else launch_typed<T, kBR, false>(s, a, vec);
}

void launch(cudaStream_t s, const DropoutParams& p, DropoutArgs a, DType dt, bool br, const char* what) {
  CUTRAIN_CHECK(dt == DType::BF16 || dt == DType::F16 || dt == DType::F32, what,
                ": dtype must be bfloat16, float16 or float32, got ", dtype_name(dt));
  a.key = p.key;
  a.threshold = dropout_threshold(p.p);
  a.scale = dropout_scale(p.p);
  if (a.n == 0) return;
  CUTRAIN_CHECK(a.x && a.out && (!br || (a.bias && a.residual)), what, ": null buffer for ", a.n, " elements");
  NvtxRange range(what);
  // 4-wide: 16 bytes of fp32 or 8 of bf16 / fp16 per access, so 16-byte (fp32) / 8-byte alignment.
  const std::size_t align = dt == DType::F32 ? 16 : 8;
  auto ok = [&](const void* q) { return q == nullptr || reinterpret_cast<std::uintptr_t>(q) % align == 0; };
  const bool vec = ok(a.x) && ok(a.out) && ok(a.bias) && ok(a.residual) && (!br || a.cols % 4 == 0);
  if (dt == DType::BF16) br ? launch_typed<bf16, true>(s, a, vec) : launch_typed<bf16, false>(s, a, vec);
  else if (dt == DType::F16) br ? launch_typed<f16, true>(s, a, vec) : launch_typed<f16, false>(s, a, vec);
  else br ? launch_typed<float, true>(s, a, vec) : launch_typed<float, false>(s, a, vec);
}

}  // namespace

std::uint32_t dropout_threshold(float p) {
  CUTRAIN_CHECK(std::isfinite(p) && p >= 0.f && p < 1.f, "dropout: p must lie in [0, 1), got ", p);
  const double t = std::round(static_cast<double>(p) * 4294967296.0);
  return static_cast<std::uint32_t>(std::min(t, 4294967295.0));
}

float dropout_scale(float p) {
  CUTRAIN_CHECK(std::isfinite(p) && p >= 0.f && p < 1.f, "dropout: p must lie in [0, 1), got ", p);
  return static_cast<float>(1.0 / (1.0 - static_cast<double>(p)));
}

void dropout_forward(cudaStream_t s, const DropoutParams& p, const void* x, void* out, std::size_t n, DType dt) {
  DropoutArgs a{};
  a.x = x, a.out = out, a.n = n, a.cols = 1;
  launch(s, p, a, dt, false, "dropout_forward");
}

void dropout_backward(cudaStream_t s, const DropoutParams& p, const void* dy, void* dx, std::size_t n, DType dt) {
  DropoutArgs a{};
  a.x = dy, a.out = dx, a.n = n, a.cols = 1;
  launch(s, p, a, dt, false, "dropout_backward");
}

void bias_dropout_residual_forward(cudaStream_t s, const DropoutParams& p, const void* x, const void* bias,
                                   const void* residual, void* out, std::size_t rows, std::size_t cols, DType dt) {
  CUTRAIN_CHECK(rows == 0 || cols > 0, "bias_dropout_residual_forward: cols must be positive, got ", cols);
  DropoutArgs a{};
  a.x = x, a.bias = bias, a.residual = residual, a.out = out, a.n = rows * cols, a.cols = cols;
  launch(s, p, a, dt, true, "bias_dropout_residual_forward");
}

}  // namespace cutrain::kernels
