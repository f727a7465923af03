// @brief Token + position embedding forward and deterministic backward (see embedding.cuh).
//
// Backward without float atomics: the (token, position) pairs are sorted by token with CUB's
// stable radix sort (part of the CUDA toolkit), so positions of one token come out in ascending
// order; one warp per distinct token then sums its dout rows in that order and writes the dwte
// row once. dwpe is a column reduction over the batch in b order. Same bits every run.
//
// Vector path: C % 8 == 0 and 16-byte aligned tables and activations; otherwise scalar kernels.
#include "kernels/embedding.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {
namespace {

// The tile of every kernel here: threads per block, the grid-stride cap on blocks, and for dwte
// the vectors of 8 per lane per column chunk (1024 columns per warp pass over a token's run).
struct EmbTile {
  static constexpr int kThreads = 256, kGridCap = 132 * 16, kWarpVecs = 4;
};
constexpr int kThreads = EmbTile::kThreads;
constexpr int kGridCap = EmbTile::kGridCap;

int grid_for(std::size_t items) {
  return static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(ceil_div<std::size_t>(items, kThreads), kGridCap)));
}

// Records flat index `i` as bad: *status becomes min over bad indices of (i + 1); 0 means none.
__device__ void report_bad(int* status, int i) {
  if (!status) return;
  const int want = i + 1;
  int old = atomicAdd(status, 0);
  while (old == 0 || old > want) {
    const int prev = atomicCAS(status, old, want);
    if (prev == old) break;
    old = prev;
  }
}

template <typename TS, bool kVec>
__global__ void __launch_bounds__(kThreads)
    emb_fwd(const int32_t* __restrict__ tokens, const TS* __restrict__ wte, const TS* __restrict__ wpe,
            TS* __restrict__ out, int N, int T, int C, int vocab, int* status) {
  constexpr int kW = kVec ? kBf16PerVec : 1;  // elements per work item
  const int per_row = C / kW;
  const std::size_t items = static_cast<std::size_t>(N) * per_row;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t w = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < items; w += stride) {
    const int i = static_cast<int>(w / per_row);
    const int c = static_cast<int>(w % per_row) * kW;
    const int tok = tokens[i];
    const int t = i % T;
    const std::size_t o = static_cast<std::size_t>(i) * C + c;
    const bool ok = tok >= 0 && tok < vocab;
    if (!ok && c == 0) report_bad(status, i);
    if constexpr (kVec) {
      float a[8], b[8];
      if (ok) {
        load_x8<TS, Load::ReadOnly>(wte + static_cast<std::size_t>(tok) * C + c, a);
        load_x8<TS, Load::ReadOnly>(wpe + static_cast<std::size_t>(t) * C + c, b);
#pragma unroll
        for (int k = 0; k < 8; ++k) a[k] += b[k];
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) a[k] = 0.f;
      }
      store_x8(out + o, a);
    } else {
      float v = 0.f;
      if (ok)
        v = to_f32(wte[static_cast<std::size_t>(tok) * C + c]) +
            to_f32(wpe[static_cast<std::size_t>(t) * C + c]);
      out[o] = from_f32<TS>(v);
    }
  }
}

// Sort input: key = token id, or `vocab` (sorts last, ignored) when out of range; value = position.
__global__ void __launch_bounds__(kThreads)
    emb_sort_input(const int32_t* __restrict__ tokens, uint32_t* __restrict__ keys, int32_t* __restrict__ vals,
                   int N, int vocab) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
    const int tok = tokens[i];
    keys[i] = (tok >= 0 && tok < vocab) ? static_cast<uint32_t>(tok) : static_cast<uint32_t>(vocab);
    vals[i] = i;
  }
}

// One warp per sorted index; the warp at the head of a run of equal tokens sums that run's dout
// rows in (ascending position) order and writes dwte[token] once.
template <class Tile, bool kVec, typename TS, typename TG>
__global__ void __launch_bounds__(Tile::kThreads)
    emb_bwd_wte(const TS* __restrict__ dout, const uint32_t* __restrict__ keys, const int32_t* __restrict__ pos,
                TG* __restrict__ dwte, bool accumulate, int N, int C, int vocab) {
  const int lane = threadIdx.x % kWarpSize;
  const int i = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (i >= N) return;
  const uint32_t key = keys[i];
  if (key >= static_cast<uint32_t>(vocab) || (i > 0 && keys[i - 1] == key)) return;
  int end = i + 1;
  while (end < N && keys[end] == key) ++end;
  TG* dst = dwte + static_cast<std::size_t>(key) * C;
  constexpr int kW = kVec ? kBf16PerVec : 1, kWarpVecs = Tile::kWarpVecs;
  constexpr int kChunk = kWarpVecs * kWarpSize * kW;  // columns per pass over the run
  for (int c0 = 0; c0 < C; c0 += kChunk) {
    float acc[kWarpVecs][kW];
#pragma unroll
    for (int v = 0; v < kWarpVecs; ++v)
#pragma unroll
      for (int k = 0; k < kW; ++k) acc[v][k] = 0.f;
    for (int j = i; j < end; ++j) {
      const TS* src = dout + static_cast<std::size_t>(pos[j]) * C;
#pragma unroll
      for (int v = 0; v < kWarpVecs; ++v) {
        const int c = c0 + (v * kWarpSize + lane) * kW;
        if (c < C) {
          if constexpr (kVec) {
            float d[8];
            load_x8<TS, Load::Streaming>(src + c, d);
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[v][k] += d[k];
          } else {
            acc[v][0] += to_f32(src[c]);
          }
        }
      }
    }
#pragma unroll
    for (int v = 0; v < kWarpVecs; ++v) {
      const int c = c0 + (v * kWarpSize + lane) * kW;
      if (c < C) {
#pragma unroll
        for (int k = 0; k < kW; ++k) {
          float r = acc[v][k];
          if (accumulate) r += to_f32(dst[c + k]);
          dst[c + k] = from_f32<TG>(r);
        }
      }
    }
  }
}

// dwpe[t, c] (+)= Σ_b dout[b, t, c], b in order. One thread per (t, c) element.
template <typename TS, typename TG>
__global__ void __launch_bounds__(kThreads)
    emb_bwd_wpe(const TS* __restrict__ dout, TG* __restrict__ dwpe, bool accumulate, int B, int T, int C) {
  const std::size_t items = static_cast<std::size_t>(T) * C;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t e = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < items; e += stride) {
    float acc = 0.f;
    for (int b = 0; b < B; ++b) acc += to_f32(dout[static_cast<std::size_t>(b) * items + e]);
    if (accumulate) acc += to_f32(dwpe[e]);
    dwpe[e] = from_f32<TG>(acc);
  }
}

// Byte offsets of the backward's scratch pieces (each 256-byte aligned).
struct ScratchLayout {
  std::size_t keys_in, keys_out, vals_in, vals_out, temp, temp_bytes, total;
};
std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }
int sort_end_bit(int vocab) {
  int bits = 1;
  while (bits < 31 && (1u << bits) <= static_cast<unsigned>(vocab)) ++bits;  // keys go up to vocab
  return bits;
}
ScratchLayout scratch_layout(int N, int vocab) {
  ScratchLayout l{};
  const std::size_t arr = align256(static_cast<std::size_t>(N) * 4);
  l.keys_in = 0;
  l.keys_out = arr;
  l.vals_in = 2 * arr;
  l.vals_out = 3 * arr;
  l.temp = 4 * arr;
  CUTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, l.temp_bytes, static_cast<const uint32_t*>(nullptr),
                                                     static_cast<uint32_t*>(nullptr),
                                                     static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), N, 0, sort_end_bit(vocab)));
  l.total = l.temp + align256(l.temp_bytes);
  return l;
}

void check_shapes(const char* what, int B, int T, int C, int vocab) {
  CUTRAIN_CHECK(B > 0 && T > 0 && C > 0 && vocab > 0, what, ": B, T, C and vocab must be positive, got B=", B,
                " T=", T, " C=", C, " vocab=", vocab);
  CUTRAIN_CHECK(static_cast<long long>(B) * T < (1ll << 31) && static_cast<long long>(vocab) < (1ll << 30), what,
                ": B*T must be < 2^31 and vocab < 2^30, got B*T=", static_cast<long long>(B) * T, " vocab=", vocab);
}

template <typename TS, typename TG>
void launch_backward(cudaStream_t s, const TS* dout, const int32_t* tokens, TG* dwte, TG* dwpe, bool accumulate,
                     int B, int T, int C, int vocab, void* scratch) {
  const int N = B * T;
  const ScratchLayout l = scratch_layout(N, vocab);
  char* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<uint32_t*>(base + l.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + l.keys_out);
  auto* vals_in = reinterpret_cast<int32_t*>(base + l.vals_in);
  auto* vals_out = reinterpret_cast<int32_t*>(base + l.vals_out);

  emb_sort_input<<<grid_for(N), kThreads, 0, s>>>(tokens, keys_in, vals_in, N, vocab);
  CUTRAIN_LAUNCH_CHECK("emb_sort_input");
  std::size_t temp_bytes = l.temp_bytes;
  CUTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + l.temp, temp_bytes, keys_in, keys_out, vals_in, vals_out,
                                                     N, 0, sort_end_bit(vocab), s));
  if (!accumulate)
    CUTRAIN_CUDA_CHECK(cudaMemsetAsync(dwte, 0, static_cast<std::size_t>(vocab) * C * sizeof(TG), s));

  const bool vec = C % kBf16PerVec == 0 && is_aligned16(dout) && is_aligned16(dwte);
  const int warps_per_block = kThreads / kWarpSize;
  const int blocks = ceil_div(N, warps_per_block);
  if (vec)
    emb_bwd_wte<EmbTile, true, TS, TG><<<blocks, kThreads, 0, s>>>(dout, keys_out, vals_out, dwte, accumulate, N, C, vocab);
  else
    emb_bwd_wte<EmbTile, false, TS, TG><<<blocks, kThreads, 0, s>>>(dout, keys_out, vals_out, dwte, accumulate, N, C,
                                                                vocab);
  CUTRAIN_LAUNCH_CHECK("emb_bwd_wte");
  emb_bwd_wpe<TS, TG><<<grid_for(static_cast<std::size_t>(T) * C), kThreads, 0, s>>>(dout, dwpe, accumulate, B, T, C);
  CUTRAIN_LAUNCH_CHECK("emb_bwd_wpe");
}

}  // namespace

template <typename TS>
void embedding_forward(cudaStream_t s, const int32_t* tokens, const TS* wte, const nondeduced_t<TS>* wpe, TS* out, int B,
                       int T, int C, int vocab, int* status) {
  check_shapes("embedding_forward", B, T, C, vocab);
  CUTRAIN_CHECK(tokens && wte && wpe && out, "embedding_forward: tokens, wte, wpe and out must be non-null");
  if (status) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(status, 0, sizeof(int), s));
  const int N = B * T;
  const bool vec = C % kBf16PerVec == 0 && is_aligned16(wte) && is_aligned16(wpe) && is_aligned16(out);
  if (vec) {
    emb_fwd<TS, true><<<grid_for(static_cast<std::size_t>(N) * (C / kBf16PerVec)), kThreads, 0, s>>>(
        tokens, wte, wpe, out, N, T, C, vocab, status);
  } else {
    emb_fwd<TS, false><<<grid_for(static_cast<std::size_t>(N) * C), kThreads, 0, s>>>(tokens, wte, wpe, out, N, T, C,
                                                                                  vocab, status);
  }
  CUTRAIN_LAUNCH_CHECK("emb_fwd");
}

std::size_t embedding_backward_scratch_bytes(int B, int T, int C, int vocab) {
  check_shapes("embedding_backward_scratch_bytes", B, T, C, vocab);
  return scratch_layout(B * T, vocab).total;
}

template <typename TS>
void embedding_backward(cudaStream_t s, const TS* dout, const int32_t* tokens, void* dwte, void* dwpe,
                        DType grad_type, bool accumulate, int B, int T, int C, int vocab, void* scratch) {
  check_shapes("embedding_backward", B, T, C, vocab);
  CUTRAIN_CHECK(dout && tokens && dwte && dwpe && scratch,
                "embedding_backward: dout, tokens, dwte, dwpe and scratch must be non-null");
  CUTRAIN_CHECK(is_aligned16(scratch), "embedding_backward: scratch must be 16-byte aligned");
  if (grad_type == DType::F32) {
    launch_backward<TS, float>(s, dout, tokens, static_cast<float*>(dwte), static_cast<float*>(dwpe), accumulate, B, T,
                           C, vocab, scratch);
  } else if (grad_type == DType::BF16) {
    launch_backward<TS, __nv_bfloat16>(s, dout, tokens, static_cast<__nv_bfloat16*>(dwte), static_cast<__nv_bfloat16*>(dwpe),
                                       accumulate, B, T, C, vocab, scratch);
  } else if (grad_type == DType::F16) {
    launch_backward<TS, __half>(s, dout, tokens, static_cast<__half*>(dwte), static_cast<__half*>(dwpe), accumulate,
                                B, T, C, vocab, scratch);
  } else {
    CUTRAIN_FAIL("embedding_backward: gradient tables must be bfloat16, float16 or float32, got ", dtype_name(grad_type));
  }
}

template void embedding_forward<bf16>(cudaStream_t, const int32_t*, const bf16*, const bf16*, bf16*, int, int, int, int,
                                      int*);
template void embedding_backward<bf16>(cudaStream_t, const bf16*, const int32_t*, void*, void*, DType, bool, int, int,
                                       int, int, void*);
template void embedding_forward<f16>(cudaStream_t, const int32_t*, const f16*, const f16*, f16*, int, int, int, int,
                                      int*);
template void embedding_backward<f16>(cudaStream_t, const f16*, const int32_t*, void*, void*, DType, bool, int, int,
                                       int, int, void*);

}  // namespace cutrain::kernels
