// @brief LayerNorm forward fused with the residual add (see layernorm.cuh; backward: layernorm_bwd.cu).
//
// Templated on the storage type T (bf16 or fp16), fp32 math, one instance each.
// Vector path (cols % 8 == 0, every pointer 16-byte aligned): a row is held in registers as
// 16-byte vectors, one row per warp for cols <= 1024, one row per block (up to 512 threads, 4
// vectors each) for wider rows (layernorm_tiles.cuh). Otherwise a scalar path (one block per row,
// several passes over global memory) gives the same results more slowly.
#include "kernels/layernorm.cuh"

#include "kernels/layernorm_tiles.cuh"

namespace cutrain::kernels {
namespace {

using namespace ln;

// A row team is a warp (kWarpRow) or the whole block; all its threads call team_sum together.
template <bool kWarpRow>
__device__ __forceinline__ float team_sum(float v, float* smem) {
  if constexpr (kWarpRow) return warp_sum(v);
  else return block_sum(v, smem);
}
// Forward, vector path. One row per team (a warp or the block, per Tile); VPT vectors of 8 per thread.
template <typename T, class Tile, int VPT>
__global__ void __launch_bounds__(Tile::kWarpRow ? FwdWarpRow::kThreads : BlockRow::kMaxThreads)
    ln_fwd_vec(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ sum_out,
               T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
               const T* __restrict__ gamma, const T* __restrict__ beta, int rows, int cols, float eps) {
  constexpr bool kWarpRow = Tile::kWarpRow;
  __shared__ float red[2 * 32];
  const int team = kWarpRow ? kWarpSize : blockDim.x;
  const int t = kWarpRow ? threadIdx.x % kWarpSize : threadIdx.x;
  const int row = kWarpRow ? blockIdx.x * FwdWarpRow::kRowsPerBlock + threadIdx.x / kWarpSize : blockIdx.x;
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
      load_x8<T, Load::Streaming>(x + off, v[i]);
      if (res) {
        float r[8];
        load_x8<T, Load::Streaming>(res + off, r);
        // The LN input is the 16-bit sum that is stored (and that backward will read).
#pragma unroll
        for (int k = 0; k < 8; ++k) v[i][k] = to_f32(from_f32<T>(v[i][k] + r[k]));
      }
      if (sum_out) store_x8(sum_out + off, v[i]);
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
      load_x8<T, Load::ReadOnly>(gamma + vi * kBf16PerVec, g);
      load_x8<T, Load::ReadOnly>(beta + vi * kBf16PerVec, b);
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = (v[i][k] - mean) * rstd * g[k] + b[k];
      store_x8(y + base + static_cast<std::size_t>(vi) * kBf16PerVec, o);
    }
  }
  if (t == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// Forward, scalar path: one block per row, three passes (mean, variance, output).
template <typename T>
__global__ void __launch_bounds__(Scalar::kThreads)
    ln_fwd_scalar(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ sum_out,
                  T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                  const T* __restrict__ gamma, const T* __restrict__ beta, int rows, int cols, float eps) {
  __shared__ float red[2 * 32];
  const int row = blockIdx.x;
  const std::size_t base = static_cast<std::size_t>(row) * cols;
  auto input = [&](int c) {
    float v = to_f32(x[base + c]);
    if (res) v = to_f32(from_f32<T>(v + to_f32(res[base + c])));
    return v;
  };
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = input(c);
    if (sum_out) sum_out[base + c] = from_f32<T>(v);
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
    const float o = (input(c) - mean) * rstd * to_f32(gamma[c]) + to_f32(beta[c]);
    y[base + c] = from_f32<T>(o);
  }
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

template <class Tile, int VPT, typename T>
void launch_fwd(cudaStream_t s, dim3 grid, dim3 block, const T* x, const T* res, T* sum_out, T* y,
                float* mean, float* rstd, const T* gamma, const T* beta, int rows, int cols, float eps) {
  ln_fwd_vec<T, Tile, VPT><<<grid, block, 0, s>>>(x, res, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps);
  CUTRAIN_LAUNCH_CHECK("ln_fwd_vec");
}

}  // namespace

template <typename T>
void layernorm_residual_forward(cudaStream_t s, const T* x, const nondeduced_t<T>* residual,
                                nondeduced_t<T>* sum_out, T* y, float* mean, float* rstd,
                                const nondeduced_t<T>* gamma, const nondeduced_t<T>* beta, int rows, int cols,
                                float eps) {
  check_shape("layernorm_residual_forward", rows, cols);
  CUTRAIN_CHECK(x && y && mean && rstd && gamma && beta,
                "layernorm_residual_forward: x, y, mean, rstd, gamma and beta must be non-null");
  CUTRAIN_CHECK(!(sum_out && sum_out == x), "layernorm_residual_forward: sum_out must not alias x");
  CUTRAIN_CHECK(eps > 0.f, "layernorm_residual_forward: eps must be positive, got ", eps);
  const bool vec = cols % kBf16PerVec == 0 && all_aligned({x, residual, sum_out, y, gamma, beta});
  if (!vec) {
    ln_fwd_scalar<T><<<rows, Scalar::kThreads, 0, s>>>(x, residual, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps);
    CUTRAIN_LAUNCH_CHECK("ln_fwd_scalar");
    return;
  }
  const int nvec = cols / kBf16PerVec;
  if (use_warp_rows(cols)) {
    using W = FwdWarpRow;
    static_assert(W::kMaxVpt == 4, "one case per VPT below");
    const dim3 grid(ceil_div(rows, W::kRowsPerBlock)), block(W::kThreads);
    switch (ceil_div(nvec, kWarpSize)) {
      case 1: launch_fwd<W, 1>(s, grid, block, x, residual, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps); break;
      case 2: launch_fwd<W, 2>(s, grid, block, x, residual, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps); break;
      case 3: launch_fwd<W, 3>(s, grid, block, x, residual, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps); break;
      default: launch_fwd<W, 4>(s, grid, block, x, residual, sum_out, y, mean, rstd, gamma, beta, rows, cols, eps); break;
    }
  } else {
    launch_fwd<BlockRow, BlockRow::kVpt>(s, dim3(rows), dim3(block_row_threads(cols)), x, residual, sum_out, y, mean,
                                         rstd, gamma, beta, rows, cols, eps);
  }
}

template void layernorm_residual_forward<bf16>(cudaStream_t, const bf16*, const bf16*, bf16*, bf16*, float*, float*,
                                               const bf16*, const bf16*, int, int, float);
template void layernorm_residual_forward<f16>(cudaStream_t, const f16*, const f16*, f16*, f16*, float*, float*,
                                              const f16*, const f16*, int, int, float);

}  // namespace cutrain::kernels
