// @brief bias_grad (kernels/gemm.cuh): db[N] = Σ_rows dy[M,N], deterministic, in two versions.
//
// Why our own kernel: on the H200 cuBLASLt's BGRADB epilogue ran ~30% slower than a plain GEMM and
// DGELU_BGRAD ~4x slower, while this reduction reads dy once.
//
// V1, two launches: the rows are cut into `splits` fixed chunks; block (tile, split) sums its
// chunk of a 256-column tile (8 columns per thread through one 16-byte load, 8 row lanes per
// block) and writes one fp32 partial per column to scratch[split][N]; then one thread per column
// sums the partials in split order (+ the old db when accumulating). At the model's shapes
// (2048 x 1024..4096) the second launch, 1024-4096 threads each walking 64 partials, cost as much
// as the first (ncu, session 4: 6.0 us each), so the pair ran at 0.08-0.26 of copy bandwidth.
//
// V2 (sm_90), one launch: a thread-block cluster of 8 blocks, one per row split, owns a 64-column
// tile; each block sums its rows (16-byte loads, 32 row lanes), then block 0 adds the 8 blocks'
// column sums through distributed shared memory in rank order. No scratch, no second launch.
// The default is V2 for N <= 8192 on sm_90+ and V1 otherwise (default_version: measured).
//
// Both: the split plan depends only on (M, N), never on the device or timing, so the result has
// the same bits every run.
#include <cooperative_groups.h>

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

// One thread's column sums over rows r_first, r_first + LANES_Y, ... < r_end of columns
// col..col+VEC-1 (VEC = 8: one 16-byte load a row, needs N % 8 == 0 and 16-byte alignment; VEC = 1:
// scalar). Both versions; the order of the adds is fixed, UNROLL only sets loads in flight.
template <int VEC, int LANES_Y, int UNROLL>
__device__ __forceinline__ void sum_rows(const bf16* __restrict__ dy, int N, int col, int r_first, int r_end,
                                         float (&acc)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = 0.f;
  if (col >= N) return;  // VEC = 8: N % 8 == 0, so all 8 columns are in range
  const bf16* p = dy + static_cast<std::size_t>(r_first) * N + col;
  const std::size_t step = static_cast<std::size_t>(LANES_Y) * N;
#pragma unroll UNROLL
  for (int r = r_first; r < r_end; r += LANES_Y, p += step) {
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

// ---- V2: one cluster per 64-column tile, the row splits summed through DSMEM ----

constexpr int kV2Tile = 64;      // columns per cluster: one 128-byte line of a bf16 row
constexpr int kV2Threads = 256;
constexpr int kV2Cluster = 8;    // blocks (row splits) per cluster: the portable maximum

// VEC = 8: 16-byte loads, 8 column lanes x 32 row lanes; VEC = 1: 64 column lanes x 4 row lanes.
template <int VEC, typename OutT>
__global__ void __cluster_dims__(1, kV2Cluster, 1) __launch_bounds__(kV2Threads)
    bias_grad_cluster_kernel(const bf16* __restrict__ dy, OutT* __restrict__ db, int M, int N, int rows_per_split,
                             bool accumulate) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int kLanesXv = kV2Tile / VEC;
  constexpr int kLanesYv = kV2Threads / kLanesXv;
  __shared__ float lanes[kLanesYv][kV2Tile];
  __shared__ float block_sum[kV2Tile];

  const int tx = threadIdx.x % kLanesXv, ty = threadIdx.x / kLanesXv;
  const int tile_col = blockIdx.x * kV2Tile;
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
  if (threadIdx.x < kV2Tile) {  // the row lanes in fixed order
    float s = 0.f;
#pragma unroll 8
    for (int y = 0; y < kLanesYv; ++y) s += lanes[y][threadIdx.x];
    block_sum[threadIdx.x] = s;
  }
  cluster.sync();
  const int c = tile_col + static_cast<int>(threadIdx.x);
  if (split == 0 && threadIdx.x < kV2Tile && c < N) {  // the splits in rank order
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < kV2Cluster; ++r) s += cluster.map_shared_rank(block_sum, r)[threadIdx.x];
    if (accumulate) s = load_f(db + c) + s;
    store_f(db + c, s);
  }
  cluster.sync();  // every block's shared memory must outlive block 0's reads
#else
  __trap();  // the launcher runs V2 only on sm_90 and newer
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

// Measured on the H200 (session 4, docs/perf-notes.md): V2 wins while its grid is at most about
// one wave of 8 blocks per SM (2048 x 1024..4096: 1.3-1.4x; 16384 x 4096: 1.07x); with more
// column tiles V1's wider tiles and no cluster barriers win (2048 x 50000: V1 1.11x faster;
// 16384 x 16384: 1.08x). The choice depends on N and the device only, so the bits stay fixed.
constexpr int kV2MaxTiles = 128;  // N <= 8192

KernelVersion default_version(int N, bool clusters) {
  return clusters && (N + kV2Tile - 1) / kV2Tile <= kV2MaxTiles ? KernelVersion::V2 : KernelVersion::V1;
}

template <typename OutT>
void launch_v2(cudaStream_t s, const bf16* dy, OutT* db, int M, int N, bool accumulate, bool vec) {
  const int rows = (M + kV2Cluster - 1) / kV2Cluster;
  const dim3 grid(static_cast<unsigned>((N + kV2Tile - 1) / kV2Tile), kV2Cluster);
  if (vec) {
    bias_grad_cluster_kernel<8, OutT><<<grid, kV2Threads, 0, s>>>(dy, db, M, N, rows, accumulate);
    CUTRAIN_LAUNCH_CHECK("bias_grad_cluster_kernel<8>");
  } else {
    bias_grad_cluster_kernel<1, OutT><<<grid, kV2Threads, 0, s>>>(dy, db, M, N, rows, accumulate);
    CUTRAIN_LAUNCH_CHECK("bias_grad_cluster_kernel<1>");
  }
}

}  // namespace

std::size_t bias_grad_scratch_bytes(int M, int N) {
  CUTRAIN_CHECK(M > 0 && N > 0, "bias_grad_scratch_bytes: M and N must be > 0, got M=", M, " N=", N);
  return static_cast<std::size_t>(split_plan(M, N).splits) * N * sizeof(float);
}

void bias_grad(cudaStream_t s, const bf16* dy, void* db, DType db_type, int M, int N, bool accumulate, void* scratch,
               KernelVersion version) {
  const char* fn = "bias_grad";
  CUTRAIN_CHECK(M > 0 && N > 0, fn, ": M and N must be > 0, got M=", M, " N=", N);
  CUTRAIN_CHECK(db_type == DType::BF16 || db_type == DType::F32, fn, ": db_type must be bfloat16 or float32, got ",
                dtype_name(db_type));
  CUTRAIN_CHECK(version == KernelVersion::Default || version == KernelVersion::V1 || version == KernelVersion::V2, fn,
                ": version must be Default, V1 or V2, got ", version_name(version));
  CUTRAIN_CHECK(dy != nullptr && db != nullptr, fn, ": dy and db must not be null, got dy=",
                static_cast<const void*>(dy), " db=", db);
  const bool clusters = device_has_clusters();
  CUTRAIN_CHECK(version != KernelVersion::V2 || clusters, fn,
                ": V2 needs thread-block clusters (sm_90 or newer); this device has none");
  if (version == KernelVersion::Default) version = default_version(N, clusters);
  CUTRAIN_CHECK(version == KernelVersion::V2 || scratch != nullptr, fn,
                ": scratch must not be null for V1 (bias_grad_scratch_bytes(M, N) bytes), got scratch=", scratch);
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(dy) % 2 == 0, fn, ": dy must be 2-byte aligned, got ",
                static_cast<const void*>(dy));
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(db) % dtype_size(db_type) == 0, fn, ": db must be ",
                dtype_size(db_type), "-byte aligned for ", dtype_name(db_type), ", got ", db);
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(scratch) % 4 == 0, fn, ": scratch must be 4-byte aligned, got ",
                scratch);

  const bool vec = N % 8 == 0 && reinterpret_cast<std::uintptr_t>(dy) % 16 == 0;
  if (version == KernelVersion::V2) {
    if (db_type == DType::F32) {
      launch_v2(s, dy, static_cast<float*>(db), M, N, accumulate, vec);
    } else {
      launch_v2(s, dy, static_cast<bf16*>(db), M, N, accumulate, vec);
    }
    return;
  }
  const SplitPlan plan = split_plan(M, N);
  float* partial = static_cast<float*>(scratch);
  const dim3 block(kLanesX, kLanesY);
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
