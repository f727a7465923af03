// @brief Internal to the attention family: the cp.async tile loaders, the warp-level tensor-core
// products every attention kernel is built from, the per-(batch, head) slices and the launchers.
//   warp_abt: acc[16 x 8*NT] = A[16 x D] * B[8*NT x D]^T   (A, B row-major in shared memory)
//   warp_pb:  acc[16 x D]   += P[16 x K] * B[K x D]        (P already in A-fragment registers)
// Shared-memory rows are padded to D+8 bf16 (a 16-byte skew per row), so the 8 row addresses of
// every ldmatrix phase fall in 8 different 16-byte bank groups: conflict-free without swizzling.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention.cuh"
#include "kernels/attention_tile_size.h"
#include "kernels/common/mma_sm80.cuh"

namespace cutrain::kernels::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
constexpr int ld() { return D + 8; }  // shared-memory row stride, elements

// Zeroes a fragment array of any shape.
__device__ __forceinline__ void zero(float& x) { x = 0.f; }
template <typename T, int N>
__device__ __forceinline__ void zero(T (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) zero(a[i]);
}

// One (batch, head)'s slices of qkv [B, S, 3, H, D]: rows `tok` elements apart; `otok` = H*D, the
// row stride of [B, S, H, D] tensors (out, dout) and the distance from q to k to v.
template <int D>
struct QkvSlices {
  std::size_t tok, otok, qoff;
  const bf16 *q, *k, *v;
  __device__ __forceinline__ QkvSlices(const bf16* qkv, int b, int head, int S, int H)
      : tok(3ull * H * D),
        otok(static_cast<std::size_t>(H) * D),
        qoff(static_cast<std::size_t>(b) * S * tok + static_cast<std::size_t>(head) * D),
        q(qkv + qoff),
        k(q + otok),
        v(k + otok) {}
};

// The (batch, head) row of an fp32 [B, H, S] vector (lse, rowsum(dO o O)).
template <typename T>
__device__ __forceinline__ T* head_vector(T* v, int b, int head, int S, int H) {
  return v + (static_cast<std::size_t>(b) * H + head) * S;
}

// The backward passes' slices: QkvSlices, dO's rows ([B, S, H, D], row stride otok) and the
// (batch, head) rows of lse and Dvec.
template <int D>
struct BwdSlices : QkvSlices<D> {
  const bf16* dout;
  const float *lse, *dvec;
  __device__ __forceinline__ BwdSlices(const bf16* qkv, const bf16* dout_all, const float* lse_all,
                                       const float* dvec_all, int b, int head, int S, int H)
      : QkvSlices<D>(qkv, b, head, S, H),
        dout(dout_all + static_cast<std::size_t>(b) * S * this->otok + static_cast<std::size_t>(head) * D),
        lse(head_vector(lse_all, b, head, S, H)),
        dvec(head_vector(dvec_all, b, head, S, H)) {}
};

// Copies rows [row0, row0+ROWS) of a [S, D] slice whose rows lie `stride` elements apart into
// shared memory (row stride ld<D>()); rows at or past S become zeros. THREADS: the CTA's size.
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_rows(bf16* smem, const bf16* g, int row0, int S, std::size_t stride) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert((ROWS * kChunks) % THREADS == 0, "tile must split evenly over the CTA");
#pragma unroll
  for (int i = 0; i < ROWS * kChunks / THREADS; ++i) {
    const int idx = threadIdx.x + i * THREADS;
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = row0 + r < S;
    const bf16* src = valid ? g + static_cast<std::size_t>(row0 + r) * stride + c * 8 : g;
    mma::cp_async_16(mma::smem_addr(smem + r * ld<D>() + c * 8), src, valid);
  }
}

// Step j of a K/V stream of n_tiles tiles of BN rows through the double buffers sK, sV
// ([2][BN][ld] each; tile 0 already issued): issues tile j+1 into the other buffer, waits for tile
// j, then syncs the CTA. Tile j lies in buffer j & 1.
template <int D, int BN, int THREADS>
__device__ __forceinline__ void kv_stream_step(bf16* sK, bf16* sV, const bf16* gk, const bf16* gv, int j, int n_tiles,
                                               int S, std::size_t tok) {
  const int n0 = j * BN;
  if (j + 1 < n_tiles) {
    const int nb = (j + 1) & 1;
    load_rows<D, BN, THREADS>(sK + nb * BN * ld<D>(), gk, n0 + BN, S, tok);
    load_rows<D, BN, THREADS>(sV + nb * BN * ld<D>(), gv, n0 + BN, S, tok);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
  } else {
    mma::cp_async_wait<0>();
  }
  __syncthreads();
}

// acc = A[a_row0 .. a_row0+16, 0..D) * B[0 .. 8*NT, 0..D)^T.
template <int D, int NT>
__device__ __forceinline__ void warp_abt(float (&acc)[NT][4], const bf16* sA, int a_row0, const bf16* sB) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs (one ldmatrix.x4 feeds two mma)");
  const int lane = threadIdx.x & 31;
  zero(acc);
  // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
  const std::uint32_t a_addr = mma::smem_addr(sA + (a_row0 + (lane & 15)) * ld<D>() + (lane >> 4) * 8);
  // B (rows are the n index): (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
  const std::uint32_t b_addr =
      mma::smem_addr(sB + ((lane & 7) + (lane >> 4) * 8) * ld<D>() + ((lane >> 3) & 1) * 8);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    std::uint32_t a[4];
    mma::ldmatrix_x4(a, a_addr + kk * 32);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      std::uint32_t b[4];
      mma::ldmatrix_x4(b, b_addr + (np * 16 * ld<D>() + kk * 16) * 2);
      mma::mma_bf16_16816(acc[2 * np], a, b[0], b[1]);
      mma::mma_bf16_16816(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc += P * B[0..K, 0..D), P given as K/16 A fragments.
template <int D, int K>
__device__ __forceinline__ void warp_pb(float (&acc)[D / 8][4], const std::uint32_t (&p)[K / 16][4], const bf16* sB) {
  const int lane = threadIdx.x & 31;
  // Transposed B: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
  const std::uint32_t b_addr =
      mma::smem_addr(sB + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld<D>() + (lane >> 4) * 8);
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks)
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      std::uint32_t b[4];
      mma::ldmatrix_x4_trans(b, b_addr + (ks * 16 * ld<D>() + dp * 16) * 2);
      mma::mma_bf16_16816(acc[2 * dp], p[ks], b[0], b[1]);
      mma::mma_bf16_16816(acc[2 * dp + 1], p[ks], b[2], b[3]);
    }
}

// C fragments of a 16 x K fp32 tile -> K/16 bf16 A fragments (n-tiles 2j, 2j+1 form k-slice j).
template <int K>
__device__ __forceinline__ void to_a_frags(std::uint32_t (&p)[K / 16][4], const float (&c)[K / 8][4]) {
#pragma unroll
  for (int j = 0; j < K / 16; ++j) {
    p[j][0] = mma::pack_bf16(c[2 * j][0], c[2 * j][1]);
    p[j][1] = mma::pack_bf16(c[2 * j][2], c[2 * j][3]);
    p[j][2] = mma::pack_bf16(c[2 * j + 1][0], c[2 * j + 1][1]);
    p[j][3] = mma::pack_bf16(c[2 * j + 1][2], c[2 * j + 1][3]);
  }
}

// Writes a warp's 16 x D fp32 accumulator (times `mul`) as bf16 rows row0.. of a slice with row
// stride `stride`; rows at or past S are skipped.
template <int D>
__device__ __forceinline__ void store_rows(bf16* g, const float (&acc)[D / 8][4], int row0, int S, std::size_t stride,
                                           float mul) {
  const int lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + gi + 8 * h;
    if (row >= S) continue;
    bf16* dst = g + static_cast<std::size_t>(row) * stride + 2 * t;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<std::uint32_t*>(dst + dt * 8) = mma::pack_bf16(acc[dt][2 * h] * mul, acc[dt][2 * h + 1] * mul);
  }
}

// Shape validation shared by the launchers (throws cutrain::Error naming what is wrong).
void check_shape(const AttentionShape& shape, const char* who);

// Backward passes (kernels/attention_bwd_dkdv.cu, kernels/attention_bwd_dq.cu), head_dim D and
// causal or not per `shape`. dvec: rowsum(dO o O), fp32 [B, H, S].
// dK/dV: dqkv's k and v slots; with a non-null dq_acc (the fast mode) it also adds dS K, unscaled,
// into that fp32 [B, S, H, D] accumulator with atomics.
void dkdv(cudaStream_t s, const bf16* qkv, const bf16* dout, const float* lse, const float* dvec, bf16* dqkv,
          float* dq_acc, const AttentionShape& shape);
// dQ (the deterministic mode): dqkv's q slot.
void dq(cudaStream_t s, const bf16* qkv, const bf16* dout, const float* lse, const float* dvec, bf16* dqkv,
        const AttentionShape& shape);

}  // namespace cutrain::kernels::attn
