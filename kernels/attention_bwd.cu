// @brief Flash-style attention backward: its small passes and the scratch size. The passes, in order
// (kernels/attention_sm90/attention_sm90.h runs them):
//   1. row_dot:  Dvec[i] = sum_d dO[i,d] * O[i,d]                     (fp32 scratch, B*H*S; here)
//   2. dK/dV:    one CTA per 128 keys, walking the query tiles: P^T and dP^T recomputed from
//                lse, dV += P^T dO, dK += dS^T Q             (wgmma: kernels/attention_sm90/bwd.cu)
//   3. dQ:       one CTA per 128 queries, walking the key tiles: dQ += dS K
//                                                                  (wgmma: kernels/attention_sm90/dq.cu)
// Deterministic mode: no atomics, the same bits every run; the price is recomputing Q K^T and
// dO V^T once more in the dQ pass (7 instead of 5 matmuls). Fast mode: step 3 is replaced by
// TMA reduce-adds of dS K from inside the dK/dV pass into an fp32 scratch accumulator (zeroed by
// row_dot), then a conversion (dq_convert, here).
// With P = exp(scale*S - lse), dP = dO V^T, dS = P o (dP - Dvec):
//   dV = P^T dO,  dK = scale * dS^T Q,  dQ = scale * dS K.
// Tile shapes: kernels/attention_sm90/layout.h.
// Options (kernels/attention_options.cuh): masked keys and rows with lse -inf get P = 0; with
// dropout keep mask Z, dV = (P o Z/(1-p))^T dO and dS = P o (dP o Z/(1-p) - Dvec), Dvec unchanged
// (rowsum(dO o O) equals rowsum(P o dL/dP) with the dropout inside O).
#include <cmath>

#include "kernels/attention.cuh"
#include "kernels/attention_options.cuh"
#include "kernels/attention_tiles.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {
namespace attn {
namespace {

// D/8 threads per (token, head) row, 16 bytes of O and of dO each, the row's dot by xor-shuffles
// within those lanes. dq_acc (the fast mode's fp32 accumulator, [B, S, H, D]: the same row order
// as O) is zeroed here where given, 32 bytes a thread, so the reduce-adds need no memset launch.
template <int D, typename E>
__global__ void __launch_bounds__(256) row_dot_kernel(const E* __restrict__ out, const E* __restrict__ dout,
                                                      float* __restrict__ dvec, float* __restrict__ dq_acc, int B,
                                                      int S, int H) {
  constexpr int kLanes = D / 8;  // threads per row
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int part = threadIdx.x % kLanes;
  const bool live = row < static_cast<long long>(B) * S * H;  // every lane stays for the shuffles
  float acc = 0.f;
  if (live) {
    float o[8], d[8];
    load_x8<E, Load::Streaming>(out + row * D + 8 * part, o);
    load_x8<E, Load::Streaming>(dout + row * D + 8 * part, d);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(o[i], d[i], acc);
    if (dq_acc) {
      const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
      store16(dq_acc + row * D + 8 * part, zero);
      store16(dq_acc + row * D + 8 * part + 4, zero);
    }
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (live && part == 0) {
    const long long h = row % H, bs = row / H, s = bs % S, b = bs / S;
    dvec[(b * H + h) * S + s] = acc;
  }
}

// dqkv's q slot = scale * dq_acc (the fast mode's fp32 accumulator, [B, S, H, D]); 8 elements a
// thread: two 16-byte loads, one 16-byte store.
template <int D, typename E>
__global__ void __launch_bounds__(256) dq_convert_kernel(const float* __restrict__ dq_acc, E* __restrict__ dqkv,
                                                         std::size_t rows, int H, float scale) {
  const std::size_t i = (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x) * 8;
  if (i >= rows * D) return;
  const std::size_t row = i / D, d = i % D;  // row = (b*S + s)*H + h
  const std::size_t dst = ((row / H) * 3 * H + row % H) * D + d;
  float v[8];
  load_f32x4<Load::Streaming>(dq_acc + i, v);
  load_f32x4<Load::Streaming>(dq_acc + i + 4, v + 4);
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] *= scale;
  st_global_v4(dqkv + dst, pack_x8<E>(v));  // store_x8's uint4 store is split in four here
}

}  // namespace

std::size_t dvec_bytes(const AttentionShape& sh) {
  const std::size_t n = static_cast<std::size_t>(sh.batch) * sh.heads * sh.seq * sizeof(float);
  return (n + 255) / 256 * 256;
}

template <typename E>
void row_dot(cudaStream_t st, const E* out, const E* dout, float* dvec, const AttentionShape& sh, float* dq_acc) {
  const std::size_t rows = static_cast<std::size_t>(sh.batch) * sh.seq * sh.heads;
  const std::size_t threads = rows * (sh.head_dim / 8);
  const unsigned blocks = static_cast<unsigned>((threads + 255) / 256);
  if (sh.head_dim == 64)
    row_dot_kernel<64, E><<<blocks, 256, 0, st>>>(out, dout, dvec, dq_acc, sh.batch, sh.seq, sh.heads);
  else
    row_dot_kernel<128, E><<<blocks, 256, 0, st>>>(out, dout, dvec, dq_acc, sh.batch, sh.seq, sh.heads);
  CUTRAIN_LAUNCH_CHECK("attention_row_dot_kernel");
}

template <typename E>
void dq_convert(cudaStream_t st, const float* dq_acc, E* dqkv, const AttentionShape& sh) {
  const std::size_t rows = static_cast<std::size_t>(sh.batch) * sh.seq * sh.heads;
  const unsigned blocks = static_cast<unsigned>((rows * sh.head_dim / 8 + 255) / 256);
  const float scale = 1.f / std::sqrt(static_cast<float>(sh.head_dim));
  if (sh.head_dim == 64)
    dq_convert_kernel<64, E><<<blocks, 256, 0, st>>>(dq_acc, dqkv, rows, sh.heads, scale);
  else
    dq_convert_kernel<128, E><<<blocks, 256, 0, st>>>(dq_acc, dqkv, rows, sh.heads, scale);
  CUTRAIN_LAUNCH_CHECK("attention_dq_convert_kernel");
}

template void row_dot<bf16>(cudaStream_t, const bf16*, const bf16*, float*, const AttentionShape&, float*);
template void row_dot<f16>(cudaStream_t, const f16*, const f16*, float*, const AttentionShape&, float*);
template void dq_convert<bf16>(cudaStream_t, const float*, bf16*, const AttentionShape&);
template void dq_convert<f16>(cudaStream_t, const float*, f16*, const AttentionShape&);

}  // namespace attn

std::size_t attention_backward_scratch_bytes(const AttentionShape& shape, bool deterministic) {
  attn::check_shape(shape, "attention_backward_scratch_bytes");
  // Dvec (fp32 B*H*S, rounded up to 256 bytes); the fast mode adds its fp32 dQ accumulator (B*S*H*D).
  const std::size_t acc = static_cast<std::size_t>(shape.batch) * shape.seq * shape.heads * shape.head_dim * 4;
  return attn::dvec_bytes(shape) + (deterministic ? 0 : acc);
}

}  // namespace cutrain::kernels
