// Flash-style attention forward, v2 variants: more query rows per warp and per CTA than v1.
// Why: in v1 each warp owns 16 query rows, so every K/V fragment it reads from shared memory by
// ldmatrix feeds exactly one mma (32 ldmatrix.x4 per 64 mma per 64-key tile): the loop is bound
// by shared-memory bandwidth, not the tensor cores. With MT = 2 m-tiles (32 rows) per warp each
// K/V fragment feeds two mma, halving shared-memory traffic per FLOP (FlashAttention-2's layout).
// More rows per CTA (BLOCK_M 128) also halves the K/V re-reads from L2.
// Template: WARPS warps x MT m-tiles x 16 rows = BLOCK_M queries per CTA; K/V tiles of BN keys in
// a cp.async double buffer; QREG keeps Q's A fragments in registers (D=64), else they are re-read
// from shared memory every tile (D=128, where 2 x 16 x 128 fp32 of O already take 128 registers).
// Causal: tiles past the CTA's last query are never loaded, and a warp whose rows all precede a
// tile skips its math (it still joins the barriers).
#include <cmath>

#include "kernels/attention.cuh"
#include "kernels/attention_tiles.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {
namespace attn {
namespace {

template <int D, bool CAUSAL, int WARPS, int MT, int BN, bool QREG>
__global__ void __launch_bounds__(WARPS * 32) forward_v2_kernel(const bf16* __restrict__ qkv, bf16* __restrict__ out,
                                                                float* __restrict__ lse, int S, int H,
                                                                float scale_log2) {
  constexpr int kT = WARPS * 32, kBM = WARPS * MT * 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kBM * ld<D>();     // [2][BN][ld]
  bf16* sV = sK + 2 * BN * ld<D>();  // [2][BN][ld]

  const int qblock = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // causal: heaviest first
  const int m0 = qblock * kBM, head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const int w0 = m0 + warp * MT * 16;  // the warp's first query row; m-tile i: rows w0 + 16i ..
  const std::size_t tok = 3ull * H * D;
  const bf16* gq = qkv + static_cast<std::size_t>(b) * S * tok + static_cast<std::size_t>(head) * D;
  const bf16* gk = gq + static_cast<std::size_t>(H) * D;
  const bf16* gv = gk + static_cast<std::size_t>(H) * D;

  int n_tiles = (S + BN - 1) / BN;
  if (CAUSAL) n_tiles = min(n_tiles, (m0 + kBM - 1) / BN + 1);

  load_rows<D, kBM, kT>(sQ, gq, m0, S, tok);
  mma::cp_async_commit();
  load_rows<D, BN, kT>(sK, gk, 0, S, tok);
  load_rows<D, BN, kT>(sV, gv, 0, S, tok);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();
  __syncthreads();

  // A-fragment address of Q (m-tile 0, k-slice 0); m-tile i adds 16 rows, k-slice kk 32 bytes.
  const std::uint32_t q_addr = mma::smem_addr(sQ + (warp * MT * 16 + (lane & 15)) * ld<D>() + (lane >> 4) * 8);
  std::uint32_t qf[QREG ? MT : 1][QREG ? D / 16 : 1][4];
  if constexpr (QREG) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) mma::ldmatrix_x4(qf[i][kk], q_addr + (i * 16 * ld<D>() + kk * 16) * 2);
  }

  float o[MT][D / 8][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][d][e] = 0.f;
  float m_run[MT][2], l_run[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i) m_run[i][0] = m_run[i][1] = -INFINITY, l_run[i][0] = l_run[i][1] = 0.f;

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * BN;
    if (j + 1 < n_tiles) {
      const int nb = (j + 1) & 1;
      load_rows<D, BN, kT>(sK + nb * BN * ld<D>(), gk, n0 + BN, S, tok);
      load_rows<D, BN, kT>(sV + nb * BN * ld<D>(), gv, n0 + BN, S, tok);
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
    } else {
      mma::cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* k_tile = sK + (j & 1) * BN * ld<D>();
    const bf16* v_tile = sV + (j & 1) * BN * ld<D>();

    // Causal: a warp whose last row precedes the tile's first key has nothing to add from it.
    if (!CAUSAL || n0 <= w0 + MT * 16 - 1) {
      // S = Q K^T, MT x 16 rows x BN keys (raw, unscaled). Each K fragment feeds MT mma.
      float s[MT][BN / 8][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i][n][e] = 0.f;
      const std::uint32_t k_addr =
          mma::smem_addr(k_tile + ((lane & 7) + (lane >> 4) * 8) * ld<D>() + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t qa[QREG ? 1 : MT][4];
        if constexpr (!QREG) {
#pragma unroll
          for (int i = 0; i < MT; ++i) mma::ldmatrix_x4(qa[i], q_addr + (i * 16 * ld<D>() + kk * 16) * 2);
        }
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          std::uint32_t bb[4];
          mma::ldmatrix_x4(bb, k_addr + (np * 16 * ld<D>() + kk * 16) * 2);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            const std::uint32_t(&a)[4] = QREG ? qf[QREG ? i : 0][QREG ? kk : 0] : qa[QREG ? 0 : i];
            mma::mma_bf16_16816(s[i][2 * np], a, bb[0], bb[1]);
            mma::mma_bf16_16816(s[i][2 * np + 1], a, bb[2], bb[3]);
          }
        }
      }

      // Keys past the end, and (causal) keys after the query, get -inf.
      if (n0 + BN > S || (CAUSAL && n0 + BN - 1 > w0)) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int n = 0; n < BN / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = n0 + n * 8 + 2 * t + (e & 1);
              const int row = w0 + i * 16 + gi + (e >> 1) * 8;
              if (col >= S || (CAUSAL && col > row)) s[i][n][e] = -INFINITY;
            }
      }

      // Online softmax; each row lives in the 4 lanes of a quad. exp2 with the scale folded in.
      std::uint32_t p[MT][BN / 16][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = -INFINITY;
#pragma unroll
          for (int n = 0; n < BN / 8; ++n) mx = fmaxf(mx, fmaxf(s[i][n][2 * h], s[i][n][2 * h + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m_run[i][h], mx * scale_log2);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing unmasked yet
          const float alpha = exp2f(m_run[i][h] - m_use);
          m_run[i][h] = m_new;
          float rs = 0.f;
#pragma unroll
          for (int n = 0; n < BN / 8; ++n)
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e) {
              s[i][n][e] = exp2f(fmaf(s[i][n][e], scale_log2, -m_use));
              rs += s[i][n][e];
            }
          l_run[i][h] = l_run[i][h] * alpha + rs;
#pragma unroll
          for (int d = 0; d < D / 8; ++d) {
            o[i][d][2 * h] *= alpha;
            o[i][d][2 * h + 1] *= alpha;
          }
        }
        to_a_frags<BN>(p[i], s[i]);
      }

      // O += P V; each V fragment feeds MT mma.
      const std::uint32_t v_addr =
          mma::smem_addr(v_tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld<D>() + (lane >> 4) * 8);
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks)
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          std::uint32_t bb[4];
          mma::ldmatrix_x4_trans(bb, v_addr + (ks * 16 * ld<D>() + dp * 16) * 2);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            mma::mma_bf16_16816(o[i][2 * dp], p[i][ks], bb[0], bb[1]);
            mma::mma_bf16_16816(o[i][2 * dp + 1], p[i][ks], bb[2], bb[3]);
          }
        }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

  // Epilogue: finish the row sums across the quad, normalize, store O and the log-sum-exp.
  bf16* gout = out + static_cast<std::size_t>(b) * S * H * D + static_cast<std::size_t>(head) * D;
  float* glse = lse + (static_cast<std::size_t>(b) * H + head) * S;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[i][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv[h] = 1.f / l;
      const int row = w0 + i * 16 + gi + 8 * h;
      if (t == 0 && row < S) glse[row] = m_run[i][h] * kLn2 + logf(l);
    }
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      o[i][d][0] *= inv[0];
      o[i][d][1] *= inv[0];
      o[i][d][2] *= inv[1];
      o[i][d][3] *= inv[1];
    }
    store_rows<D>(gout, o[i], w0 + i * 16, S, static_cast<std::size_t>(H) * D, 1.f);
  }
}

template <int D, bool CAUSAL, int WARPS, int MT, int BN, bool QREG>
void launch(cudaStream_t st, const bf16* qkv, bf16* out, float* lse, const AttentionShape& sh) {
  constexpr int kBM = WARPS * MT * 16;
  constexpr int kSmem = (kBM + 4 * BN) * ld<D>() * 2;  // Q + 2 K + 2 V tiles
  auto kernel = forward_v2_kernel<D, CAUSAL, WARPS, MT, BN, QREG>;
  CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid((sh.seq + kBM - 1) / kBM, sh.heads, sh.batch);
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(D));
  kernel<<<grid, WARPS * 32, kSmem, st>>>(qkv, out, lse, sh.seq, sh.heads, scale_log2);
  CUTRAIN_LAUNCH_CHECK("attention_forward_v2_kernel");
}

// Register budgets (ptxas, sm_90, no spills): D64 <4,2,64,smem Q> 232, <4,2,32,reg Q> 178, <8,1,64> 128-130;
// D128 <4,2,32,smem Q> 248-249, <8,1,64> 213. (<4,2,64> with Q in registers and any 2-warp CTA spill.)
template <int D, bool CAUSAL>
void launch_variant(cudaStream_t st, const bf16* qkv, bf16* out, float* lse, const AttentionShape& sh, Variant v) {
  constexpr int kBN = D == 64 ? 64 : 32;  // D128: 32-key tiles, the only MT=2 shape that fits in registers
  switch (v) {
    case Variant::V2_M128:
    case Variant::V2_M128K32: launch<D, CAUSAL, 4, 2, kBN, false>(st, qkv, out, lse, sh); break;
    case Variant::V2_M128N32: launch<D, CAUSAL, 4, 2, 32, D == 64>(st, qkv, out, lse, sh); break;
    case Variant::V2_M128W8: launch<D, CAUSAL, 8, 1, 64, true>(st, qkv, out, lse, sh); break;
    default: CUTRAIN_FAIL("attention forward_v2: variant ", static_cast<int>(v), " is not a v2 variant");
  }
}

}  // namespace

void forward_v2(cudaStream_t s, const bf16* qkv, bf16* out, float* lse, const AttentionShape& sh, Variant v) {
  const bool c = sh.causal;
  if (sh.head_dim == 64)
    c ? launch_variant<64, true>(s, qkv, out, lse, sh, v) : launch_variant<64, false>(s, qkv, out, lse, sh, v);
  else
    c ? launch_variant<128, true>(s, qkv, out, lse, sh, v) : launch_variant<128, false>(s, qkv, out, lse, sh, v);
}

}  // namespace attn
}  // namespace cutrain::kernels
