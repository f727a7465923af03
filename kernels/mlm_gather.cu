// @brief The kernels of kernels/mlm_gather.cuh. The plan: one block of 32 warps, a warp per
// sequence walking it 32 positions at a time (a ballot and a popcount give each labelled row its
// slot in row order); the errors are reduced in shared memory and thread 0 writes the status, so
// the status needs no clearing beforehand. The scatter: a thread per 16-byte vector (8 bf16 or fp16) when
// the rows allow it (hidden % 8 == 0, 16-byte aligned bases), per element otherwise (kVec).
#include "kernels/mlm_gather.cuh"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {
namespace {

constexpr int kPlanThreads = 1024;
constexpr int kWarps = kPlanThreads / 32;

__global__ void __launch_bounds__(kPlanThreads)
    plan_kernel(const std::int32_t* __restrict__ labels, int B, int S, int K, int vocab, int ignore,
                std::int32_t* __restrict__ pos, std::int32_t* __restrict__ glabels, std::int32_t* __restrict__ slot,
                int* status) {
  __shared__ int bad_row, full_seq;
  if (threadIdx.x == 0) {
    bad_row = INT_MAX;
    full_seq = INT_MAX;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1u;  // the lanes before this one
  for (int b = warp; b < B; b += kWarps) {
    int count = 0;
    const std::int64_t base = std::int64_t(b) * S, sbase = std::int64_t(b) * K;
    for (int i0 = 0; i0 < S; i0 += 32) {
      const int i = i0 + lane;
      const int lab = i < S ? labels[base + i] : ignore;
      const bool labelled = lab != ignore;
      const bool bad = labelled && (lab < 0 || lab >= vocab);
      const bool take = labelled && !bad;
      const unsigned m = __ballot_sync(0xffffffffu, take);
      const int k = count + __popc(m & below);
      if (i < S) {
        int sl = -1;
        if (take && k < K) {
          pos[sbase + k] = i;
          glabels[sbase + k] = lab;
          sl = int(sbase + k);
        }
        slot[base + i] = sl;
      }
      if (bad) atomicMin(&bad_row, int(base + i));
      count += __popc(m);
    }
    if (count > K && lane == 0) atomicMin(&full_seq, b);
    for (int k = count + lane; k < K; k += 32) {
      pos[sbase + k] = 0;
      glabels[sbase + k] = ignore;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && status)
    *status = bad_row != INT_MAX ? bad_row + 1 : full_seq != INT_MAX ? -(full_seq + 1) : 0;
}

template <typename T, int kVec>
__global__ void scatter_kernel(const T* __restrict__ src, const std::int32_t* __restrict__ slot,
                               T* __restrict__ out, std::int64_t n, int H) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t g = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g * kVec < n; g += stride) {
    const std::int64_t e = g * kVec, r = e / H, c = e % H;
    const int sl = slot[r];
    if constexpr (kVec == 8) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (sl >= 0) v = *reinterpret_cast<const uint4*>(src + std::int64_t(sl) * H + c);
      *reinterpret_cast<uint4*>(out + e) = v;
    } else {
      out[e] = sl >= 0 ? src[std::int64_t(sl) * H + c] : from_f32<T>(0.f);
    }
  }
}

}  // namespace

void mlm_gather_plan(cudaStream_t s, const std::int32_t* labels, int B, int S, int K, int vocab, std::int32_t* pos,
                     std::int32_t* glabels, std::int32_t* slot, int* status, int ignore_index) {
  CUTRAIN_CHECK(B > 0 && S > 0 && K > 0 && vocab > 0, "mlm_gather_plan: B, S, K and vocab must be > 0, got B=", B,
                " S=", S, " K=", K, " vocab=", vocab);
  CUTRAIN_CHECK(K <= S, "mlm_gather_plan: K (max_predictions_per_seq) must be at most S, got K=", K, " S=", S);
  CUTRAIN_CHECK(std::int64_t(B) * S < INT_MAX, "mlm_gather_plan: B*S must be below 2^31, got B=", B, " S=", S);
  CUTRAIN_CHECK(labels && pos && glabels && slot, "mlm_gather_plan: null buffer");
  NvtxRange range("mlm_gather_plan");
  plan_kernel<<<1, kPlanThreads, 0, s>>>(labels, B, S, K, vocab, ignore_index, pos, glabels, slot, status);
  CUTRAIN_LAUNCH_CHECK("mlm_gather_plan");
}

template <typename T>
void mlm_scatter_rows(cudaStream_t s, const T* gathered, const std::int32_t* slot, T* out, int rows,
                      int hidden) {
  CUTRAIN_CHECK(rows > 0 && hidden > 0, "mlm_scatter_rows: rows and hidden must be > 0, got rows=", rows,
                " hidden=", hidden);
  CUTRAIN_CHECK(gathered && slot && out, "mlm_scatter_rows: null buffer");
  NvtxRange range("mlm_scatter_rows");
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  const bool vec = hidden % 8 == 0 && aligned(gathered) && aligned(out);
  const std::int64_t n = std::int64_t(rows) * hidden;
  constexpr int kThreads = 256;
  const std::int64_t groups = vec ? n / 8 : n;
  const unsigned grid = unsigned(std::min<std::int64_t>((groups + kThreads - 1) / kThreads, 65535));
  if (vec) scatter_kernel<T, 8><<<grid, kThreads, 0, s>>>(gathered, slot, out, n, hidden);
  else scatter_kernel<T, 1><<<grid, kThreads, 0, s>>>(gathered, slot, out, n, hidden);
  CUTRAIN_LAUNCH_CHECK("mlm_scatter_rows");
}

template void mlm_scatter_rows<bf16>(cudaStream_t, const bf16*, const std::int32_t*, bf16*, int, int);
template void mlm_scatter_rows<f16>(cudaStream_t, const f16*, const std::int32_t*, f16*, int, int);

}  // namespace cutrain::kernels
