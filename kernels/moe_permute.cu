// @brief The permutation kernels of kernels/moe_permute.cuh: one block per token; each thread
// moves 16-byte vectors of 8 bf16 when the rows allow it (hidden % 8 == 0, 16-byte aligned bases),
// single elements otherwise (the template flag kVec). The weight gradient's dot products reduce
// over the block in a fixed order.
#include "kernels/moe_permute.cuh"

#include <initializer_list>

#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxK = 2;

// The rows of token s's kept routes in the permuted buffer (-1 when dropped).
__device__ __forceinline__ void rows_of(const MoeRouting& rt, int s, std::int64_t row[kMaxK]) {
  for (int r = 0; r < rt.k; ++r) {
    const int at = s * rt.k + r;
    const int pos = rt.position[at];
    if (pos < 0) row[r] = -1;
    else if (rt.slots > 0) row[r] = std::int64_t(rt.expert[at]) * rt.slots + pos;
    else row[r] = std::int64_t(rt.offsets[rt.expert[at]]) + pos;
  }
}

// kVec: elements per access (8: one 16-byte vector, 1: scalar).
template <int kVec>
__device__ __forceinline__ void load(const bf16* p, float f[kVec]) {
  if constexpr (kVec == 8) load_bf16x8(p, f);
  else f[0] = __bfloat162float(*p);
}
template <int kVec>
__device__ __forceinline__ void store(bf16* p, const float f[kVec]) {
  if constexpr (kVec == 8) store_bf16x8(p, f);
  else *p = __float2bfloat16_rn(f[0]);
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) permute_kernel(const bf16* __restrict__ x, MoeRouting rt,
                                                            bf16* __restrict__ xp, int H) {
  const int s = blockIdx.x;
  std::int64_t row[kMaxK];
  rows_of(rt, s, row);
  const bf16* src = x + std::int64_t(s) * H;
  for (int c = threadIdx.x * kVec; c < H; c += kThreads * kVec) {
    float f[kVec];
    load<kVec>(src + c, f);
    for (int r = 0; r < rt.k; ++r)
      if (row[r] >= 0) store<kVec>(xp + row[r] * H + c, f);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) permute_backward_kernel(const bf16* __restrict__ dxp, MoeRouting rt,
                                                                     bf16* __restrict__ dx, int H, bool accumulate) {
  const int s = blockIdx.x;
  std::int64_t row[kMaxK];
  rows_of(rt, s, row);
  bf16* dst = dx + std::int64_t(s) * H;
  for (int c = threadIdx.x * kVec; c < H; c += kThreads * kVec) {
    float acc[kVec];
    if (accumulate) load<kVec>(dst + c, acc);
    else
      for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
    for (int r = 0; r < rt.k; ++r) {
      if (row[r] < 0) continue;
      float f[kVec];
      load<kVec>(dxp + row[r] * H + c, f);
      for (int j = 0; j < kVec; ++j) acc[j] += f[j];
    }
    store<kVec>(dst + c, acc);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) unpermute_kernel(const bf16* __restrict__ yp,
                                                              const float* __restrict__ weight, MoeRouting rt,
                                                              bf16* __restrict__ y, int H) {
  const int s = blockIdx.x;
  std::int64_t row[kMaxK];
  rows_of(rt, s, row);
  float w[kMaxK];
  for (int r = 0; r < rt.k; ++r) w[r] = weight[s * rt.k + r];
  for (int c = threadIdx.x * kVec; c < H; c += kThreads * kVec) {
    float acc[kVec];
    for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
    for (int r = 0; r < rt.k; ++r) {
      if (row[r] < 0) continue;
      float f[kVec];
      load<kVec>(yp + row[r] * H + c, f);
      for (int j = 0; j < kVec; ++j) acc[j] += w[r] * f[j];
    }
    store<kVec>(y + std::int64_t(s) * H + c, acc);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) unpermute_backward_kernel(const bf16* __restrict__ dy,
                                                                       const bf16* __restrict__ yp,
                                                                       const float* __restrict__ weight,
                                                                       MoeRouting rt, bf16* __restrict__ dyp,
                                                                       float* __restrict__ dweight, int H) {
  __shared__ float red[32];
  const int s = blockIdx.x;
  std::int64_t row[kMaxK];
  rows_of(rt, s, row);
  float w[kMaxK], dot[kMaxK] = {0.f, 0.f};
  for (int r = 0; r < rt.k; ++r) w[r] = weight[s * rt.k + r];
  for (int c = threadIdx.x * kVec; c < H; c += kThreads * kVec) {
    float g[kVec];
    load<kVec>(dy + std::int64_t(s) * H + c, g);
    for (int r = 0; r < rt.k; ++r) {
      if (row[r] < 0) continue;
      float f[kVec], o[kVec];
      load<kVec>(yp + row[r] * H + c, f);
      for (int j = 0; j < kVec; ++j) {
        dot[r] += g[j] * f[j];
        o[j] = w[r] * g[j];
      }
      store<kVec>(dyp + row[r] * H + c, o);
    }
  }
  for (int r = 0; r < rt.k; ++r) {
    const float d = block_sum(dot[r], red);  // every thread takes part (row[r] is block-uniform)
    if (threadIdx.x == 0) dweight[s * rt.k + r] = row[r] >= 0 ? d : 0.f;
  }
}

// One block per slot row: a row past its expert's kept count gets zeros (16-byte stores where
// the rows allow).
template <int kVec>
__global__ void __launch_bounds__(kThreads) zero_empty_slots_kernel(bf16* __restrict__ buf,
                                                                     const std::int32_t* __restrict__ kept,
                                                                     int capacity, int W) {
  const int e = blockIdx.x / capacity, j = blockIdx.x % capacity;
  if (j < kept[e]) return;
  bf16* row = buf + std::int64_t(blockIdx.x) * W;
  const float zero[kVec] = {};
  for (int c = threadIdx.x * kVec; c < W; c += kThreads * kVec) store<kVec>(row + c, zero);
}

void check_routing(const char* fn, const MoeRouting& rt, int hidden) {
  CUTRAIN_CHECK(rt.tokens > 0 && hidden > 0, fn, ": tokens and hidden must be > 0, got tokens=", rt.tokens,
                " hidden=", hidden);
  CUTRAIN_CHECK(rt.k == 1 || rt.k == 2, fn, ": k must be 1 or 2, got ", rt.k);
  CUTRAIN_CHECK(rt.slots >= 0, fn, ": slots must be >= 0, got ", rt.slots);
  CUTRAIN_CHECK(rt.expert && rt.position && (rt.offsets || rt.slots > 0), fn,
                ": the routing (expert, position, and offsets unless slots > 0) must be set");
}

// The vector path needs every row start 16-byte aligned: hidden % 8 == 0 and aligned bases.
bool vec_ok(int hidden, std::initializer_list<const void*> ptrs) {
  if (hidden % kBf16PerVec != 0) return false;
  for (const void* p : ptrs)
    if (p && !is_aligned16(p)) return false;
  return true;
}

}  // namespace

void moe_permute(cudaStream_t s, const bf16* x, const MoeRouting& rt, bf16* xp, int hidden) {
  check_routing("moe_permute", rt, hidden);
  CUTRAIN_CHECK(x && xp, "moe_permute: x and xp must be non-null");
  NvtxRange range("moe_permute");
  if (vec_ok(hidden, {x, xp})) permute_kernel<8><<<rt.tokens, kThreads, 0, s>>>(x, rt, xp, hidden);
  else permute_kernel<1><<<rt.tokens, kThreads, 0, s>>>(x, rt, xp, hidden);
  CUTRAIN_LAUNCH_CHECK("permute_kernel");
}

void moe_permute_backward(cudaStream_t s, const bf16* dxp, const MoeRouting& rt, bf16* dx, int hidden,
                          bool accumulate) {
  check_routing("moe_permute_backward", rt, hidden);
  CUTRAIN_CHECK(dxp && dx, "moe_permute_backward: dxp and dx must be non-null");
  NvtxRange range("moe_permute_bwd");
  if (vec_ok(hidden, {dxp, dx}))
    permute_backward_kernel<8><<<rt.tokens, kThreads, 0, s>>>(dxp, rt, dx, hidden, accumulate);
  else permute_backward_kernel<1><<<rt.tokens, kThreads, 0, s>>>(dxp, rt, dx, hidden, accumulate);
  CUTRAIN_LAUNCH_CHECK("permute_backward_kernel");
}

void moe_unpermute(cudaStream_t s, const bf16* yp, const float* weight, const MoeRouting& rt, bf16* y, int hidden) {
  check_routing("moe_unpermute", rt, hidden);
  CUTRAIN_CHECK(yp && weight && y, "moe_unpermute: yp, weight and y must be non-null");
  NvtxRange range("moe_unpermute");
  if (vec_ok(hidden, {yp, y})) unpermute_kernel<8><<<rt.tokens, kThreads, 0, s>>>(yp, weight, rt, y, hidden);
  else unpermute_kernel<1><<<rt.tokens, kThreads, 0, s>>>(yp, weight, rt, y, hidden);
  CUTRAIN_LAUNCH_CHECK("unpermute_kernel");
}

void moe_unpermute_backward(cudaStream_t s, const bf16* dy, const bf16* yp, const float* weight,
                            const MoeRouting& rt, bf16* dyp, float* dweight, int hidden) {
  check_routing("moe_unpermute_backward", rt, hidden);
  CUTRAIN_CHECK(dy && yp && weight && dyp && dweight, "moe_unpermute_backward: every pointer must be non-null");
  NvtxRange range("moe_unpermute_bwd");
  if (vec_ok(hidden, {dy, yp, dyp}))
    unpermute_backward_kernel<8><<<rt.tokens, kThreads, 0, s>>>(dy, yp, weight, rt, dyp, dweight, hidden);
  else unpermute_backward_kernel<1><<<rt.tokens, kThreads, 0, s>>>(dy, yp, weight, rt, dyp, dweight, hidden);
  CUTRAIN_LAUNCH_CHECK("unpermute_backward_kernel");
}

void moe_zero_empty_slots(cudaStream_t s, bf16* buf, const std::int32_t* kept, int experts, int capacity, int width) {
  CUTRAIN_CHECK(experts > 0 && capacity > 0 && width > 0, "moe_zero_empty_slots: experts, capacity and width must be "
                "> 0, got experts=", experts, " capacity=", capacity, " width=", width);
  CUTRAIN_CHECK(std::int64_t(experts) * capacity <= 0x7fffffff, "moe_zero_empty_slots: experts x capacity = ",
                std::int64_t(experts) * capacity, " rows is more than one launch's 2^31 - 1 blocks");
  CUTRAIN_CHECK(buf && kept, "moe_zero_empty_slots: buf and kept must be non-null");
  NvtxRange range("moe_zero_empty_slots");
  const unsigned blocks = unsigned(experts) * unsigned(capacity);
  if (vec_ok(width, {buf})) zero_empty_slots_kernel<8><<<blocks, kThreads, 0, s>>>(buf, kept, capacity, width);
  else zero_empty_slots_kernel<1><<<blocks, kThreads, 0, s>>>(buf, kept, capacity, width);
  CUTRAIN_LAUNCH_CHECK("zero_empty_slots_kernel");
}

}  // namespace cutrain::kernels
