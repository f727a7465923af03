// dK/dV pass of the fast-mode backward, variant v2_m128k32 (D=64 only): CTA = 128 keys, 4 warps x
// 32 keys (two m-tiles per warp), walking query tiles of 32: P^T and dP^T recomputed from lse,
// dV += P^T dO, dK += dS^T Q, and dS K added into the fp32 dQ accumulator with atomics (as v1).
// (The same kernel without the atomics, for the deterministic mode, spills 4-40 bytes at 255
// registers, so that mode keeps the 8-warp pass of v2_m128.)
// Why: with 16 keys per warp (v1) every Q/dO fragment read by ldmatrix feeds one mma; with 32 it
// feeds two, cutting the shared-memory reads per FLOP by about a third (the warp's own K/V
// A fragments are still re-read per tile: keeping them would cost 64 registers).
#include <cmath>

#include "kernels/attention.cuh"
#include "kernels/attention_tiles.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {
namespace attn {
namespace {

constexpr int D = 64, kWarps = 4, kMT = 2, kKB = kWarps * kMT * 16, kQT = 32, kT = kWarps * 32;
constexpr int kLdS = kQT + 8;  // dS^T row stride (keys x queries), 16-byte skew per row

// acc[i] = A_i B^T: A_i = 16 rows of a [*, D] shared tile at a_addr (+16 rows per i), B = the
// kQT rows of a [kQT, D] tile at b_addr (lane addresses as in warp_abt).
__device__ __forceinline__ void abt2(float (&acc)[kMT][kQT / 8][4], std::uint32_t a_addr, std::uint32_t b_addr) {
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int n = 0; n < kQT / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][n][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    std::uint32_t a[kMT][4];
#pragma unroll
    for (int i = 0; i < kMT; ++i) mma::ldmatrix_x4(a[i], a_addr + (i * 16 * ld<D>() + kk * 16) * 2);
#pragma unroll
    for (int np = 0; np < kQT / 16; ++np) {
      std::uint32_t bb[4];
      mma::ldmatrix_x4(bb, b_addr + (np * 16 * ld<D>() + kk * 16) * 2);
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        mma::mma_bf16_16816(acc[i][2 * np], a[i], bb[0], bb[1]);
        mma::mma_bf16_16816(acc[i][2 * np + 1], a[i], bb[2], bb[3]);
      }
    }
  }
}

// acc[i] += c_i (bf16 A fragments of a 16 x kQT fp32 C tile) * B[kQT x D] (B read transposed).
__device__ __forceinline__ void pb2(float (&acc)[kMT][D / 8][4], const float (&c)[kMT][kQT / 8][4],
                                    std::uint32_t bt_addr) {
  std::uint32_t f[kMT][kQT / 16][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i) to_a_frags<kQT>(f[i], c[i]);
#pragma unroll
  for (int ks = 0; ks < kQT / 16; ++ks)
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      std::uint32_t bb[4];
      mma::ldmatrix_x4_trans(bb, bt_addr + (ks * 16 * ld<D>() + dp * 16) * 2);
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        mma::mma_bf16_16816(acc[i][2 * dp], f[i][ks], bb[0], bb[1]);
        mma::mma_bf16_16816(acc[i][2 * dp + 1], f[i][ks], bb[2], bb[3]);
      }
    }
}

template <bool CAUSAL, bool ATOMIC_DQ>
__global__ void __launch_bounds__(kT) dkdv_v2_kernel(const bf16* __restrict__ qkv, const bf16* __restrict__ dout,
                                                     const float* __restrict__ lse, const float* __restrict__ dvec,
                                                     bf16* __restrict__ dqkv, float* __restrict__ dq_acc, int S, int H,
                                                     float scale_log2, float scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + kKB * ld<D>();
  bf16* sQ = sV + kKB * ld<D>();       // [2][kQT][ld]
  bf16* sdO = sQ + 2 * kQT * ld<D>();  // [2][kQT][ld]
  float* sL = reinterpret_cast<float*>(sdO + 2 * kQT * ld<D>());  // [2][kQT] lse * log2 e
  float* sDv = sL + 2 * kQT;                                       // [2][kQT]
  bf16* sdS = reinterpret_cast<bf16*>(sDv + 2 * kQT);              // [kKB][kLdS], ATOMIC_DQ only

  const int n0 = blockIdx.x * kKB, head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const int k0 = n0 + warp * kMT * 16;  // the warp's first key
  const std::size_t tok = 3ull * H * D, otok = static_cast<std::size_t>(H) * D;
  const std::size_t qoff = static_cast<std::size_t>(b) * S * tok + static_cast<std::size_t>(head) * D;
  const bf16* gq = qkv + qoff;
  const bf16* gk = gq + otok;
  const bf16* gv = gk + otok;
  const bf16* gdo = dout + static_cast<std::size_t>(b) * S * otok + static_cast<std::size_t>(head) * D;
  const float* glse = lse + (static_cast<std::size_t>(b) * H + head) * S;
  const float* gdv = dvec + (static_cast<std::size_t>(b) * H + head) * S;

  const int q_first = CAUSAL ? n0 / kQT : 0;  // causal: queries before the first key see none of it
  const int q_tiles = (S + kQT - 1) / kQT;

  auto load_q_tile = [&](int qt, int buf) {
    load_rows<D, kQT, kT>(sQ + buf * kQT * ld<D>(), gq, qt * kQT, S, tok);
    load_rows<D, kQT, kT>(sdO + buf * kQT * ld<D>(), gdo, qt * kQT, S, otok);
    for (int i = threadIdx.x; i < kQT; i += kT) {
      const int q = qt * kQT + i;
      sL[buf * kQT + i] = q < S ? glse[q] * kLog2e : 0.f;
      sDv[buf * kQT + i] = q < S ? gdv[q] : 0.f;
    }
  };
  load_rows<D, kKB, kT>(sK, gk, n0, S, tok);
  load_rows<D, kKB, kT>(sV, gv, n0, S, tok);
  load_q_tile(q_first, 0);
  mma::cp_async_commit();

  float dk[kMT][D / 8][4], dv[kMT][D / 8][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[i][d][e] = dv[i][d][e] = 0.f;

  const int a_off = (warp * kMT * 16 + (lane & 15)) * ld<D>() + (lane >> 4) * 8;
  const std::uint32_t k_addr = mma::smem_addr(sK + a_off), v_addr = mma::smem_addr(sV + a_off);
  const int b_off = ((lane & 7) + (lane >> 4) * 8) * ld<D>() + ((lane >> 3) & 1) * 8;      // B = rows
  const int bt_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * ld<D>() + (lane >> 4) * 8;     // B^T

  for (int qt = q_first; qt < q_tiles; ++qt) {
    const int buf = (qt - q_first) & 1, m0 = qt * kQT;
    if (qt + 1 < q_tiles) {
      load_q_tile(qt + 1, buf ^ 1);
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
    } else {
      mma::cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* q_tile = sQ + buf * kQT * ld<D>();
    const bf16* do_tile = sdO + buf * kQT * ld<D>();
    const float* l_tile = sL + buf * kQT;
    const float* dv_tile = sDv + buf * kQT;

    // P^T = exp2(scale_log2 * K Q^T - lse_log2[q]) for the warp's 32 keys x 32 queries.
    float p[kMT][kQT / 8][4];
    abt2(p, k_addr, mma::smem_addr(q_tile + b_off));
    // Keys past S are dead too (P = exp2(-lse) of their zero rows can overflow; inf * 0 in dQ).
    const bool mask = m0 + kQT > S || k0 + kMT * 16 > S || (CAUSAL && m0 < k0 + kMT * 16 - 1);
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int n = 0; n < kQT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = n * 8 + 2 * t + (e & 1);
          const int key = k0 + i * 16 + gi + (e >> 1) * 8;
          const bool dead = mask && (m0 + qi >= S || key >= S || (CAUSAL && m0 + qi < key));
          p[i][n][e] = dead ? 0.f : exp2f(fmaf(p[i][n][e], scale_log2, -l_tile[qi]));
        }
    pb2(dv, p, mma::smem_addr(do_tile + bt_off));

    // dS^T = P^T o (V dO^T - Dvec[q]); dK += dS^T Q.
    float ds[kMT][kQT / 8][4];
    abt2(ds, v_addr, mma::smem_addr(do_tile + b_off));
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int n = 0; n < kQT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[i][n][e] = p[i][n][e] * (ds[i][n][e] - dv_tile[n * 8 + 2 * t + (e & 1)]);
    pb2(dk, ds, mma::smem_addr(q_tile + bt_off));

    if constexpr (ATOMIC_DQ) {
      // Park dS^T (bf16, as the dK product used it); then warp w adds dQ[16 queries (w & 1), 32
      // columns (w >> 1)] = dS[queries, 128 keys] K[128 keys, cols] into the fp32 accumulator.
      // Key rows past S carry dS = 0 (dead above) and zero-filled K rows.
#pragma unroll
      for (int i = 0; i < kMT; ++i)
#pragma unroll
        for (int n = 0; n < kQT / 8; ++n)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *reinterpret_cast<std::uint32_t*>(sdS + (warp * kMT * 16 + i * 16 + gi + 8 * h) * kLdS + n * 8 + 2 * t) =
                mma::pack_bf16(ds[i][n][2 * h], ds[i][n][2 * h + 1]);
      __syncthreads();
      const int q0 = (warp & 1) * 16, d0 = (warp >> 1) * 32;
      const std::uint32_t a_addr =
          mma::smem_addr(sdS + ((lane & 7) + (lane >> 4) * 8) * kLdS + q0 + ((lane >> 3) & 1) * 8);
      const std::uint32_t b_addr = mma::smem_addr(sK + bt_off + d0);
      float acc[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kKB / 16; ++ks) {
        std::uint32_t a[4];
        mma::ldmatrix_x4_trans(a, a_addr + ks * 16 * kLdS * 2);
#pragma unroll
        for (int dp = 0; dp < 2; ++dp) {
          std::uint32_t bb[4];
          mma::ldmatrix_x4_trans(bb, b_addr + (ks * 16 * ld<D>() + dp * 16) * 2);
          mma::mma_bf16_16816(acc[2 * dp], a, bb[0], bb[1]);
          mma::mma_bf16_16816(acc[2 * dp + 1], a, bb[2], bb[3]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int q = m0 + q0 + gi + 8 * h;
        if (q >= S) continue;
        float* dst =
            dq_acc + (static_cast<std::size_t>(b) * S + q) * otok + static_cast<std::size_t>(head) * D + d0 + 2 * t;
#pragma unroll
        for (int dt = 0; dt < 4; ++dt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
          atomicAdd(reinterpret_cast<float2*>(dst + dt * 8), make_float2(acc[dt][2 * h], acc[dt][2 * h + 1]));
#else
          atomicAdd(dst + dt * 8, acc[dt][2 * h]);
          atomicAdd(dst + dt * 8 + 1, acc[dt][2 * h + 1]);
#endif
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer (and sdS) before it is refilled
  }

  bf16* gdk = dqkv + qoff + otok;
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
    store_rows<D>(gdk, dk[i], k0 + i * 16, S, tok, scale);
    store_rows<D>(gdk + otok, dv[i], k0 + i * 16, S, tok, 1.f);
  }
}

template <bool CAUSAL, bool ATOMIC_DQ>
void launch(cudaStream_t st, const bf16* qkv, const bf16* dout, const float* lse, const float* dvec, bf16* dqkv,
            float* dq_acc, const AttentionShape& sh) {
  constexpr int kSmem = (2 * kKB + 4 * kQT) * ld<D>() * 2 + 4 * kQT * 4 + (ATOMIC_DQ ? kKB * kLdS * 2 : 0);
  auto kernel = dkdv_v2_kernel<CAUSAL, ATOMIC_DQ>;
  CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const float scale = 1.f / std::sqrt(static_cast<float>(D)), scale_log2 = scale * kLog2e;
  const dim3 grid((sh.seq + kKB - 1) / kKB, sh.heads, sh.batch);
  kernel<<<grid, kT, kSmem, st>>>(qkv, dout, lse, dvec, dqkv, dq_acc, sh.seq, sh.heads, scale_log2, scale);
  CUTRAIN_LAUNCH_CHECK("attention_dkdv_v2_kernel");
}

}  // namespace

void dkdv_v2(cudaStream_t s, const bf16* qkv, const bf16* dout, const float* lse, const float* dvec, bf16* dqkv,
             float* dq_acc, const AttentionShape& sh) {
  CUTRAIN_CHECK(sh.head_dim == D, "attention dkdv_v2: head_dim must be 64, got ", sh.head_dim);
  CUTRAIN_CHECK(dq_acc != nullptr, "attention dkdv_v2: the fast mode's dQ accumulator must be non-null");
  sh.causal ? launch<true, true>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh)
            : launch<false, true>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh);
}

}  // namespace attn
}  // namespace cutrain::kernels
