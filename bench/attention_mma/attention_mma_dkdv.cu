// @brief The mma.sync baseline's dK/dV pass (bench/attention_mma/attention_mma.h): one CTA per
// Tile::kBlockM keys of one (batch, head), one warp per 16 keys, walking query tiles of kBlockN through a cp.async double buffer: P^T and dP^T
// recomputed from lse, dV += P^T dO, dK += dS^T Q. The fast mode (Tile::kDeterministic false)
// also adds dS K into the fp32 dQ accumulator with atomics.
// Options (template bools): MASK, a masked key's P is 0 and a CTA whose keys are all masked only
// writes its zero dK, dV; DROP, the keep bits of P^T (transposed_keep_bits) drop P in dV = P^T dO
// (scaled by 1/(1-p) at the store) and dP in dS.
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

// Fast mode: the pass also adds this key block's share of dQ (dS K, unscaled) into an fp32
// accumulator [B, S, H, D] with atomics, via dS^T parked in shared memory; warp w takes query rows
// 16*(w % (QT/16)).. and D/dq_split columns of them.
template <typename Tile>
constexpr int dq_split() { return (Tile::kBlockM / 16) / (Tile::kBlockN / 16); }

template <typename Tile>
constexpr int dkdv_smem() {
  constexpr int D = Tile::kHeadDim, KB = Tile::kBlockM, QT = Tile::kBlockN;
  return (2 * KB + 4 * QT) * ld<D>() * 2 + 4 * QT * 4 + (Tile::kDeterministic ? 0 : KB * (QT + 8) * 2);
}

template <typename E, typename Tile, bool MASK, bool DROP>
__global__ void __launch_bounds__(Tile::kThreads) dkdv_kernel(const E* __restrict__ qkv, const E* __restrict__ dout,
                                                        const float* __restrict__ lse, const float* __restrict__ dvec,
                                                        E* __restrict__ dqkv, float* __restrict__ dq_acc, int S,
                                                        int H, float scale_log2, float scale, OptionArgs opt) {
  constexpr int D = Tile::kHeadDim, KB = Tile::kBlockM, QT = Tile::kBlockN, kT = Tile::kThreads;
  constexpr bool CAUSAL = Tile::kCausal, ATOMIC_DQ = !Tile::kDeterministic;
  static_assert(Tile::kMTiles == 1 && !Tile::kARegs, "one 16-key m-tile per warp, K and V re-read from shared memory");
  constexpr int kLdS = QT + 8;  // dS^T row stride (keys x queries), 16-byte skew per row
  static_assert(D / dq_split<Tile>() % 32 == 0, "dQ columns per warp must be a multiple of 32");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* sK = reinterpret_cast<E*>(smem_raw);
  E* sV = sK + KB * ld<D>();
  E* sQ = sV + KB * ld<D>();       // [2][QT][ld]
  E* sdO = sQ + 2 * QT * ld<D>();  // [2][QT][ld]
  float* sL = reinterpret_cast<float*>(sdO + 2 * QT * ld<D>());  // [2][QT] lse * log2 e
  float* sDv = sL + 2 * QT;                                       // [2][QT]
  E* sdS = reinterpret_cast<E*>(sDv + 2 * QT);               // [KB][kLdS], ATOMIC_DQ only

  const int n0 = blockIdx.x * KB, head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const BwdSlices<E, D> g(qkv, dout, lse, dvec, b, head, S, H);

  const int q_first = CAUSAL ? n0 / QT : 0;  // causal: queries before the first key see none of it
  const int q_tiles = (S + QT - 1) / QT;
  [[maybe_unused]] const DropoutKey dkey = DROP ? opt.resolve_step() : DropoutKey{};
  [[maybe_unused]] const std::uint64_t bh_e = (static_cast<std::uint64_t>(b) * H + head) * S;

  auto load_q_tile = [&](int qt, int buf) {
    load_rows<D, QT, kT>(sQ + buf * QT * ld<D>(), g.q, qt * QT, S, g.tok);
    load_rows<D, QT, kT>(sdO + buf * QT * ld<D>(), g.dout, qt * QT, S, g.otok);
    for (int i = threadIdx.x; i < QT; i += kT) {
      const int q = qt * QT + i;
      sL[buf * QT + i] = q < S ? g.lse[q] * kLog2e : 0.f;
      sDv[buf * QT + i] = q < S ? g.dvec[q] : 0.f;
    }
  };
  load_rows<D, KB, kT>(sK, g.k, n0, S, g.tok);
  load_rows<D, KB, kT>(sV, g.v, n0, S, g.tok);
  load_q_tile(q_first, 0);
  mma::cp_async_commit();
  // MASK: which of this thread's two keys may be attended (read while the first tiles load); a CTA
  // with none walks no query tile (q_end) and stores its zero dK, dV.
  int q_end = q_tiles;
  [[maybe_unused]] std::uint32_t key_live = 0;  // bit e: the key of fragment element e (key_base + 8(e>>1))
  if constexpr (MASK) {
    const std::uint8_t* km = opt.key_mask + static_cast<std::size_t>(b) * S;
    const int k0 = n0 + warp * 16 + gi;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (k0 + 8 * h < S && __ldg(km + k0 + 8 * h) != 0) key_live |= 3u << (2 * h);
    if (!__syncthreads_or(key_live != 0)) q_end = q_first;
  }

  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  const int key_base = n0 + warp * 16 + gi;  // this thread's keys: key_base, key_base + 8

  for (int qt = q_first; qt < q_end; ++qt) {
    const int buf = (qt - q_first) & 1, m0 = qt * QT;
    if (qt + 1 < q_end) {
      load_q_tile(qt + 1, buf ^ 1);
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
    } else {
      mma::cp_async_wait<0>();
    }
    __syncthreads();
    const E* q_tile = sQ + buf * QT * ld<D>();
    const E* do_tile = sdO + buf * QT * ld<D>();
    const float* l_tile = sL + buf * QT;
    const float* dv_tile = sDv + buf * QT;

    // P^T = exp2(scale_log2 * K Q^T - lse_log2[q]) for 16 keys x QT queries.
    float p[QT / 8][4];
    warp_abt<D, QT / 8>(p, sK, warp * 16, q_tile);
    const bool mask = m0 + QT > S || (CAUSAL && m0 < n0 + KB - 1);
#pragma unroll
    for (int n = 0; n < QT / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = n * 8 + 2 * t + (e & 1);
        const int key = key_base + (e >> 1) * 8;
        const bool dead = mask && (m0 + qi >= S || (CAUSAL && m0 + qi < key));
        p[n][e] = dead ? 0.f : exp2f(fmaf(p[n][e], scale_log2, -l_tile[qi]));
      }
    // Keys past S: their zero K rows give P = exp2(-lse), inf for a row whose lse < -88.7, and
    // inf * 0 would poison the fast mode's dQ. Zero them (the last key block only).
    // MASK: masked keys (key_live false, which covers keys past S) are zeroed the same way; a row
    // with lse -inf has every key masked, so its inf never survives.
    if constexpr (MASK) {
#pragma unroll
      for (int n = 0; n < QT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!((key_live >> e) & 1u)) p[n][e] = 0.f;
    } else if (n0 + KB > S) {
#pragma unroll
      for (int n = 0; n < QT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (key_base + (e >> 1) * 8 >= S) p[n][e] = 0.f;
    }
    std::uint32_t pf[QT / 16][4];
    [[maybe_unused]] std::uint32_t keep = 0;  // DROP: bit 4n + e, element e of n-tile n is kept
    if constexpr (DROP) {
      keep = transposed_keep_bits<QT / 8>(dkey, opt.threshold, bh_e, S, key_base, m0, S % 4 == 0);
      to_a_frags_kept<E, QT>(pf, p, keep);  // dV gets P o Z; the 1/(1-p) is applied at the store
    } else {
      to_a_frags<E, QT>(pf, p);
    }
    warp_pb<D, QT>(dv, pf, do_tile);

    // dS^T = P^T o (V dO^T - Dvec[q]); DROP: P^T o (V dO^T o Z/(1-p) - Dvec[q]).
    float ds[QT / 8][4];
    warp_abt<D, QT / 8>(ds, sV, warp * 16, do_tile);
#pragma unroll
    for (int n = 0; n < QT / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float dp = ds[n][e];
        if constexpr (DROP) dp = (keep >> (4 * n + e)) & 1u ? dp * opt.drop_scale : 0.f;
        ds[n][e] = p[n][e] * (dp - dv_tile[n * 8 + 2 * t + (e & 1)]);
      }
    to_a_frags<E, QT>(pf, ds);
    warp_pb<D, QT>(dk, pf, q_tile);
    if constexpr (ATOMIC_DQ) {
      // Key rows past S carry dS = 0 (dead above) and zero-filled K rows.
      // Park dS^T (E, the values the dK product used), then dQ[q, d0..] += dS[q, keys] K[keys, d0..].
#pragma unroll
      for (int n = 0; n < QT / 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<std::uint32_t*>(sdS + (warp * 16 + gi + 8 * h) * kLdS + n * 8 + 2 * t) =
              mma::pack2<E>(ds[n][2 * h], ds[n][2 * h + 1]);
      __syncthreads();
      constexpr int DN = D / dq_split<Tile>(), DC = 32;  // columns per warp, done 32 at a time (registers)
      const int q0 = (warp % (QT / 16)) * 16, d0 = (warp / (QT / 16)) * DN;
      // A = dS (queries x keys) read transposed out of dS^T: matrices (q 0-7, k 0-7), (q 8-15, k 0-7),
      // (q 0-7, k 8-15), (q 8-15, k 8-15) live at (keys 0-7 | 8-15) x (queries 0-7 | 8-15) of dS^T.
      const std::uint32_t a_addr =
          mma::smem_addr(sdS + ((lane & 7) + (lane >> 4) * 8) * kLdS + q0 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int dc = d0; dc < d0 + DN; dc += DC) {
        float acc[DC / 8][4];
        zero(acc);
        const std::uint32_t b_addr =
            mma::smem_addr(sK + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld<D>() + dc + (lane >> 4) * 8);
#pragma unroll
        for (int ks = 0; ks < KB / 16; ++ks) {
          std::uint32_t a[4];
          mma::ldmatrix_x4_trans(a, a_addr + ks * 16 * kLdS * 2);
#pragma unroll
          for (int dp = 0; dp < DC / 16; ++dp) {
            std::uint32_t bb[4];
            mma::ldmatrix_x4_trans(bb, b_addr + (ks * 16 * ld<D>() + dp * 16) * 2);
            mma::mma_16816<E>(acc[2 * dp], a, bb[0], bb[1]);
            mma::mma_16816<E>(acc[2 * dp + 1], a, bb[2], bb[3]);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int q = m0 + q0 + gi + 8 * h;
          if (q >= S) continue;
          float* dst =
              dq_acc + (static_cast<std::size_t>(b) * S + q) * g.otok + static_cast<std::size_t>(head) * D + dc + 2 * t;
#pragma unroll
          for (int dt = 0; dt < DC / 8; ++dt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd(reinterpret_cast<float2*>(dst + dt * 8), make_float2(acc[dt][2 * h], acc[dt][2 * h + 1]));
#else
            atomicAdd(dst + dt * 8, acc[dt][2 * h]);
            atomicAdd(dst + dt * 8 + 1, acc[dt][2 * h + 1]);
#endif
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer (and sdS) before it is refilled
  }

  if constexpr (MASK) mma::cp_async_wait<0>();  // a CTA that walked nothing still has its first loads out
  E* gdk = dqkv + g.qoff + g.otok;
  store_rows<D>(gdk, dk, n0 + warp * 16, S, g.tok, scale);
  store_rows<D>(gdk + g.otok, dv, n0 + warp * 16, S, g.tok, DROP ? opt.drop_scale : 1.f);
}

template <int D, bool CAUSAL, bool DET, bool MASK, bool DROP, typename E>
void launch_dkdv(cudaStream_t st, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
                 float* dq_acc, const AttentionShape& sh, const OptionArgs& opt) {
  using T = Tile<Pass::Dkdv, D, CAUSAL, DET>;
  auto kernel = dkdv_kernel<E, T, MASK, DROP>;
  constexpr int kSmem = dkdv_smem<T>();
  CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const float scale = 1.f / std::sqrt(static_cast<float>(D)), scale_log2 = scale * kLog2e;
  const dim3 grid((sh.seq + T::kBlockM - 1) / T::kBlockM, sh.heads, sh.batch);
  kernel<<<grid, T::kThreads, kSmem, st>>>(qkv, dout, lse, dvec, dqkv, dq_acc, sh.seq, sh.heads, scale_log2, scale,
                                           opt);
  CUTRAIN_LAUNCH_CHECK(DET ? "attention_dkdv_kernel" : "attention_dkdv_kernel(atomic dq)");
}

template <int D, bool CAUSAL, bool DET, typename E>
void launch_dkdv(cudaStream_t st, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
                 float* dq_acc, const AttentionShape& sh, const OptionArgs& opt) {
  const bool mask = opt.key_mask != nullptr, drop = opt.threshold != 0;
  if (!mask && !drop) launch_dkdv<D, CAUSAL, DET, false, false>(st, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
  else if (!drop) launch_dkdv<D, CAUSAL, DET, true, false>(st, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
  else if (!mask) launch_dkdv<D, CAUSAL, DET, false, true>(st, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
  else launch_dkdv<D, CAUSAL, DET, true, true>(st, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
}

template <int D, bool CAUSAL, typename E>
void launch_dkdv(cudaStream_t st, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
                 float* dq_acc, const AttentionShape& sh, const OptionArgs& opt) {
  dq_acc ? launch_dkdv<D, CAUSAL, false>(st, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt)
         : launch_dkdv<D, CAUSAL, true>(st, qkv, dout, lse, dvec, dqkv, nullptr, sh, opt);
}

}  // namespace

template <typename E>
void dkdv(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
          float* dq_acc, const AttentionShape& sh, const OptionArgs& opt) {
  const bool c = sh.causal;
  if (sh.head_dim == 64)
    c ? launch_dkdv<64, true>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt)
      : launch_dkdv<64, false>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
  else
    c ? launch_dkdv<128, true>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt)
      : launch_dkdv<128, false>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
}

template void dkdv<bf16>(cudaStream_t, const bf16*, const bf16*, const float*, const float*, bf16*, float*,
                         const AttentionShape&, const OptionArgs&);
template void dkdv<f16>(cudaStream_t, const f16*, const f16*, const float*, const float*, f16*, float*,
                        const AttentionShape&, const OptionArgs&);

}  // namespace cutrain::bench::mma_attention
