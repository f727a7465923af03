// LayerNorm fused with the residual add: forward and backward (see layernorm.cuh).
//
// Fast path (cols % 8 == 0, every pointer 16-byte aligned): a row is held in registers as
// 16-byte vectors, one row per warp for cols <= 1024, one row per block (up to 512 threads, 4
// vectors each) for wider rows. Otherwise a scalar path (one block per row, several passes over
// global memory) gives the same results more slowly.
//
// dgamma/dbeta are deterministic: each "unit" (block) of the backward grid owns a fixed set of
// rows and writes its fp32 column partials into scratch; a second kernel sums the partials in a
// fixed order. The number of partials is a function of (rows, cols) only, so the bits do not
// depend on the device either.
#include "kernels/layernorm.cuh"

#include <algorithm>

#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/layernorm_bwd_v2.h"
#include "runtime/check.h"

namespace cutrain::kernels {
namespace {

constexpr int kMinCols = 64, kMaxCols = 16384;
constexpr int kWarpRowMaxVec = 4;      // warp-per-row path: up to 4 x 32 x 8 = 1024 columns
constexpr int kBlockRowVec = 4;        // block-per-row path: 4 vectors per thread
constexpr int kWarpsPerBlock = 8;      // warp-per-row path: rows per block
constexpr int kScalarThreads = 256;    // scalar path: threads per row
constexpr int kPartialRowsPerBlock = 8;  // partial-reduction kernel: row lanes per block (ty)

// Partials (units of the backward grid) for a shape: bounded so the second pass stays small.
int max_partials(int cols) { return cols <= 4096 ? 512 : 256; }

bool use_warp_rows(int cols) { return cols <= kWarpRowMaxVec * kWarpSize * kBf16PerVec; }

int block_row_threads(int cols) {
  const int nvec = cols / kBf16PerVec;
  return ceil_div(ceil_div(nvec, kBlockRowVec), kWarpSize) * kWarpSize;
}

// Number of partial rows the backward writes for (rows, cols) on the vector path.
int vec_partials(int rows, int cols) {
  const int units = use_warp_rows(cols) ? ceil_div(rows, kWarpsPerBlock) : rows;
  return std::min(units, max_partials(cols));
}
int scalar_partials(int rows, int cols) { return std::min(rows, max_partials(cols)); }

// A row team is a warp (kWarpRow) or the whole block; all its threads call team_sum together.
template <bool kWarpRow>
__device__ __forceinline__ float team_sum(float v, float* smem) {
  if constexpr (kWarpRow) return warp_sum(v);
  else return block_sum(v, smem);
}
template <bool kWarpRow>
__device__ __forceinline__ float2 team_sum2(float2 v, float* smem) {
  if constexpr (kWarpRow) return make_float2(warp_sum(v.x), warp_sum(v.y));
  else return block_sum2(v, smem);
}

// ---------------------------------------------------------------------------------------------
// Forward, vector path. One row per team; VPT vectors of 8 per thread.
template <int VPT, bool kWarpRow>
__global__ void __launch_bounds__(kWarpRow ? kWarpsPerBlock * kWarpSize : 512)
    ln_fwd_vec(const bf16* __restrict__ x, const bf16* __restrict__ res, bf16* __restrict__ sum_out,
               bf16* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
               const bf16* __restrict__ gamma, const bf16* __restrict__ beta, int rows, int cols, float eps) {
  __shared__ float red[2 * 32];
  const int team = kWarpRow ? kWarpSize : blockDim.x;
  const int t = kWarpRow ? threadIdx.x % kWarpSize : threadIdx.x;
  const int row = kWarpRow ? blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize : blockIdx.x;
  if (row >= rows) return;  // uniform over the team
  const int nvec = cols / kBf16PerVec;
  const std::size_t base = static_cast<std::size_t>(row) * cols;

  float v[VPT][8];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int vi = t + i * team;
    if (vi < nvec) {
      const std::size_t off = base + static_cast<std::size_t>(vi) * kBf16PerVec;
      load_bf16x8<Load::Streaming>(x + off, v[i]);
      if (res) {
        float r[8];
        load_bf16x8<Load::Streaming>(res + off, r);
        // The LN input is the bf16 sum that is stored (and that backward will read).
#pragma unroll
        for (int k = 0; k < 8; ++k) v[i][k] = __bfloat162float(__float2bfloat16_rn(v[i][k] + r[k]));
      }
      if (sum_out) store_bf16x8(sum_out + off, v[i]);
#pragma unroll
      for (int k = 0; k < 8; ++k) s += v[i][k];
    }
  }
  const float mean = team_sum<kWarpRow>(s, red) / cols;
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (t + i * team < nvec) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float d = v[i][k] - mean;
        q += d * d;
      }
    }
  }
  const float var = team_sum<kWarpRow>(q, red) / cols;
  const float rstd = rsqrtf(var + eps);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int vi = t + i * team;
    if (vi < nvec) {
      float g[8], b[8], o[8];
      load_bf16x8<Load::ReadOnly>(gamma + vi * kBf16PerVec, g);
      load_bf16x8<Load::ReadOnly>(beta + vi * kBf16PerVec, b);
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = (v[i][k] - mean) * rstd * g[k] + b[k];
      store_bf16x8(y + base + static_cast<std::size_t>(vi) * kBf16PerVec, o);
    }
  }
  if (t == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// Forward, scalar path: one block per row, three passes (mean, variance, output).
__global__ void __launch_bounds__(kScalarThreads)
    ln_fwd_scalar(const bf16* __restrict__ x, const bf16* __restrict__ res, bf16* __restrict__ sum_out,
                  bf16* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                  const bf16* __restrict__ gamma, const bf16* __restrict__ beta, int rows, int cols, float eps) {
  __shared__ float red[2 * 32];
  const int row = blockIdx.x;
  const std::size_t base = static_cast<std::size_t>(row) * cols;
  auto input = [&](int c) {
    float v = __bfloat162float(x[base + c]);
    if (res) v = __bfloat162float(__float2bfloat16_rn(v + __bfloat162float(res[base + c])));
    return v;
  };
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = input(c);
    if (sum_out) sum_out[base + c] = __float2bfloat16_rn(v);
    s += v;
  }
  const float mean = block_sum(s, red) / cols;
  float q = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = input(c) - mean;
    q += d * d;
  }
  const float rstd = rsqrtf(block_sum(q, red) / cols + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float o = (input(c) - mean) * rstd * __bfloat162float(gamma[c]) + __bfloat162float(beta[c]);
    y[base + c] = __float2bfloat16_rn(o);
  }
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, vector path. (At 1024 columns, 2 blocks of 8 warps per SM cap this at 128 registers;
// ptxas then spills ~72 bytes, loop-invariant scalars reloaded from L1, cheaper than halving the
// warps in flight.) Unit u (a warp or a block) handles rows u, u + U, u + 2U, ... and
// accumulates dgamma/dbeta for its columns in registers; one partial row per block goes to
// `partial` ([2][P][cols]: dgamma partials then dbeta partials, P = number of blocks).
template <int VPT, bool kWarpRow>
__global__ void __launch_bounds__(kWarpRow ? kWarpsPerBlock * kWarpSize : 512, kWarpRow ? 2 : 1)
    ln_bwd_vec(const bf16* dy, const bf16* __restrict__ sum, const float* __restrict__ mean,
               const float* __restrict__ rstd, const bf16* __restrict__ gamma, const bf16* __restrict__ d_extra,
               bf16* d_sum, float* __restrict__ partial, int rows, int cols) {
  // dy and d_sum may alias (each element is read before the same thread writes it): no __restrict__.
  __shared__ float red[2 * 32];
  const int team = kWarpRow ? kWarpSize : blockDim.x;
  const int t = kWarpRow ? threadIdx.x % kWarpSize : threadIdx.x;
  const int warp = threadIdx.x / kWarpSize;
  const int unit = kWarpRow ? blockIdx.x * kWarpsPerBlock + warp : blockIdx.x;
  const int units = kWarpRow ? gridDim.x * kWarpsPerBlock : gridDim.x;
  const int nvec = cols / kBf16PerVec;

  float acc_g[VPT][8], acc_b[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int k = 0; k < 8; ++k) acc_g[i][k] = acc_b[i][k] = 0.f;

  for (int row = unit; row < rows; row += units) {
    const std::size_t base = static_cast<std::size_t>(row) * cols;
    const bf16* dy_row = dy + base;
    const bf16* sum_row = sum + base;
    const float m = mean[row], r = rstd[row];
    uint4 dy_raw[VPT], x_raw[VPT];  // kept packed: half the registers of fp32
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int vi = t + i * team;
      if (vi < nvec) {
        const int off = vi * kBf16PerVec;  // within the row: 32-bit math keeps registers free
        dy_raw[i] = load16(dy_row + off);
        x_raw[i] = load16<Load::Streaming>(sum_row + off);
        float g[8], d[8], xv[8];
        load_bf16x8<Load::ReadOnly>(gamma + vi * kBf16PerVec, g);
        load_bf16x8(reinterpret_cast<const bf16*>(&dy_raw[i]), d);
        load_bf16x8(reinterpret_cast<const bf16*>(&x_raw[i]), xv);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float xh = (xv[k] - m) * r;
          const float dxh = d[k] * g[k];
          s1 += dxh;
          s2 += dxh * xh;
          acc_g[i][k] += d[k] * xh;
          acc_b[i][k] += d[k];
        }
      }
    }
    const float2 tot = team_sum2<kWarpRow>(make_float2(s1, s2), red);
    const float mean_dxh = tot.x / cols, mean_dxh_xh = tot.y / cols;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int vi = t + i * team;
      if (vi < nvec) {
        const int off = vi * kBf16PerVec;
        float g[8], d[8], xv[8], e[8], o[8];
        load_bf16x8<Load::ReadOnly>(gamma + vi * kBf16PerVec, g);
        load_bf16x8(reinterpret_cast<const bf16*>(&dy_raw[i]), d);
        load_bf16x8(reinterpret_cast<const bf16*>(&x_raw[i]), xv);
        if (d_extra) load_bf16x8<Load::Streaming>(d_extra + base + off, e);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float xh = (xv[k] - m) * r;
          o[k] = r * (d[k] * g[k] - mean_dxh - xh * mean_dxh_xh);
          if (d_extra) o[k] += e[k];
        }
        store_bf16x8(d_sum + base + off, o);
      }
    }
  }

  float* pg = partial;
  float* pb = partial + static_cast<std::size_t>(gridDim.x) * cols;
  const std::size_t prow = static_cast<std::size_t>(blockIdx.x) * cols;
  if constexpr (kWarpRow) {
    // Combine the block's warps in warp order (fixed) through shared memory, then write.
    __shared__ float sg[kWarpRowMaxVec * kWarpSize * kBf16PerVec], sb[kWarpRowMaxVec * kWarpSize * kBf16PerVec];
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      if (warp == w) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
          const int vi = t + i * team;
          if (vi < nvec) {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
              const int c = vi * kBf16PerVec + k;
              sg[c] = w == 0 ? acc_g[i][k] : sg[c] + acc_g[i][k];
              sb[c] = w == 0 ? acc_b[i][k] : sb[c] + acc_b[i][k];
            }
          }
        }
      }
      __syncthreads();
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      pg[prow + c] = sg[c];
      pb[prow + c] = sb[c];
    }
  } else {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int vi = t + i * team;
      if (vi < nvec) {
        const std::size_t off = prow + static_cast<std::size_t>(vi) * kBf16PerVec;
        store_f32x4(pg + off, acc_g[i]);
        store_f32x4(pg + off + 4, acc_g[i] + 4);
        store_f32x4(pb + off, acc_b[i]);
        store_f32x4(pb + off + 4, acc_b[i] + 4);
      }
    }
  }
}

// Backward, scalar path, parameter gradients: partial p sums rows [p*chunk, (p+1)*chunk) for 32
// columns; block (32, 8): ty strides the rows, then the 8 lanes are combined in ty order.
// Runs BEFORE ln_bwd_scalar_rows because d_sum may overwrite dy.
__global__ void __launch_bounds__(kWarpSize * kPartialRowsPerBlock)
    ln_bwd_scalar_params(const bf16* __restrict__ dy, const bf16* __restrict__ sum, const float* __restrict__ mean,
                         const float* __restrict__ rstd, float* __restrict__ partial, int rows, int cols) {
  __shared__ float sg[kPartialRowsPerBlock][kWarpSize], sb[kPartialRowsPerBlock][kWarpSize];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  const int p = blockIdx.y, P = gridDim.y;
  const int chunk = ceil_div(rows, P);
  const int r0 = p * chunk, r1 = min(rows, r0 + chunk);
  float g = 0.f, b = 0.f;
  if (c < cols) {
    for (int row = r0 + threadIdx.y; row < r1; row += kPartialRowsPerBlock) {
      const std::size_t i = static_cast<std::size_t>(row) * cols + c;
      const float d = __bfloat162float(dy[i]);
      g += d * (__bfloat162float(sum[i]) - mean[row]) * rstd[row];
      b += d;
    }
  }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int k = 1; k < kPartialRowsPerBlock; ++k) {
      g += sg[k][threadIdx.x];
      b += sb[k][threadIdx.x];
    }
    partial[static_cast<std::size_t>(p) * cols + c] = g;
    partial[static_cast<std::size_t>(P + p) * cols + c] = b;
  }
}

// Backward, scalar path, input gradient: one block per row, two passes.
__global__ void __launch_bounds__(kScalarThreads)
    ln_bwd_scalar_rows(const bf16* dy, const bf16* __restrict__ sum, const float* __restrict__ mean,
                       const float* __restrict__ rstd, const bf16* __restrict__ gamma,
                       const bf16* __restrict__ d_extra, bf16* d_sum, int rows, int cols) {
  __shared__ float red[2 * 32];
  const int row = blockIdx.x;
  const std::size_t base = static_cast<std::size_t>(row) * cols;
  const float m = mean[row], r = rstd[row];
  float s1 = 0.f, s2 = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float dxh = __bfloat162float(dy[base + c]) * __bfloat162float(gamma[c]);
    s1 += dxh;
    s2 += dxh * (__bfloat162float(sum[base + c]) - m) * r;
  }
  const float2 tot = block_sum2(make_float2(s1, s2), red);
  const float a = tot.x / cols, b = tot.y / cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xh = (__bfloat162float(sum[base + c]) - m) * r;
    float o = r * (__bfloat162float(dy[base + c]) * __bfloat162float(gamma[c]) - a - xh * b);
    if (d_extra) o += __bfloat162float(d_extra[base + c]);
    d_sum[base + c] = __float2bfloat16_rn(o);
  }
}

// Second stage: dgamma[c] (+)= Σ_p partial_g[p][c] in p order; same for dbeta. Block (32, 16):
// ty strides the partials, the 16 lanes are then combined in ty order.
template <typename TParam>
__global__ void __launch_bounds__(kWarpSize * 16)
    ln_param_finalize(const float* __restrict__ partial, int P, int cols, TParam* __restrict__ dgamma,
                      TParam* __restrict__ dbeta, bool accumulate) {
  constexpr int kLanes = 16;
  __shared__ float sg[kLanes][kWarpSize], sb[kLanes][kWarpSize];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  float g = 0.f, b = 0.f;
  if (c < cols) {
    for (int p = threadIdx.y; p < P; p += kLanes) {
      g += partial[static_cast<std::size_t>(p) * cols + c];
      b += partial[static_cast<std::size_t>(P + p) * cols + c];
    }
  }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int k = 1; k < kLanes; ++k) {
      g += sg[k][threadIdx.x];
      b += sb[k][threadIdx.x];
    }
    if (accumulate) {
      g += to_f32(dgamma[c]);
      b += to_f32(dbeta[c]);
    }
    dgamma[c] = from_f32<TParam>(g);
    dbeta[c] = from_f32<TParam>(b);
  }
}

void check_shape(const char* what, int rows, int cols) {
  CUTRAIN_CHECK(rows > 0, what, ": rows must be positive, got ", rows);
  CUTRAIN_CHECK(cols >= kMinCols && cols <= kMaxCols, what, ": hidden size (cols) must be in [", kMinCols, ", ",
                kMaxCols, "], got ", cols);
}

bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && !is_aligned16(p)) return false;
  return true;
}

template <int VPT, bool kWarpRow>
void launch_fwd(cudaStream_t s, dim3 grid, dim3 block, const bf16* x, const bf16* res, bf16* sum_out, bf16* y,
                float* mean, float* rstd, const bf16* gamma, const bf16* beta, int rows, int cols, float eps) {
  ln_fwd_vec<VPT, kWarpRow><<<grid, block, 0, s>>>(x, res, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps);
  CUTRAIN_LAUNCH_CHECK("ln_fwd_vec");
}

template <int VPT, bool kWarpRow>
void launch_bwd(cudaStream_t s, dim3 grid, dim3 block, const bf16* dy, const bf16* sum, const float* mean,
                const float* rstd, const bf16* gamma, const bf16* d_extra, bf16* d_sum, float* partial, int rows,
                int cols) {
  ln_bwd_vec<VPT, kWarpRow><<<grid, block, 0, s>>>(dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols);
  CUTRAIN_LAUNCH_CHECK("ln_bwd_vec");
}

}  // namespace

void layernorm_residual_forward(cudaStream_t s, const bf16* x, const bf16* residual, bf16* sum_out, bf16* y,
                                float* mean, float* rstd, const bf16* gamma, const bf16* beta, int rows, int cols,
                                float eps) {
  check_shape("layernorm_residual_forward", rows, cols);
  CUTRAIN_CHECK(x && y && mean && rstd && gamma && beta,
                "layernorm_residual_forward: x, y, mean, rstd, gamma and beta must be non-null");
  CUTRAIN_CHECK(!(sum_out && sum_out == x), "layernorm_residual_forward: sum_out must not alias x");
  CUTRAIN_CHECK(eps > 0.f, "layernorm_residual_forward: eps must be positive, got ", eps);
  const bool vec = cols % kBf16PerVec == 0 && all_aligned({x, residual, sum_out, y, gamma, beta});
  if (!vec) {
    ln_fwd_scalar<<<rows, kScalarThreads, 0, s>>>(x, residual, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps);
    CUTRAIN_LAUNCH_CHECK("ln_fwd_scalar");
    return;
  }
  const int nvec = cols / kBf16PerVec;
  if (use_warp_rows(cols)) {
    const dim3 grid(ceil_div(rows, kWarpsPerBlock)), block(kWarpsPerBlock * kWarpSize);
    switch (ceil_div(nvec, kWarpSize)) {
      case 1: launch_fwd<1, true>(s, grid, block, x, residual, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps); break;
      case 2: launch_fwd<2, true>(s, grid, block, x, residual, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps); break;
      case 3: launch_fwd<3, true>(s, grid, block, x, residual, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps); break;
      default: launch_fwd<4, true>(s, grid, block, x, residual, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps); break;
    }
  } else {
    launch_fwd<kBlockRowVec, false>(s, dim3(rows), dim3(block_row_threads(cols)), x, residual, sum_out, y, mean, rstd,
                                    gamma, beta, rows, cols, eps);
  }
}

std::size_t layernorm_backward_scratch_bytes(int rows, int cols) {
  check_shape("layernorm_backward_scratch_bytes", rows, cols);
  const int P = std::max(vec_partials(rows, cols), scalar_partials(rows, cols));
  return std::max(2 * static_cast<std::size_t>(P) * cols * sizeof(float), detail::ln_bwd_v2_scratch_bytes(rows, cols));
}

void layernorm_backward(cudaStream_t s, const bf16* dy, const bf16* sum, const float* mean, const float* rstd,
                        const bf16* gamma, const bf16* d_extra, bf16* d_sum, void* dgamma, void* dbeta,
                        DType param_grad_type, bool accumulate, void* scratch, int rows, int cols,
                        KernelVersion version) {
  check_shape("layernorm_backward", rows, cols);
  CUTRAIN_CHECK(dy && sum && mean && rstd && gamma && d_sum && dgamma && dbeta && scratch,
                "layernorm_backward: dy, sum, mean, rstd, gamma, d_sum, dgamma, dbeta and scratch must be non-null");
  CUTRAIN_CHECK(param_grad_type == DType::BF16 || param_grad_type == DType::F32,
                "layernorm_backward: dgamma/dbeta must be bfloat16 or float32, got ", dtype_name(param_grad_type));
  CUTRAIN_CHECK(is_aligned16(scratch), "layernorm_backward: scratch must be 16-byte aligned");
  float* partial = static_cast<float*>(scratch);
  const bool vec = cols % kBf16PerVec == 0 && all_aligned({dy, sum, gamma, d_extra, d_sum});
  // Default = V2: the fastest at both of the issue's shapes on the H200 (docs/perf-notes.md).
  if (version == KernelVersion::Default) version = KernelVersion::V2;
  if ((version == KernelVersion::V2 || version == KernelVersion::V3) && vec && detail::ln_bwd_v2_supported(cols)) {
    detail::ln_bwd_v2(s, dy, sum, mean, rstd, gamma, d_extra, d_sum, dgamma, dbeta, param_grad_type, accumulate,
                      partial, rows, cols, version == KernelVersion::V3);
    return;
  }
  int P;
  if (vec) {
    P = vec_partials(rows, cols);
    const int nvec = cols / kBf16PerVec;
    if (use_warp_rows(cols)) {
      const dim3 grid(P), block(kWarpsPerBlock * kWarpSize);
      switch (ceil_div(nvec, kWarpSize)) {
        case 1: launch_bwd<1, true>(s, grid, block, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
        case 2: launch_bwd<2, true>(s, grid, block, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
        case 3: launch_bwd<3, true>(s, grid, block, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
        default: launch_bwd<4, true>(s, grid, block, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
      }
    } else {
      launch_bwd<kBlockRowVec, false>(s, dim3(P), dim3(block_row_threads(cols)), dy, sum, mean, rstd, gamma, d_extra,
                                      d_sum, partial, rows, cols);
    }
  } else {
    P = scalar_partials(rows, cols);
    ln_bwd_scalar_params<<<dim3(ceil_div(cols, kWarpSize), P), dim3(kWarpSize, kPartialRowsPerBlock), 0, s>>>(
        dy, sum, mean, rstd, partial, rows, cols);
    CUTRAIN_LAUNCH_CHECK("ln_bwd_scalar_params");
    ln_bwd_scalar_rows<<<rows, kScalarThreads, 0, s>>>(dy, sum, mean, rstd, gamma, d_extra, d_sum, rows, cols);
    CUTRAIN_LAUNCH_CHECK("ln_bwd_scalar_rows");
  }
  const dim3 grid(ceil_div(cols, kWarpSize)), block(kWarpSize, 16);
  if (param_grad_type == DType::F32) {
    ln_param_finalize<float><<<grid, block, 0, s>>>(partial, P, cols, static_cast<float*>(dgamma),
                                                    static_cast<float*>(dbeta), accumulate);
  } else {
    ln_param_finalize<bf16><<<grid, block, 0, s>>>(partial, P, cols, static_cast<bf16*>(dgamma),
                                                   static_cast<bf16*>(dbeta), accumulate);
  }
  CUTRAIN_LAUNCH_CHECK("ln_param_finalize");
}

}  // namespace cutrain::kernels
