// @brief bias_grad (kernels/gemm.cuh): db[N] = Σ_rows dy[M,N], deterministic, one algorithm per width.
//
// Our own kernel because cuBLASLt's BGRADB / DGELU_BGRAD epilogues cost more than a plain GEMM
// plus this reduction, which reads dy once.
//
// The tile table (one struct per algorithm, chosen by N):
// - ClusterTile (N <= 8192, sm_90+), one launch: a thread-block cluster of 8 blocks, one per row
//   split, owns a 64-column tile; each block sums its rows (16-byte loads, 32 row lanes), then
//   block 0 adds the 8 blocks' column sums through distributed shared memory in rank order. No
//   scratch, no second launch.
// - WideTile (wider rows, or no clusters), two launches: the rows are cut into `splits` fixed
//   chunks; block (tile, split) sums its chunk of a 256-column tile (8 columns per thread through
//   one 16-byte load, 8 row lanes per block) and writes one fp32 partial per column to
//   scratch[split][N]; then one thread per column sums the partials in split order.
// Both: the split plan depends only on (M, N), never on the device or timing, so the result has
// the same bits every run.
#include <cooperative_groups.h>

#include <algorithm>

#include "kernels/common/vec.cuh"
#include "kernels/gemm.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {

namespace {

struct WideTile {
  static constexpr int kLanesX = 32;                // threads across columns (one warp: coalesced rows)
  static constexpr int kLanesY = 8;                 // row lanes per block
  static constexpr int kTileCols = kLanesX * 8;     // columns per block on the vector path; the split plan's unit
  static constexpr int kTargetBlocks = 1024;        // enough to fill 132 SMs several times over
  static constexpr int kMinRowsPerSplit = 32;       // below this a split is not worth its partial row
  static constexpr int kFinishThreads = 256;
};
struct ClusterTile {
  static constexpr int kCols = 64;       // columns per cluster: one 128-byte line of a bf16 row
  static constexpr int kThreads = 256;
  static constexpr int kCluster = 8;     // blocks (row splits) per cluster: the portable maximum
  // Widest N: up to about one wave of 8-block clusters per SM the single launch wins; with more
  // column tiles the wide tiles and no cluster barriers win.
  static constexpr int kMaxN = 128 * kCols;  // 8192
};

struct SplitPlan {
  int splits;
  int rows_per_split;
};

SplitPlan split_plan(int M, int N) {
  using T = WideTile;
  const int col_tiles = (N + T::kTileCols - 1) / T::kTileCols;
  const int max_by_rows = std::max(1, (M + T::kMinRowsPerSplit - 1) / T::kMinRowsPerSplit);
  int splits = std::clamp(T::kTargetBlocks / col_tiles, 1, max_by_rows);
  const int rows = (M + splits - 1) / splits;
  splits = (M + rows - 1) / rows;  // no empty trailing split
  return {splits, rows};
}

// One thread's column sums over rows r_first, r_first + LANES_Y, ... < r_end of columns
// col..col+VEC-1 (VEC = 8: one 16-byte load a row, needs N % 8 == 0 and 16-byte alignment; VEC = 1:
// scalar). Both tiles; the order of the adds is fixed, UNROLL only sets loads in flight.
template <int VEC, int LANES_Y, int UNROLL, typename TS>
__device__ __forceinline__ void sum_rows(const TS* __restrict__ dy, int N, int col, int r_first, int r_end,
                                         float (&acc)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = 0.f;
  if (col >= N) return;  // VEC = 8: N % 8 == 0, so all 8 columns are in range
  const TS* p = dy + static_cast<std::size_t>(r_first) * N + col;
  const std::size_t step = static_cast<std::size_t>(LANES_Y) * N;
#pragma unroll UNROLL
  for (int r = r_first; r < r_end; r += LANES_Y, p += step) {
    if constexpr (VEC == 8) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
      const pair16_t<TS>* h = reinterpret_cast<const pair16_t<TS>*>(&v);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = to_f32x2(h[j]);
        acc[2 * j] += f.x;
        acc[2 * j + 1] += f.y;
      }
    } else {
      acc[0] += to_f32(*p);
    }
  }
}

// VEC = 8: 16-byte loads (needs N % 8 == 0 and a 16-byte aligned dy); VEC = 1: scalar loads.
template <class Tile, int VEC, typename TS>
__global__ void __launch_bounds__(Tile::kLanesX* Tile::kLanesY)
    bias_grad_partial_kernel(const TS* __restrict__ dy, float* __restrict__ partial, int M, int N,
                             int rows_per_split) {
  constexpr int kLanesX = Tile::kLanesX, kLanesY = Tile::kLanesY;
  constexpr int kCols = kLanesX * VEC;
  __shared__ float sums[kLanesY][kCols];

  const int tile_col = blockIdx.x * kCols;
  const int col = tile_col + threadIdx.x * VEC;  // first of this thread's VEC columns
  const int split = blockIdx.y;
  const int r_begin = split * rows_per_split;
  const int r_end = min(M, r_begin + rows_per_split);

  float acc[VEC];
  sum_rows<VEC, kLanesY, 4>(dy, N, col, r_begin + threadIdx.y, r_end, acc);
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
__device__ __forceinline__ float load_f(const OutT* p) { return to_f32(*p); }
template <typename OutT>
__device__ __forceinline__ void store_f(OutT* p, float v) { *p = from_f32<OutT>(v); }

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

// ---- ClusterTile: one cluster per 64-column tile, the row splits summed through DSMEM ----

// VEC = 8: 16-byte loads, 8 column lanes x 32 row lanes; VEC = 1: 64 column lanes x 4 row lanes.
template <class Tile, int VEC, typename TS, typename OutT>
__global__ void __cluster_dims__(1, Tile::kCluster, 1) __launch_bounds__(Tile::kThreads)
    bias_grad_cluster_kernel(const TS* __restrict__ dy, OutT* __restrict__ db, int M, int N, int rows_per_split,
                             bool accumulate) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int kLanesXv = Tile::kCols / VEC;
  constexpr int kLanesYv = Tile::kThreads / kLanesXv;
  __shared__ float lanes[kLanesYv][Tile::kCols];
  __shared__ float block_sum[Tile::kCols];

  const int tx = threadIdx.x % kLanesXv, ty = threadIdx.x / kLanesXv;
  const int tile_col = blockIdx.x * Tile::kCols;
  const int col = tile_col + tx * VEC;
  cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(cluster.block_rank());  // the grid is one cluster tall
  const int r_begin = split * rows_per_split;
  const int r_end = min(M, r_begin + rows_per_split);

  float acc[VEC];
  sum_rows<VEC, kLanesYv, 8>(dy, N, col, r_begin + ty, r_end, acc);
#pragma unroll
  for (int j = 0; j < VEC; ++j) lanes[ty][tx * VEC + j] = acc[j];
  __syncthreads();
  if (threadIdx.x < Tile::kCols) {  // the row lanes in fixed order
    float s = 0.f;
#pragma unroll 8
    for (int y = 0; y < kLanesYv; ++y) s += lanes[y][threadIdx.x];
    block_sum[threadIdx.x] = s;
  }
  cluster.sync();
  const int c = tile_col + static_cast<int>(threadIdx.x);
  if (split == 0 && threadIdx.x < Tile::kCols && c < N) {  // the splits in rank order
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < Tile::kCluster; ++r) s += cluster.map_shared_rank(block_sum, r)[threadIdx.x];
    if (accumulate) s = load_f(db + c) + s;
    store_f(db + c, s);
  }
  cluster.sync();  // every block's shared memory must outlive block 0's reads
#else
  __trap();  // the launcher runs the cluster tile only on sm_90 and newer
#endif
}

// Whether the current device has thread-block clusters (sm_90+). Asked each call, as the other
// launchers ask for their SM counts: cudaDeviceGetAttribute is a cached lookup in the runtime.
bool device_has_clusters() {
  int dev = 0, major = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 9;
}

// The tile for a width: ClusterTile where it fits and the device has clusters, WideTile otherwise.
// Depends on N and the device only, so the bits stay fixed.
bool use_cluster_tile(int N, bool clusters) { return clusters && N <= ClusterTile::kMaxN; }

template <typename TS, typename OutT>
void launch_cluster(cudaStream_t s, const TS* dy, OutT* db, int M, int N, bool accumulate, bool vec) {
  const int rows = (M + ClusterTile::kCluster - 1) / ClusterTile::kCluster;
  const dim3 grid(static_cast<unsigned>((N + ClusterTile::kCols - 1) / ClusterTile::kCols), ClusterTile::kCluster);
  if (vec) {
    bias_grad_cluster_kernel<ClusterTile, 8, TS, OutT><<<grid, ClusterTile::kThreads, 0, s>>>(dy, db, M, N, rows, accumulate);
    CUTRAIN_LAUNCH_CHECK("bias_grad_cluster_kernel<8>");
  } else {
    bias_grad_cluster_kernel<ClusterTile, 1, TS, OutT><<<grid, ClusterTile::kThreads, 0, s>>>(dy, db, M, N, rows, accumulate);
    CUTRAIN_LAUNCH_CHECK("bias_grad_cluster_kernel<1>");
  }
}

}  // namespace

std::size_t bias_grad_scratch_bytes(int M, int N) {
  CUTRAIN_CHECK(M > 0 && N > 0, "bias_grad_scratch_bytes: M and N must be > 0, got M=", M, " N=", N);
  return static_cast<std::size_t>(split_plan(M, N).splits) * N * sizeof(float);
}

template <typename TS>
void bias_grad(cudaStream_t s, const TS* dy, void* db, DType db_type, int M, int N, bool accumulate,
               void* scratch) {
  const char* fn = "bias_grad";
  CUTRAIN_CHECK(M > 0 && N > 0, fn, ": M and N must be > 0, got M=", M, " N=", N);
  CUTRAIN_CHECK(db_type == DType::BF16 || db_type == DType::F16 || db_type == DType::F32, fn,
                ": db_type must be bfloat16, float16 or float32, got ", dtype_name(db_type));
  CUTRAIN_CHECK(dy != nullptr && db != nullptr, fn, ": dy and db must not be null, got dy=",
                static_cast<const void*>(dy), " db=", db);
  const bool cluster = use_cluster_tile(N, device_has_clusters());
  CUTRAIN_CHECK(cluster || scratch != nullptr, fn,
                ": scratch must not be null at this width (bias_grad_scratch_bytes(M, N) bytes), got scratch=", scratch);
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(dy) % 2 == 0, fn, ": dy must be 2-byte aligned, got ",
                static_cast<const void*>(dy));
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(db) % dtype_size(db_type) == 0, fn, ": db must be ",
                dtype_size(db_type), "-byte aligned for ", dtype_name(db_type), ", got ", db);
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(scratch) % 4 == 0, fn, ": scratch must be 4-byte aligned, got ",
                scratch);

  const bool vec = N % 8 == 0 && reinterpret_cast<std::uintptr_t>(dy) % 16 == 0;
  if (cluster) {
    if (db_type == DType::F32) launch_cluster(s, dy, static_cast<float*>(db), M, N, accumulate, vec);
    else if (db_type == DType::F16) launch_cluster(s, dy, static_cast<f16*>(db), M, N, accumulate, vec);
    else launch_cluster(s, dy, static_cast<bf16*>(db), M, N, accumulate, vec);
    return;
  }
  using T = WideTile;
  const SplitPlan plan = split_plan(M, N);
  float* partial = static_cast<float*>(scratch);
  const dim3 block(T::kLanesX, T::kLanesY);
  if (vec) {
    const dim3 grid((N + T::kTileCols - 1) / T::kTileCols, plan.splits);
    bias_grad_partial_kernel<T, 8, TS><<<grid, block, 0, s>>>(dy, partial, M, N, plan.rows_per_split);
    CUTRAIN_LAUNCH_CHECK("bias_grad_partial_kernel<8>");
  } else {
    const dim3 grid((N + T::kLanesX - 1) / T::kLanesX, plan.splits);
    bias_grad_partial_kernel<T, 1, TS><<<grid, block, 0, s>>>(dy, partial, M, N, plan.rows_per_split);
    CUTRAIN_LAUNCH_CHECK("bias_grad_partial_kernel<1>");
  }
  const int threads = T::kFinishThreads;
  const unsigned blocks = static_cast<unsigned>((N + threads - 1) / threads);
  if (db_type == DType::F32) {
    bias_grad_finish_kernel<float><<<blocks, threads, 0, s>>>(partial, static_cast<float*>(db), N, plan.splits,
                                                             accumulate);
    CUTRAIN_LAUNCH_CHECK("bias_grad_finish_kernel<float>");
  } else if (db_type == DType::F16) {
    bias_grad_finish_kernel<f16><<<blocks, threads, 0, s>>>(partial, static_cast<f16*>(db), N, plan.splits,
                                                           accumulate);
    CUTRAIN_LAUNCH_CHECK("bias_grad_finish_kernel<f16>");
  } else {
    bias_grad_finish_kernel<bf16><<<blocks, threads, 0, s>>>(partial, static_cast<bf16*>(db), N, plan.splits,
                                                            accumulate);
    CUTRAIN_LAUNCH_CHECK("bias_grad_finish_kernel<bf16>");
  }
}

template void bias_grad<bf16>(cudaStream_t, const bf16*, void*, DType, int, int, bool, void*);
template void bias_grad<f16>(cudaStream_t, const f16*, void*, DType, int, int, bool, void*);

}  // namespace cutrain::kernels
