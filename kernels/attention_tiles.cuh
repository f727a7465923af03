// @brief Internal to the attention family: tile constants, the cp.async tile loader and the two
// warp-level tensor-core products every attention kernel is built from.
//   warp_abt: acc[16 x 8*NT] = A[16 x D] * B[8*NT x D]^T   (A, B row-major in shared memory)
//   warp_pb:  acc[16 x D]   += P[16 x K] * B[K x D]        (P already in A-fragment registers)
// Shared-memory rows are padded to D+8 bf16 (a 16-byte skew per row), so the 8 row addresses of
// every ldmatrix phase fall in 8 different 16-byte bank groups: conflict-free without swizzling.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention.cuh"
#include "kernels/common/mma_sm80.cuh"

namespace cutrain::kernels::attn {

constexpr int kThreads = 128;  // 4 warps; each warp owns 16 rows of the block's 64
constexpr int kBlock = 64;     // query rows per CTA (forward, dQ) and key rows per CTA (dK/dV)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
constexpr int ld() { return D + 8; }  // shared-memory row stride, elements

// Copies rows [row0, row0+ROWS) of a [S, D] slice whose rows lie `stride` elements apart into
// shared memory (row stride ld<D>()); rows at or past S become zeros. THREADS: the CTA's size.
template <int D, int ROWS, int THREADS = kThreads>
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

// acc = A[a_row0 .. a_row0+16, 0..D) * B[0 .. 8*NT, 0..D)^T.
template <int D, int NT>
__device__ __forceinline__ void warp_abt(float (&acc)[NT][4], const bf16* sA, int a_row0, const bf16* sB) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs (one ldmatrix.x4 feeds two mma)");
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
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

// The kernel variant in force (attention_set_variant / CUTRAIN_ATTN_VARIANT), as an index into
// attention_variant_names(). The enum order is that list's order.
enum class Variant { V1 = 0, V2_M128 = 1, V2_M128N32 = 2, V2_M128W8 = 3, V2_M128K32 = 4 };
Variant current_variant();

// Forward of the v2 variants (kernels/attention_fwd_v2.cu): CTA = WARPS warps x MT m-tiles of 16
// query rows each; K/V tiles of 32 or 64 keys.
void forward_v2(cudaStream_t s, const bf16* qkv, bf16* out, float* lse, const AttentionShape& shape, Variant v);

// Deterministic dQ pass of the v2 variants (kernels/attention_bwd_dq_v2.cu): dqkv's q slot from
// dvec = rowsum(dO o O) (fp32 [B, H, S]); CTA 128 queries, 4 warps x 32 rows, 32-key tiles.
// dK/dV pass of v2_m128k32, D=64 only (kernels/attention_bwd_dkdv_v2.cu): CTA 128 keys, 4 warps x
// 32 keys, 32-query tiles; fast mode only: dq_acc (non-null) gets the fp32 atomics of dS K.
void dkdv_v2(cudaStream_t s, const bf16* qkv, const bf16* dout, const float* lse, const float* dvec, bf16* dqkv,
             float* dq_acc, const AttentionShape& shape);

void dq_v2(cudaStream_t s, const bf16* qkv, const bf16* dout, const float* lse, const float* dvec, bf16* dqkv,
           const AttentionShape& shape);

}  // namespace cutrain::kernels::attn
