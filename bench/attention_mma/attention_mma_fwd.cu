// @brief The mma.sync baseline's forward (bench/attention_mma/attention_mma.h): flash-style, FlashAttention-2's
// schedule on mma.sync tensor cores.
// CTA = Tile::kWarps warps x kMTiles m-tiles of 16 query rows (kBlockM queries) of one (batch,
// head); K/V tiles of kBlockN keys stream through a cp.async double buffer, and every K/V fragment
// read by ldmatrix feeds kMTiles mma. Q's A fragments are re-read from shared memory every tile.
// Scores, the online softmax (exp2 with the scale folded into log2 e) and the output accumulator
// stay in registers; only O and the fp32 log-sum-exp are stored. Causal: tiles past the CTA's last
// query are never loaded, and a warp whose rows all precede a tile skips its math (it still joins
// the barriers).
// BERT's options (template bools, so plain attention compiles as before): MASK, the key mask as
// -inf scores, a key tile with no key left skipped whole; DROP, the probabilities fed to P V are
// dropped (the row max and sum, so lse, stay those of the undropped softmax) and the output is
// scaled by 1/(1-p) once in the epilogue.
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
__global__ void __launch_bounds__(Tile::kThreads) forward_kernel(const E* __restrict__ qkv, E* __restrict__ out,
                                                                 float* __restrict__ lse, int S, int H,
                                                                 float scale_log2, OptionArgs opt) {
  constexpr int D = Tile::kHeadDim, MT = Tile::kMTiles, BN = Tile::kBlockN, kT = Tile::kThreads, kBM = Tile::kBlockM;
  constexpr bool CAUSAL = Tile::kCausal;
  static_assert(!Tile::kARegs, "the forward re-reads Q from shared memory");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* sQ = reinterpret_cast<E*>(smem_raw);
  E* sK = sQ + kBM * ld<D>();     // [2][BN][ld]
  E* sV = sK + 2 * BN * ld<D>();  // [2][BN][ld]

  const int qblock = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // causal: heaviest first
  const int m0 = qblock * kBM, head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const int w0 = m0 + warp * MT * 16;  // the warp's first query row; m-tile i: rows w0 + 16i ..
  const QkvSlices<E, D> g(qkv, b, head, S, H);
  const Mask<CAUSAL> mask{S};

  int n_tiles = (S + BN - 1) / BN;
  if (CAUSAL) n_tiles = min(n_tiles, (m0 + kBM - 1) / BN + 1);

  KeyMaskTiles<BN> key_tiles{MASK ? opt.key_mask + static_cast<std::size_t>(b) * S : nullptr, S, {}};
  if constexpr (MASK) key_tiles.load(0);
  [[maybe_unused]] const DropoutKey dkey = DROP ? opt.resolve_step() : DropoutKey{};
  [[maybe_unused]] const std::uint64_t bh_e = (static_cast<std::uint64_t>(b) * H + head) * S;

  load_rows<D, kBM, kT>(sQ, g.q, m0, S, g.tok);
  mma::cp_async_commit();
  load_rows<D, BN, kT>(sK, g.k, 0, S, g.tok);
  load_rows<D, BN, kT>(sV, g.v, 0, S, g.tok);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();
  __syncthreads();

  // A-fragment address of Q (m-tile 0, k-slice 0); m-tile i adds 16 rows, k-slice kk 32 bytes.
  const std::uint32_t q_addr = mma::smem_addr(sQ + (warp * MT * 16 + (lane & 15)) * ld<D>() + (lane >> 4) * 8);
  float o[MT][D / 8][4];
  zero(o);
  float m_run[MT][2], l_run[MT][2];
  Softmax<MT> softmax{m_run, l_run};
  softmax.start();

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * BN;
    kv_stream_step<D, BN, kT>(sK, sV, g.k, g.v, j, n_tiles, S, g.tok);
    const E* k_tile = sK + (j & 1) * BN * ld<D>();
    const E* v_tile = sV + (j & 1) * BN * ld<D>();

    std::uint32_t kbits[KeyMaskTiles<BN>::kWords];
    if constexpr (MASK) {
      key_tiles.take(kbits);
      if (j + 1 < n_tiles) key_tiles.load(j + 1);
    }
    // Causal: a warp whose last row precedes the tile's first key has nothing to add from it; a
    // tile whose keys are all masked adds nothing to any row.
    if ((!CAUSAL || n0 <= w0 + MT * 16 - 1) && (!MASK || any_key(kbits))) {
      // S = Q K^T, MT x 16 rows x BN keys (raw, unscaled); dead entries -inf.
      // Each K fragment feeds MT mma.
      float s[MT][BN / 8][4];
      zero(s);
      const std::uint32_t k_addr =
          mma::smem_addr(k_tile + ((lane & 7) + (lane >> 4) * 8) * ld<D>() + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t qa[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i) mma::ldmatrix_x4(qa[i], q_addr + (i * 16 * ld<D>() + kk * 16) * 2);
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          std::uint32_t bb[4];
          mma::ldmatrix_x4(bb, k_addr + (np * 16 * ld<D>() + kk * 16) * 2);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            mma::mma_16816<E>(s[i][2 * np], qa[i], bb[0], bb[1]);
            mma::mma_16816<E>(s[i][2 * np + 1], qa[i], bb[2], bb[3]);
          }
        }
      }
      mask.apply(s, w0, n0);
      if constexpr (MASK) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int n = 0; n < BN / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (!key_ok(kbits, n * 8 + 2 * t + (e & 1))) s[i][n][e] = -INFINITY;
      }

      std::uint32_t p[MT][BN / 16][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        softmax.template update<BN / 8, D>(i, s[i], o[i], scale_log2);
        if constexpr (DROP) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const std::uint64_t row_e = (bh_e + static_cast<std::uint64_t>(w0 + i * 16 + gi + 8 * h)) * S;
            const std::uint32_t keep = row_keep_bits<BN / 8>(dkey, opt.threshold, row_e, n0, S % 4 == 0);
#pragma unroll
            for (int n = 0; n < BN / 8; ++n)
#pragma unroll
              for (int c = 0; c < 2; ++c)
                if (!((keep >> (2 * n + c)) & 1u)) s[i][n][2 * h + c] = 0.f;
          }
        }
        to_a_frags<E, BN>(p[i], s[i]);
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
            mma::mma_16816<E>(o[i][2 * dp], p[i][ks], bb[0], bb[1]);
            mma::mma_16816<E>(o[i][2 * dp + 1], p[i][ks], bb[2], bb[3]);
          }
        }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

  // Epilogue: finish the row sums across the quad, normalize, store O and the log-sum-exp.
  E* gout = out + static_cast<std::size_t>(b) * S * H * D + static_cast<std::size_t>(head) * D;
  float* glse = head_vector(lse, b, head, S, H);
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = softmax.row_sum(i, h);
      // MASK: a row with no key left has l = 0 (and m = -inf): out 0, lse -inf.
      inv[h] = MASK && l == 0.f ? 0.f : (DROP ? opt.drop_scale : 1.f) / l;
      const int row = w0 + i * 16 + gi + 8 * h;
      if (t == 0 && row < S) glse[row] = softmax.lse(i, h, l);
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

template <int D, bool CAUSAL, bool MASK, bool DROP, typename E>
void launch_forward(cudaStream_t st, const E* qkv, E* out, float* lse, const AttentionShape& sh,
                    const OptionArgs& opt) {
  using T = Tile<Pass::Fwd, D, CAUSAL>;
  constexpr int kSmem = (T::kBlockM + 4 * T::kBlockN) * ld<D>() * 2;  // Q + 2 K + 2 V tiles
  auto kernel = forward_kernel<E, T, MASK, DROP>;
  CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid((sh.seq + T::kBlockM - 1) / T::kBlockM, sh.heads, sh.batch);
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(D));
  kernel<<<grid, T::kThreads, kSmem, st>>>(qkv, out, lse, sh.seq, sh.heads, scale_log2, opt);
  CUTRAIN_LAUNCH_CHECK("attention_forward_kernel");
}

template <int D, bool CAUSAL, typename E>
void launch_forward(cudaStream_t st, const E* qkv, E* out, float* lse, const AttentionShape& sh,
                    const OptionArgs& opt) {
  const bool mask = opt.key_mask != nullptr, drop = opt.threshold != 0;
  if (!mask && !drop) launch_forward<D, CAUSAL, false, false>(st, qkv, out, lse, sh, opt);
  else if (!drop) launch_forward<D, CAUSAL, true, false>(st, qkv, out, lse, sh, opt);
  else if (!mask) launch_forward<D, CAUSAL, false, true>(st, qkv, out, lse, sh, opt);
  else launch_forward<D, CAUSAL, true, true>(st, qkv, out, lse, sh, opt);
}

}  // namespace

template <typename E>
void attention_forward(cudaStream_t s, const E* qkv, E* out, float* lse, const AttentionShape& shape,
                       const AttentionOptions& options) {
  attn::check_shape(shape, "mma_attention::attention_forward");
  const OptionArgs opt = option_args(options);
  CUTRAIN_CHECK(qkv && out && lse, "mma_attention::attention_forward: qkv, out and lse must be non-null");
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(qkv) % 16 == 0 && reinterpret_cast<std::uintptr_t>(out) % 4 == 0,
                "mma_attention::attention_forward: qkv must be 16-byte aligned and out 4-byte aligned");
  const bool c = shape.causal;
  if (shape.head_dim == 64)
    c ? launch_forward<64, true>(s, qkv, out, lse, shape, opt)
      : launch_forward<64, false>(s, qkv, out, lse, shape, opt);
  else
    c ? launch_forward<128, true>(s, qkv, out, lse, shape, opt)
      : launch_forward<128, false>(s, qkv, out, lse, shape, opt);
}

template void attention_forward<bf16>(cudaStream_t, const bf16*, bf16*, float*, const AttentionShape&,
                                      const AttentionOptions&);
template void attention_forward<f16>(cudaStream_t, const f16*, f16*, float*, const AttentionShape&,
                                     const AttentionOptions&);

}  // namespace cutrain::bench::mma_attention
