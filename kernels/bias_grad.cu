// @brief bias_grad (kernels/gemm.cuh): db[N] = Σ_rows dy[M,N], deterministic two-stage reduction.
//
// Why our own kernel: on the H200 cuBLASLt's BGRADB epilogue ran ~30% slower than a plain GEMM and
// DGELU_BGRAD ~4x slower, while this reduction reads dy once at near copy bandwidth.
//
// Stage 1: the rows are cut into `splits` fixed chunks; block (tile, split) sums its chunk of a
// 256-column tile (8 columns per thread through one 16-byte load, 8 row lanes per block) and
// writes one fp32 partial per column to scratch[split][N]. Stage 2: one thread per column sums
// the partials in split order (+ the old db when accumulating). The split count depends only on
// (M, N), never on the device or timing, so the result has the same bits every run.
#include <algorithm>

#include "kernels/gemm.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {

namespace {

constexpr int kLanesX = 32;           // threads across columns (one warp: coalesced rows)
constexpr int kLanesY = 8;            // row lanes per block
constexpr int kTileCols = kLanesX * 8;  // columns per block on the vector path; also the split plan's unit
constexpr int kTargetBlocks = 1024;   // enough to fill 132 SMs several times over
constexpr int kMinRowsPerSplit = 32;  // below this a split is not worth its partial row

struct SplitPlan {
  int splits;
  int rows_per_split;
};

SplitPlan split_plan(int M, int N) {
  const int col_tiles = (N + kTileCols - 1) / kTileCols;
  const int max_by_rows = std::max(1, (M + kMinRowsPerSplit - 1) / kMinRowsPerSplit);
  int splits = std::clamp(kTargetBlocks / col_tiles, 1, max_by_rows);
  const int rows = (M + splits - 1) / splits;
  splits = (M + rows - 1) / rows;  // no empty trailing split
  return {splits, rows};
}

// VEC = 8: 16-byte loads (needs N % 8 == 0 and a 16-byte aligned dy); VEC = 1: scalar loads.
template <int VEC>
__global__ void __launch_bounds__(kLanesX* kLanesY) bias_grad_partial_kernel(const bf16* __restrict__ dy,
                                                                             float* __restrict__ partial, int M, int N,
                                                                             int rows_per_split) {
  constexpr int kCols = kLanesX * VEC;
  __shared__ float sums[kLanesY][kCols];

  const int tile_col = blockIdx.x * kCols;
  const int col = tile_col + threadIdx.x * VEC;  // first of this thread's VEC columns
  const int split = blockIdx.y;
  const int r_begin = split * rows_per_split;
  const int r_end = min(M, r_begin + rows_per_split);

  float acc[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = 0.f;

  if (col < N) {  // VEC = 8: N % 8 == 0, so all 8 columns are in range
    const bf16* p = dy + static_cast<std::size_t>(r_begin + threadIdx.y) * N + col;
    const std::size_t step = static_cast<std::size_t>(kLanesY) * N;
#pragma unroll 4
    for (int r = r_begin + threadIdx.y; r < r_end; r += kLanesY, p += step) {
      if constexpr (VEC == 8) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(h[j]);
          acc[2 * j] += f.x;
          acc[2 * j + 1] += f.y;
        }
      } else {
        acc[0] += __bfloat162float(*p);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) sums[threadIdx.y][threadIdx.x * VEC + j] = acc[j];
  __syncthreads();

  // One thread per tile column adds the row lanes in fixed order.
  const int t = threadIdx.y * kLanesX + threadIdx.x;
  if (t < kCols && tile_col + t < N) {
    float s = 0.f;
#pragma unroll
    for (int y = 0; y < kLanesY; ++y) s += sums[y][t];
    partial[static_cast<std::size_t>(split) * N + tile_col + t] = s;
  }
}

template <typename OutT>
__device__ __forceinline__ float load_f(const OutT* p);
template <>
__device__ __forceinline__ float load_f<float>(const float* p) { return *p; }
template <>
__device__ __forceinline__ float load_f<bf16>(const bf16* p) { return __bfloat162float(*p); }

template <typename OutT>
__device__ __forceinline__ void store_f(OutT* p, float v);
template <>
__device__ __forceinline__ void store_f<float>(float* p, float v) { *p = v; }
template <>
__device__ __forceinline__ void store_f<bf16>(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename OutT>
__global__ void bias_grad_finish_kernel(const float* __restrict__ partial, OutT* __restrict__ db, int N, int splits,
                                        bool accumulate) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= N) return;
  float s = 0.f;
#pragma unroll 8
  for (int k = 0; k < splits; ++k) s += partial[static_cast<std::size_t>(k) * N + col];
  if (accumulate) s = load_f(db + col) + s;
  store_f(db + col, s);
}

}  // namespace

std::size_t bias_grad_scratch_bytes(int M, int N) {
  CUTRAIN_CHECK(M > 0 && N > 0, "bias_grad_scratch_bytes: M and N must be > 0, got M=", M, " N=", N);
  return static_cast<std::size_t>(split_plan(M, N).splits) * N * sizeof(float);
}

void bias_grad(cudaStream_t s, const bf16* dy, void* db, DType db_type, int M, int N, bool accumulate, void* scratch) {
  const char* fn = "bias_grad";
  CUTRAIN_CHECK(M > 0 && N > 0, fn, ": M and N must be > 0, got M=", M, " N=", N);
  CUTRAIN_CHECK(db_type == DType::BF16 || db_type == DType::F32, fn, ": db_type must be bfloat16 or float32, got ",
                dtype_name(db_type));
  CUTRAIN_CHECK(dy != nullptr && db != nullptr && scratch != nullptr, fn, ": dy, db and scratch must not be null, got dy=",
                static_cast<const void*>(dy), " db=", db, " scratch=", scratch);
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(dy) % 2 == 0, fn, ": dy must be 2-byte aligned, got ",
                static_cast<const void*>(dy));
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(db) % dtype_size(db_type) == 0, fn, ": db must be ",
                dtype_size(db_type), "-byte aligned for ", dtype_name(db_type), ", got ", db);
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(scratch) % 4 == 0, fn, ": scratch must be 4-byte aligned, got ",
                scratch);

  const SplitPlan plan = split_plan(M, N);
  float* partial = static_cast<float*>(scratch);
  const dim3 block(kLanesX, kLanesY);
  const bool vec = N % 8 == 0 && reinterpret_cast<std::uintptr_t>(dy) % 16 == 0;
  if (vec) {
    const dim3 grid((N + kTileCols - 1) / kTileCols, plan.splits);
    bias_grad_partial_kernel<8><<<grid, block, 0, s>>>(dy, partial, M, N, plan.rows_per_split);
    CUTRAIN_LAUNCH_CHECK("bias_grad_partial_kernel<8>");
  } else {
    const dim3 grid((N + kLanesX - 1) / kLanesX, plan.splits);
    bias_grad_partial_kernel<1><<<grid, block, 0, s>>>(dy, partial, M, N, plan.rows_per_split);
    CUTRAIN_LAUNCH_CHECK("bias_grad_partial_kernel<1>");
  }
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((N + threads - 1) / threads);
  if (db_type == DType::F32) {
    bias_grad_finish_kernel<float><<<blocks, threads, 0, s>>>(partial, static_cast<float*>(db), N, plan.splits,
                                                             accumulate);
    CUTRAIN_LAUNCH_CHECK("bias_grad_finish_kernel<float>");
  } else {
    bias_grad_finish_kernel<bf16><<<blocks, threads, 0, s>>>(partial, static_cast<bf16*>(db), N, plan.splits,
                                                            accumulate);
    CUTRAIN_LAUNCH_CHECK("bias_grad_finish_kernel<bf16>");
  }
}

}  // namespace cutrain::kernels
