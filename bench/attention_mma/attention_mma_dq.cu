// @brief The mma.sync baseline's dQ pass (bench/attention_mma/attention_mma.h), the deterministic
// mode's before the sm90 dQ pass (kernels/attention_sm90/dq.cu) replaced it: CTA = Tile::kWarps
// warps x kMTiles m-tiles of 16 queries, walking K/V tiles of kBlockN keys: dQ += dS K with
// dS = P o (dO V^T - Dvec) and P recomputed from lse. Every K/V fragment read by ldmatrix feeds
// kMTiles mma; with Tile::kARegs the warp's Q and dO A fragments stay in registers for the whole
// pass, else they are re-read from shared memory.
// Options (template bools): MASK, masked keys get P = 0 and a key tile with no key left is skipped;
// DROP, dS = P o (dP o Z/(1-p) - Dvec) with the forward's keep bits Z (row_keep_bits).
#include <cmath>

#include "bench/attention_mma/attention_mma.h"
#include "kernels/attention.cuh"
#include "kernels/attention_options.cuh"
#include "kernels/attention_softmax.cuh"
#include "kernels/attention_tiles.cuh"
#include "runtime/check.h"

namespace cutrain::bench::mma_attention {
namespace {

using namespace cutrain::kernels;
using namespace cutrain::kernels::attn;

template <typename E, typename Tile, bool MASK, bool DROP>
__global__ void __launch_bounds__(Tile::kThreads) dq_kernel(const E* __restrict__ qkv, const E* __restrict__ dout,
                                                   const float* __restrict__ lse, const float* __restrict__ dvec,
                                                   E* __restrict__ dqkv, int S, int H, float scale_log2,
                                                   float scale, OptionArgs opt) {
  constexpr int D = Tile::kHeadDim, kMT = Tile::kMTiles, kBM = Tile::kBlockM, kBN = Tile::kBlockN, kT = Tile::kThreads;
  constexpr bool CAUSAL = Tile::kCausal, QREG = Tile::kARegs;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* sQ = reinterpret_cast<E*>(smem_raw);
  E* sdO = sQ + kBM * ld<D>();
  E* sK = sdO + kBM * ld<D>();     // [2][kBN][ld]
  E* sV = sK + 2 * kBN * ld<D>();  // [2][kBN][ld]

  const int qblock = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // heaviest first
  const int m0 = qblock * kBM, head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const int w0 = m0 + warp * kMT * 16;  // the warp's first query row
  const BwdSlices<E, D> g(qkv, dout, lse, dvec, b, head, S, H);

  int n_tiles = (S + kBN - 1) / kBN;
  if (CAUSAL) n_tiles = min(n_tiles, (m0 + kBM - 1) / kBN + 1);

  KeyMaskTiles<kBN> key_tiles{MASK ? opt.key_mask + static_cast<std::size_t>(b) * S : nullptr, S, {}};
  if constexpr (MASK) key_tiles.load(0);
  [[maybe_unused]] const DropoutKey dkey = DROP ? opt.resolve_step() : DropoutKey{};
  [[maybe_unused]] const std::uint64_t bh_e = (static_cast<std::uint64_t>(b) * H + head) * S;

  float l2[kMT][2], dd[kMT][2];  // this thread's rows: w0 + 16i + gi (+8)
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = w0 + i * 16 + gi + 8 * h;
      l2[i][h] = r < S ? g.lse[r] * kLog2e : 0.f;
      dd[i][h] = r < S ? g.dvec[r] : 0.f;
    }

  load_rows<D, kBM, kT>(sQ, g.q, m0, S, g.tok);
  load_rows<D, kBM, kT>(sdO, g.dout, m0, S, g.otok);
  load_rows<D, kBN, kT>(sK, g.k, 0, S, g.tok);
  load_rows<D, kBN, kT>(sV, g.v, 0, S, g.tok);
  mma::cp_async_commit();
  mma::cp_async_wait<0>();
  __syncthreads();

  // A-fragment addresses of the warp's Q and dO rows (m-tile i: + 16 rows, k-slice kk: + 32 bytes).
  const int a_off = (warp * kMT * 16 + (lane & 15)) * ld<D>() + (lane >> 4) * 8;
  const std::uint32_t q_addr = mma::smem_addr(sQ + a_off), do_addr = mma::smem_addr(sdO + a_off);
  std::uint32_t qf[kMT][QREG ? D / 16 : 1][4], df[kMT][QREG ? D / 16 : 1][4];  // unused unless QREG
  if constexpr (QREG) {
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        mma::ldmatrix_x4(qf[i][kk], q_addr + (i * 16 * ld<D>() + kk * 16) * 2);
        mma::ldmatrix_x4(df[i][kk], do_addr + (i * 16 * ld<D>() + kk * 16) * 2);
      }
  }

  float dq[kMT][D / 8][4];
  zero(dq);

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * kBN;
    kv_stream_step<D, kBN, kT>(sK, sV, g.k, g.v, j, n_tiles, S, g.tok);
    const E* k_tile = sK + (j & 1) * kBN * ld<D>();
    const E* v_tile = sV + (j & 1) * kBN * ld<D>();

    std::uint32_t kbits[KeyMaskTiles<kBN>::kWords];
    if constexpr (MASK) {
      key_tiles.take(kbits);
      if (j + 1 < n_tiles) key_tiles.load(j + 1);
    }
    // Causal: a warp before the whole tile adds nothing; nor does a tile with every key masked.
    if ((!CAUSAL || n0 <= w0 + kMT * 16 - 1) && (!MASK || any_key(kbits))) {
      // s = Q K^T, then dp = dO V^T, for kMT x 16 rows x kBN keys; each K/V fragment feeds kMT mma.
      // (One product at a time: fewer fragments live at once, which keeps D=128 clear of spills.)
      float s[kMT][kBN / 8][4], dp[kMT][kBN / 8][4];
      const int b_off = frag_b_nrows_offset<ld<D>()>(lane);
      const std::uint32_t k_addr = mma::smem_addr(k_tile + b_off);
      zero(s);
      if constexpr (QREG) mma_abt<E, D, kMT, kBN / 8>(s, RegFrags<kMT, D / 16>{qf}, k_addr);
      else mma_abt<E, D, kMT, kBN / 8>(s, SmemFrags<ld<D>()>{q_addr}, k_addr);
      const std::uint32_t v_addr = mma::smem_addr(v_tile + b_off);
      zero(dp);
      if constexpr (QREG) mma_abt<E, D, kMT, kBN / 8>(dp, RegFrags<kMT, D / 16>{df}, v_addr);
      else mma_abt<E, D, kMT, kBN / 8>(dp, SmemFrags<ld<D>()>{do_addr}, v_addr);

      // dS = P o (dP - Dvec), P = exp2(scale_log2 s - lse log2 e); dead entries (past S, causal) 0.
      const bool mask = n0 + kBN > S || (CAUSAL && n0 + kBN - 1 > w0);
      std::uint32_t sf[kMT][kBN / 16][4];
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        [[maybe_unused]] std::uint32_t keep[2] = {0, 0};  // DROP: bit 2n + c of row h
        if constexpr (DROP) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            keep[h] = row_keep_bits<kBN / 8>(dkey, opt.threshold,
                                             (bh_e + static_cast<std::uint64_t>(w0 + i * 16 + gi + 8 * h)) * S, n0,
                                             S % 4 == 0);
        }
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = n0 + n * 8 + 2 * t + (e & 1);
            const int row = w0 + i * 16 + gi + (e >> 1) * 8;
            const bool dead = (mask && (col >= S || (CAUSAL && col > row))) ||
                              (MASK && !key_ok(kbits, n * 8 + 2 * t + (e & 1)));
            const float p = dead ? 0.f : exp2f(fmaf(s[i][n][e], scale_log2, -l2[i][e >> 1]));
            float dpe = dp[i][n][e];
            if constexpr (DROP) dpe = (keep[e >> 1] >> (2 * n + (e & 1))) & 1u ? dpe * opt.drop_scale : 0.f;
            s[i][n][e] = p * (dpe - dd[i][e >> 1]);
          }
        to_a_frags<E, kBN>(sf[i], s[i]);
      }

      // dQ += dS K; each K fragment (read transposed) feeds kMT mma.
      // (The address spelled out: through frag_b_krows_offset the D=128 kernels schedule differently.)
      const std::uint32_t kt_addr =
          mma::smem_addr(k_tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld<D>() + (lane >> 4) * 8);
      mma_ab<E, ld<D>(), kBN, kMT, D / 8>(dq, RegFrags<kMT, kBN / 16>{sf}, kt_addr);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

#pragma unroll
  for (int i = 0; i < kMT; ++i) store_rows<D>(dqkv + g.qoff, dq[i], w0 + i * 16, S, g.tok, scale);
}

template <int D, bool CAUSAL, bool MASK, bool DROP, typename E>
void launch_dq(cudaStream_t st, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
               const AttentionShape& sh, const OptionArgs& opt) {
  using T = Tile<Pass::Dq, D, CAUSAL>;
  constexpr int kSmem = (2 * T::kBlockM + 4 * T::kBlockN) * ld<D>() * 2;  // Q, dO + 2 K + 2 V tiles
  auto kernel = dq_kernel<E, T, MASK, DROP>;
  CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const float scale = 1.f / std::sqrt(static_cast<float>(D)), scale_log2 = scale * kLog2e;
  const dim3 grid((sh.seq + T::kBlockM - 1) / T::kBlockM, sh.heads, sh.batch);
  kernel<<<grid, T::kThreads, kSmem, st>>>(qkv, dout, lse, dvec, dqkv, sh.seq, sh.heads, scale_log2, scale, opt);
  CUTRAIN_LAUNCH_CHECK("mma_attention dq_kernel");
}

template <int D, bool CAUSAL, typename E>
void launch_dq(cudaStream_t st, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
               const AttentionShape& sh, const OptionArgs& opt) {
  const bool mask = opt.key_mask != nullptr, drop = opt.threshold != 0;
  if (!mask && !drop) launch_dq<D, CAUSAL, false, false>(st, qkv, dout, lse, dvec, dqkv, sh, opt);
  else if (!drop) launch_dq<D, CAUSAL, true, false>(st, qkv, dout, lse, dvec, dqkv, sh, opt);
  else if (!mask) launch_dq<D, CAUSAL, false, true>(st, qkv, dout, lse, dvec, dqkv, sh, opt);
  else launch_dq<D, CAUSAL, true, true>(st, qkv, dout, lse, dvec, dqkv, sh, opt);
}

}  // namespace

template <typename E>
void dq(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
        const AttentionShape& sh, const OptionArgs& opt) {
  const bool c = sh.causal;
  if (sh.head_dim == 64)
    c ? launch_dq<64, true>(s, qkv, dout, lse, dvec, dqkv, sh, opt)
      : launch_dq<64, false>(s, qkv, dout, lse, dvec, dqkv, sh, opt);
  else
    c ? launch_dq<128, true>(s, qkv, dout, lse, dvec, dqkv, sh, opt)
      : launch_dq<128, false>(s, qkv, dout, lse, dvec, dqkv, sh, opt);
}

template void dq<bf16>(cudaStream_t, const bf16*, const bf16*, const float*, const float*, bf16*,
                       const AttentionShape&, const OptionArgs&);
template void dq<f16>(cudaStream_t, const f16*, const f16*, const float*, const float*, f16*, const AttentionShape&,
                      const OptionArgs&);

}  // namespace cutrain::bench::mma_attention
