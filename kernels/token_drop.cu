// @brief The kernels of kernels/token_drop.cuh: one block per kept row (gather, scatter) or per row
// of the stream (merge); each thread moves 16-byte vectors (8 bf16 or fp16) when the rows allow it
// (hidden % 8 == 0, 16-byte aligned bases), single
// elements otherwise (the template flag kVec).
#include "kernels/token_drop.cuh"

#include <initializer_list>

#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {
namespace {

constexpr int kThreads = 128;

// One row of H elements by the block's threads: dst = src (a bit copy), or src + plus (the sum in
// fp32 rounded once to T) when plus is given.
template <typename T, int kVec>
__device__ __forceinline__ void row_move(T* __restrict__ dst, const T* __restrict__ src, const T* __restrict__ plus,
                                         int H) {
  for (int c = threadIdx.x * kVec; c < H; c += kThreads * kVec) {
    if (!plus) {
      if constexpr (kVec == 8) *reinterpret_cast<uint4*>(dst + c) = *reinterpret_cast<const uint4*>(src + c);
      else dst[c] = src[c];
      continue;
    }
    if constexpr (kVec == 8) {
      float f[8], g[8];
      load_x8(src + c, f);
      load_x8(plus + c, g);
      for (int e = 0; e < 8; ++e) f[e] += g[e];
      store_x8(dst + c, f);
    } else {
      dst[c] = from_f32<T>(to_f32(src[c]) + to_f32(plus[c]));
    }
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) gather_kernel(const T* __restrict__ x, const std::int32_t* __restrict__ idx,
                                                           T* __restrict__ kept, int S, int K, int H) {
  const std::int64_t row = blockIdx.x;  // b * K + j
  const std::int64_t b = row / K;
  const T* src = x + (b * S + idx[row]) * H;
  T* dst = kept + row * H;
  row_move<T, kVec>(dst, src, nullptr, H);
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) scatter_kernel(const T* __restrict__ kept, const T* __restrict__ add,
                                                            const std::int32_t* __restrict__ idx, T* __restrict__ out,
                                                            int S, int K, int H) {
  const std::int64_t row = blockIdx.x;
  const std::int64_t b = row / K;
  const T* src = kept + row * H;
  const T* plus = add ? add + row * H : nullptr;
  T* dst = out + (b * S + idx[row]) * H;
  row_move<T, kVec>(dst, src, plus, H);
}

// One block per row of out ([B, S]): the row's kept slot by a binary search of its sequence's
// ascending indices (every thread runs the same few loads), then a copy of the input row or the
// kept row (plus `add`).
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) merge_kernel(const T* __restrict__ x, const T* __restrict__ kept,
                                                          const T* __restrict__ add,
                                                          const std::int32_t* __restrict__ idx, T* __restrict__ out,
                                                          int S, int K, int H) {
  const std::int64_t row = blockIdx.x;  // b * S + p
  const std::int64_t b = row / S;
  const int p = int(row - b * S);
  const std::int32_t* ib = idx + b * K;
  int lo = 0, hi = K;  // the first j with ib[j] >= p
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (ib[mid] < p) lo = mid + 1;
    else hi = mid;
  }
  T* dst = out + row * H;
  if (lo == K || ib[lo] != p) {  // dropped: the token bypasses the block
    row_move<T, kVec>(dst, x + row * H, nullptr, H);
    return;
  }
  const std::int64_t kr = b * K + lo;
  const T* src = kept + kr * H;
  const T* plus = add ? add + kr * H : nullptr;
  row_move<T, kVec>(dst, src, plus, H);
}

void check_shape(const char* fn, int B, int S, int K, int hidden) {
  CUTRAIN_CHECK(B > 0 && S > 0 && K > 0 && hidden > 0, fn, ": B, S, K and hidden must be > 0, got B=", B, " S=", S,
                " K=", K, " hidden=", hidden);
  CUTRAIN_CHECK(K <= S, fn, ": K (kept tokens) must be at most S, got K=", K, " S=", S);
}

bool vec_ok(int hidden, std::initializer_list<const void*> ptrs) {
  if (hidden % kBf16PerVec != 0) return false;
  for (const void* p : ptrs)
    if (p && !is_aligned16(p)) return false;
  return true;
}

}  // namespace

template <typename T>
void token_gather(cudaStream_t s, const T* x, const std::int32_t* idx, T* kept, int B, int S, int K, int hidden) {
  check_shape("token_gather", B, S, K, hidden);
  CUTRAIN_CHECK(x && idx && kept, "token_gather: x, idx and kept must be non-null");
  NvtxRange range("token_gather");
  const unsigned rows = unsigned(std::int64_t(B) * K);
  if (vec_ok(hidden, {x, kept})) gather_kernel<T, 8><<<rows, kThreads, 0, s>>>(x, idx, kept, S, K, hidden);
  else gather_kernel<T, 1><<<rows, kThreads, 0, s>>>(x, idx, kept, S, K, hidden);
  CUTRAIN_LAUNCH_CHECK("gather_kernel");
}

template <typename T>
void token_scatter(cudaStream_t s, const T* kept, const nondeduced_t<T>* add, const std::int32_t* idx, T* out, int B, int S,
                   int K, int hidden) {
  check_shape("token_scatter", B, S, K, hidden);
  CUTRAIN_CHECK(kept && idx && out, "token_scatter: kept, idx and out must be non-null");
  NvtxRange range("token_scatter");
  const unsigned rows = unsigned(std::int64_t(B) * K);
  if (vec_ok(hidden, {kept, add, out})) scatter_kernel<T, 8><<<rows, kThreads, 0, s>>>(kept, add, idx, out, S, K, hidden);
  else scatter_kernel<T, 1><<<rows, kThreads, 0, s>>>(kept, add, idx, out, S, K, hidden);
  CUTRAIN_LAUNCH_CHECK("scatter_kernel");
}

template <typename T>
void token_merge(cudaStream_t s, const T* x, const T* kept, const nondeduced_t<T>* add, const std::int32_t* idx, T* out,
                 int B, int S, int K, int hidden) {
  check_shape("token_merge", B, S, K, hidden);
  CUTRAIN_CHECK(x && kept && idx && out, "token_merge: x, kept, idx and out must be non-null");
  CUTRAIN_CHECK(out != x && out != kept && out != add, "token_merge: out must be a buffer of its own (not x, kept or add)");
  NvtxRange range("token_merge");
  const unsigned rows = unsigned(std::int64_t(B) * S);
  if (vec_ok(hidden, {x, kept, add, out})) merge_kernel<T, 8><<<rows, kThreads, 0, s>>>(x, kept, add, idx, out, S, K, hidden);
  else merge_kernel<T, 1><<<rows, kThreads, 0, s>>>(x, kept, add, idx, out, S, K, hidden);
  CUTRAIN_LAUNCH_CHECK("merge_kernel");
}

template void token_gather<bf16>(cudaStream_t, const bf16*, const std::int32_t*, bf16*, int, int, int, int);
template void token_scatter<bf16>(cudaStream_t, const bf16*, const bf16*, const std::int32_t*, bf16*, int, int, int, int);
template void token_gather<f16>(cudaStream_t, const f16*, const std::int32_t*, f16*, int, int, int, int);
template void token_scatter<f16>(cudaStream_t, const f16*, const f16*, const std::int32_t*, f16*, int, int, int, int);
template void token_merge<bf16>(cudaStream_t, const bf16*, const bf16*, const bf16*, const std::int32_t*, bf16*, int, int,
                                int, int);
template void token_merge<f16>(cudaStream_t, const f16*, const f16*, const f16*, const std::int32_t*, f16*, int, int, int,
                               int);

}  // namespace cutrain::kernels
