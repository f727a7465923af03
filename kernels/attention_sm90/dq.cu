// @brief The deterministic attention backward's dQ pass (kernels::attention_backward with
// deterministic true, after the dK/dV pass of bwd.cu): wgmma tensor cores, TMA + mbarrier loads,
// no atomics (each query tile is owned by one CTA, so dQ has the same bits every run); E = bf16 or
// fp16. Built for sm_90a only (kernels/CMakeLists.txt); shapes and offsets in layout.h (DqConfig).
//
// The forward's pipeline (fwd.cu) with dO beside Q: CTA = one (batch, head) and kBlockM = 128
// queries; 2 consumer warpgroups (warps 0-3, 4-7) own 64 rows each, one producer warp (warp 8):
//   producer (lane 0 only): Q and dO once (q_full), then per K/V tile j of kBlockN keys, into ring
//     stage j % kStages after both consumers released that stage's previous tile (kv_empty): K
//     (k_full[s]) and V (v_full[s]), each as D/64 TMA boxes of 128-byte swizzled rows.
//   consumers, per tile: S = Q_w K^T and dP = dO_w V^T (wgmma, both operands K-major from shared
//     memory; two commit groups), P = exp2(S scale log2 e - lse log2 e) while dP is in flight,
//     dS = P o (dP - Dvec) (dead entries -- key past S, causal key > query, masked key -- have
//     P = 0), then dQ += dS K (wgmma, dS from registers as E, K read transposed like the forward's
//     V), then each consumer warp arrives on kv_empty[s].
// Each thread keeps the lse (times log2 e) and Dvec = rowsum(dO o O) of its two rows in registers
// (the family's row_dot wrote Dvec). The epilogue stores dQ x 1/sqrt(D) into dqkv's q slot with the
// family's store_rows. Serial schedule: every wgmma batch is waited for inside its tile; the overlap
// schedule (DqConfig::kOverlap, consume_overlap below) issues the next tile's S and dP behind dQ's.
// Causal: tiles past the CTA's last query are never loaded; a warpgroup whose rows all precede a
// tile skips its math but still waits for the tile and releases it (the forward's rule).
// BERT's options (template bools; the plain kernel has none of their code), the math of the
// family's dQ semantics (kernels/attention_bwd.cu): MASK, the CTA streams no tile past the last
// key it may attend (none: dQ = 0), and each consumer warp ballots a tile's mask bytes into bit
// words (the family's KeyMaskTiles, fetched right after the tile's wgmma are issued); a masked
// key's P is 0. DROP: dS = P o (dP o Z/(1-p) - Dvec) with the forward's keep bits Z (the family's
// row_keep_bits: the same Philox words for the same element), drawn under the S and dP wgmma at
// d64, before them at d128 (the dK/dV pass's placement).
#include <cuda.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention_sm90/attention_sm90.h"
#include "kernels/attention_sm90/layout.h"
#include "kernels/attention_sm90/query_tile_ring.cuh"
#include "kernels/attention_sm90/tensor_map.h"
#include "kernels/attention_sm90/wgmma_tma.cuh"
#include "kernels/attention_options.cuh"
#include "kernels/attention_softmax.cuh"
#include "kernels/attention_tiles.cuh"
#include "runtime/check.h"
#include "runtime/error.h"

namespace cutrain::kernels::sm90 {
namespace {

// A consumer thread's share of BERT's options (all of it compiled out of the plain kernel).
template <class Cfg, bool MASK, bool DROP>
struct DqOptions {
  attn::KeyMaskTiles<Cfg::kBlockN> keys;  // MASK
  DropoutKey dkey;                        // DROP: step resolved
  std::uint32_t threshold;
  float drop_scale;                       // 1 / (1 - p)
  std::uint64_t bh_e;                     // (b*H + head) * S: the element index of (b, head, query 0, key 0)
};

// Issues S = Q_w K^T, then dP = dO_w V^T (two commit groups, S first). One descriptor per
// operand, advanced per k16 step (desc_advance).
template <class Cfg, typename E>
__device__ __forceinline__ void issue_s_dp(float (&sc)[Cfg::kBlockN / 8][4], float (&dp)[Cfg::kBlockN / 8][4],
                                           std::uint32_t q_tile, std::uint32_t do_tile, std::uint32_t k_tile,
                                           std::uint32_t v_tile, int wg) {
  constexpr int D = Cfg::kHeadDim, BN = Cfg::kBlockN;
  const std::uint64_t qd = smem_desc(q_tile + Cfg::q_slice(wg, 0), kUnusedLbo, Cfg::kSbo);
  const std::uint64_t dod = smem_desc(do_tile + Cfg::q_slice(wg, 0), kUnusedLbo, Cfg::kSbo);
  const std::uint64_t kd = smem_desc(k_tile, kUnusedLbo, Cfg::kSbo);
  const std::uint64_t vd = smem_desc(v_tile, kUnusedLbo, Cfg::kSbo);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss<E, BN>(sc, desc_advance(qd, Cfg::q_slice(wg, kk) - Cfg::q_slice(wg, 0)), desc_advance(kd, Cfg::k_slice(kk)),
                    kk > 0);
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss<E, BN>(dp, desc_advance(dod, Cfg::q_slice(wg, kk) - Cfg::q_slice(wg, 0)),
                    desc_advance(vd, Cfg::k_slice(kk)), kk > 0);
  wgmma_commit();
}

// Issues dQ += dS K against the K tile at k_tile (one commit group): K read transposed (keys are
// the reduction index), as the forward reads V; dQ and dS pinned before the fence.
template <class Cfg, typename E>
__device__ __forceinline__ void issue_dq(float (&dq)[Cfg::kHeadDim / 8][4], std::uint32_t (&ds)[Cfg::kBlockN / 16][4],
                                         std::uint32_t k_tile) {
  const std::uint64_t kd = smem_desc(k_tile, Cfg::kKLbo, Cfg::kSbo);
  operand_fence(dq);
  operand_fence(ds);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Cfg::kBlockN / 16; ++ks) wgmma_rs<E, Cfg::kHeadDim>(dq, ds[ks], desc_advance(kd, Cfg::k_mn_slice(ks)), 1);
  wgmma_commit();
}

// One K/V tile for warpgroup wg (see the file comment): q_tile / do_tile / k_tile / v_tile are
// shared-window addresses of loaded tiles. row0: this warp's first query; l2 / dd: its rows'
// lse * log2 e and Dvec. Every wgmma batch is waited for before the function returns.
template <class Cfg, typename E, bool MASK, bool DROP>
__device__ __forceinline__ void dq_tile(float (&dq)[Cfg::kHeadDim / 8][4], DqOptions<Cfg, MASK, DROP>& opts,
                                        std::uint32_t q_tile, std::uint32_t do_tile, std::uint32_t k_tile,
                                        std::uint32_t v_tile, int j, int wg, int row0, const float (&l2)[2],
                                        const float (&dd)[2], int S, float scale_log2) {
  constexpr int D = Cfg::kHeadDim, BN = Cfg::kBlockN;
  const int lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const int n0 = j * BN;

  // DROP: keep bits of this thread's rows (bit 2n + c of keep[h]: key n0 + 8n + 2t + c of row
  // row0 + gi + 8h). d64: drawn under the S and dP wgmma; d128: before them, while their
  // accumulators are not yet live.
  constexpr bool kDrawUnder = D == 64;
  [[maybe_unused]] std::uint32_t keep[2] = {0, 0};
  [[maybe_unused]] auto draw = [&] {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      keep[h] = attn::row_keep_bits<BN / 8>(opts.dkey, opts.threshold,
                                            (opts.bh_e + static_cast<std::uint64_t>(row0 + gi + 8 * h)) * S, n0,
                                            S % 4 == 0);
  };
  if constexpr (DROP && !kDrawUnder) draw();

  // S and dP: two commit groups, S first.
  float sc[BN / 8][4], dp[BN / 8][4];
  issue_s_dp<Cfg, E>(sc, dp, q_tile, do_tile, k_tile, v_tile, wg);
  if constexpr (MASK) opts.keys.load(j);
  if constexpr (DROP && kDrawUnder) draw();

  [[maybe_unused]] std::uint32_t kbits[attn::KeyMaskTiles<BN>::kWords];
  if constexpr (MASK) opts.keys.take(kbits);

  // P while dP is still in flight. Element (n, e): query row0 + gi + 8(e >> 1), key n0 + 8n + 2t + (e & 1).
  wgmma_wait<1>();
  operand_fence(sc);
  const bool edge = n0 + BN > S || (Cfg::kCausal && n0 + BN - 1 > row0);
#pragma unroll
  for (int n = 0; n < BN / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 8 * n + 2 * t + (e & 1), col = n0 + c, row = row0 + gi + 8 * (e >> 1);
      // A select, not a product: a dead key's exp2 may be inf (zero-filled keys, lse -inf rows).
      bool dead = edge && (col >= S || (Cfg::kCausal && col > row));
      if constexpr (MASK) dead = dead || !attn::key_ok(kbits, c);
      sc[n][e] = dead ? 0.f : attn::scaled_exp2(sc[n][e], scale_log2, l2[e >> 1]);
    }

  // dS = P o (dP - Dvec) (DROP: dP o Z/(1-p)), as E A fragments.
  wgmma_wait<0>();
  operand_fence(dp);
#pragma unroll
  for (int n = 0; n < BN / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float dpe = dp[n][e];
      if constexpr (DROP) dpe = (keep[e >> 1] >> (2 * n + (e & 1))) & 1u ? dpe * opts.drop_scale : 0.f;
      dp[n][e] = sc[n][e] * (dpe - dd[e >> 1]);
    }
  std::uint32_t ds[BN / 16][4];
  attn::to_a_frags<E, BN>(ds, dp);

  issue_dq<Cfg, E>(dq, ds, k_tile);
  wgmma_wait<0>();
  operand_fence(dq);
  operand_fence(ds);
}

// The consumer warpgroups' K/V loop and epilogue.
template <class Cfg, typename E, bool MASK, bool DROP>
__device__ __forceinline__ void consume(std::uint32_t sQ, std::uint32_t sdO, std::uint32_t sK, std::uint32_t sV,
                                        const QueryTileBarriers<Cfg>& bar, const float* __restrict__ lse,
                                        const float* __restrict__ dvec, E* __restrict__ dqkv, int S, int H,
                                        float scale_log2, float scale, int m0, int n_tiles, int head, int b,
                                        const attn::OptionArgs& opt) {
  constexpr int D = Cfg::kHeadDim, ST = Cfg::kStages;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2;
  const int wg = warp >> 2;
  const int wg_row0 = m0 + 64 * wg, row0 = wg_row0 + 16 * (warp & 3);  // row0: this warp's first row

  DqOptions<Cfg, MASK, DROP> opts{};
  if constexpr (MASK) opts.keys = {opt.key_mask + static_cast<std::size_t>(b) * S, S, {}};
  if constexpr (DROP) {
    opts.dkey = opt.resolve_step();
    opts.threshold = opt.threshold;
    opts.drop_scale = opt.drop_scale;
    opts.bh_e = (static_cast<std::uint64_t>(b) * H + head) * S;
  }
  // This thread's rows row0 + gi (+8): lse * log2 e and Dvec (rows at or past S: 0, never stored).
  const float* glse = lse + (static_cast<std::size_t>(b) * H + head) * S;
  const float* gdvec = dvec + (static_cast<std::size_t>(b) * H + head) * S;
  float l2[2], dd[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + gi + 8 * h;
    l2[h] = r < S ? glse[r] * attn::kLog2e : 0.f;
    dd[h] = r < S ? gdvec[r] : 0.f;
  }
  float dq[D / 8][4];
  attn::zero(dq);

  mbar_wait(bar.q_full(), 0);
  for (int j = 0; j < n_tiles; ++j) {
    const int s = j % ST;
    const std::uint32_t phase = (j / ST) & 1;
    // Both tiles before the first wgmma: no wait (a divergent loop) between the wgmma of one batch,
    // which would make ptxas serialize them. A warpgroup with nothing to add from the tile (causal)
    // still waits for it and releases it, so the ring's phases stay in step.
    mbar_wait(bar.k_full(s), phase);
    mbar_wait(bar.v_full(s), phase);
    if (Cfg::tile_active(j, wg_row0))
      dq_tile<Cfg, E, MASK, DROP>(dq, opts, sQ, sdO, sK + s * Cfg::kKVBytes, sV + s * Cfg::kKVBytes, j, wg, row0, l2,
                                  dd, S, scale_log2);
    bar.release(s);  // this warp's reads of stage s are complete
  }

  E* gdq = dqkv + static_cast<std::size_t>(b) * S * 3 * H * D + static_cast<std::size_t>(head) * D;
  attn::store_rows<D>(gdq, dq, row0, S, 3ull * H * D, scale);
}

// ---- The overlap consumer loop (DqConfig::kOverlap) ----
// Per active tile j: tile j+1's S and dP are issued right behind tile j's dQ += dS K, so the
// tensor cores take them without the gap of dQ's wait, the release and the next fence; then the
// wait for the oldest group (tile j's product) releases stage j, as the forward's overlap loop
// retires P V behind the next S. The same
// products in the same order as the serial loop: the same dQ bits. The active tiles are a prefix
// (the forward's rule), the last one peeled by the loop's break; the skipped tail is waited for
// and released as in the serial loop. The plain instance only: with a key mask or dropout ptxas
// serialized the loop's wgmma (C7515; launch runs those instances' serial loop).
template <class Cfg, typename E, bool MASK, bool DROP>
__device__ __forceinline__ void consume_overlap(std::uint32_t sQ, std::uint32_t sdO, std::uint32_t sK,
                                                std::uint32_t sV, const QueryTileBarriers<Cfg>& bar,
                                                const float* __restrict__ lse, const float* __restrict__ dvec,
                                                E* __restrict__ dqkv, int S, int H, float scale_log2, float scale,
                                                int m0, int n_tiles, int head, int b, const attn::OptionArgs& opt) {
  static_assert(!MASK && !DROP, "with a key mask or dropout the dQ pass runs the serial loop (see launch)");
  (void)opt;
  constexpr int D = Cfg::kHeadDim, BN = Cfg::kBlockN, ST = Cfg::kStages;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const int wg = warp >> 2;
  const int wg_row0 = m0 + 64 * wg, row0 = wg_row0 + 16 * (warp & 3);
  const float* glse = lse + (static_cast<std::size_t>(b) * H + head) * S;
  const float* gdvec = dvec + (static_cast<std::size_t>(b) * H + head) * S;
  float l2[2], dd[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + gi + 8 * h;
    l2[h] = r < S ? glse[r] * attn::kLog2e : 0.f;
    dd[h] = r < S ? gdvec[r] : 0.f;
  }
  float dq[D / 8][4];
  attn::zero(dq);

  mbar_wait(bar.q_full(), 0);
  const int n_active = Cfg::active_tiles(n_tiles, wg_row0);
  if (n_active > 0) {
    float sc[BN / 8][4], dp[BN / 8][4];
    std::uint32_t ds[BN / 16][4] = {};
    mbar_wait(bar.k_full(0), 0);
    mbar_wait(bar.v_full(0), 0);
    issue_s_dp<Cfg, E>(sc, dp, sQ, sdO, sK, sV, wg);
    for (int j = 0;; ++j) {
      const int s = j % ST, n0 = j * BN;
      wgmma_wait<1>();  // S of tile j, the older of the two groups in flight
      operand_fence(sc);
      // P (dq_tile's): element (n, e) is query row0 + gi + 8(e >> 1), key n0 + 8n + 2t + (e & 1).
      const bool edge = n0 + BN > S || (Cfg::kCausal && n0 + BN - 1 > row0);
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n0 + 8 * n + 2 * t + (e & 1), row = row0 + gi + 8 * (e >> 1);
          const bool dead = edge && (col >= S || (Cfg::kCausal && col > row));
          sc[n][e] = dead ? 0.f : attn::scaled_exp2(sc[n][e], scale_log2, l2[e >> 1]);
        }
      wgmma_wait<0>();  // dP of tile j
      operand_fence(dp);
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[n][e] = sc[n][e] * (dp[n][e] - dd[e >> 1]);
      attn::to_a_frags<E, BN>(ds, dp);
      issue_dq<Cfg, E>(dq, ds, sK + s * Cfg::kKVBytes);
      if (j + 1 == n_active) {
        wgmma_wait<0>();  // the last active tile's dQ product
        operand_fence(dq);
        operand_fence(ds);
        bar.release(s);
        break;
      }
      const int s1 = (j + 1) % ST;
      const std::uint32_t phase1 = ((j + 1) / ST) & 1;
      mbar_wait(bar.k_full(s1), phase1);
      mbar_wait(bar.v_full(s1), phase1);
      issue_s_dp<Cfg, E>(sc, dp, sQ, sdO, sK + s1 * Cfg::kKVBytes, sV + s1 * Cfg::kKVBytes, wg);
      wgmma_wait<2>();  // tile j's dQ product, the oldest group: stage j is read
      operand_fence(dq);
      operand_fence(ds);
      bar.release(s);
    }
  }
  bar.skip_tiles(n_active, n_tiles);  // causal: tiles wholly after this warpgroup's rows

  E* gdq = dqkv + static_cast<std::size_t>(b) * S * 3 * H * D + static_cast<std::size_t>(head) * D;
  attn::store_rows<D>(gdq, dq, row0, S, 3ull * H * D, scale);
}

template <class Cfg, typename E, bool MASK, bool DROP>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    dq_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kv_map,
              const __grid_constant__ CUtensorMap do_map, const float* __restrict__ lse,
              const float* __restrict__ dvec, E* __restrict__ dqkv, int S, int H, int B, int group,
              float scale_log2, float scale, const __grid_constant__ attn::OptionArgs opt) {
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, ST = Cfg::kStages;
  constexpr bool CAUSAL = Cfg::kCausal;
  extern __shared__ unsigned char smem_raw[];
  // Shared-window addresses; the TMA's 128-byte swizzle and wgmma's need 1024-aligned tiles.
  const std::uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const std::uint32_t sQ = base + Cfg::kQOff, sdO = base + Cfg::kdOOff, sK = base + Cfg::kKOff,
                      sV = base + Cfg::kVOff;
  const QueryTileBarriers<Cfg> bar{base + Cfg::kBarOff};

  // Causal: a 1-D grid in the forward's order (work_tile: sections of (batch, head) pairs, heaviest
  // query tiles first); otherwise a (query tile, head, batch) grid.
  const auto t = CAUSAL ? Cfg::work_tile(blockIdx.x, gridDim.x / (H * B), H, B, group)
                        : typename Cfg::Work{static_cast<int>(blockIdx.x) * BM, static_cast<int>(blockIdx.y),
                                             static_cast<int>(blockIdx.z)};
  const int m0 = t.m0, head = t.head, b = t.b;
  int n_tiles = Cfg::kv_tiles(S, m0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  if (threadIdx.x == 0) bar.init();
  __syncthreads();
  if constexpr (MASK)  // no tile past the last key the CTA may attend (every thread gets the same count)
    n_tiles = Cfg::masked_kv_tiles(n_tiles, attn::last_valid_key<Cfg::kThreads>(
                                                opt.key_mask + static_cast<std::size_t>(b) * S, min(S, n_tiles * BN)));
  // No CTA-wide barrier from here on: the producer's idle threads leave below.

  if (warp == Cfg::kProducerWarp) {
    if (lane == 0) {
      mbar_arrive_expect_tx(bar.q_full(), 2 * Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kColBlocks; ++c) {
        tma_load_5d(sQ + c * BM * 128, &q_map, 64 * c, head, 0, m0, b, bar.q_full());
        tma_load_5d(sdO + c * BM * 128, &do_map, 64 * c, head, 0, m0, b, bar.q_full());
      }
      for (int j = 0; j < n_tiles; ++j) {
        const int s = j % ST;
        if (j >= ST) mbar_wait(bar.kv_empty(s), ((j / ST) - 1) & 1);
        mbar_arrive_expect_tx(bar.k_full(s), Cfg::kKVBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kColBlocks; ++c)
          tma_load_5d(sK + s * Cfg::kKVBytes + c * BN * 128, &kv_map, 64 * c, head, 1, j * BN, b, bar.k_full(s));
        mbar_arrive_expect_tx(bar.v_full(s), Cfg::kKVBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kColBlocks; ++c)
          tma_load_5d(sV + s * Cfg::kKVBytes + c * BN * 128, &kv_map, 64 * c, head, 2, j * BN, b, bar.v_full(s));
      }
    }
  } else {
    if constexpr (Cfg::kOverlap)
      consume_overlap<Cfg, E, MASK, DROP>(sQ, sdO, sK, sV, bar, lse, dvec, dqkv, S, H, scale_log2, scale, m0, n_tiles,
                                          head, b, opt);
    else
      consume<Cfg, E, MASK, DROP>(sQ, sdO, sK, sV, bar, lse, dvec, dqkv, S, H, scale_log2, scale, m0, n_tiles, head,
                                  b, opt);
  }
}

template <int D, bool CAUSAL, bool OVERLAP, bool MASK, bool DROP, typename E>
void launch(cudaStream_t st, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
            const AttentionShape& sh, const attn::OptionArgs& opt) {
  using Cfg = DqConfig<D, CAUSAL, OVERLAP>;
  const CUtensorMap q_map = encode_qkv_map(qkv, sh, Cfg::kBlockM);
  const CUtensorMap kv_map = encode_qkv_map(qkv, sh, Cfg::kBlockN);
  const CUtensorMap do_map = encode_rows_map(dout, sh, 1, Cfg::kBlockM);
  auto kernel = dq_kernel<Cfg, E, MASK, DROP>;
  CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const int nq = (sh.seq + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const dim3 grid = CAUSAL ? dim3(nq * sh.heads * sh.batch) : dim3(nq, sh.heads, sh.batch);
  const int group = causal_group(sh.seq, D, sh.heads * sh.batch);
  const float scale = 1.f / std::sqrt(static_cast<float>(D)), scale_log2 = scale * attn::kLog2e;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, st>>>(q_map, kv_map, do_map, lse, dvec, dqkv, sh.seq, sh.heads,
                                                       sh.batch, group, scale_log2, scale, opt);
  CUTRAIN_LAUNCH_CHECK("attention sm90 dq_kernel");
}

// The options' instance: the key mask where one is given, dropout where p > 0.
template <int D, bool CAUSAL, bool OVERLAP, typename E>
void launch(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
            const AttentionShape& sh, const attn::OptionArgs& opt) {
  // The overlap loop with a key mask or dropout runs the serial loop: compiled, ptxas serialized
  // every wgmma of those instances (C7515, "non wgmma instructions defining accumulator registers";
  // CUDA 13.0), wherever the mask fetch and the keep bits were placed.
  const bool mask = opt.key_mask != nullptr, drop = opt.threshold != 0;
  if (!mask && !drop) launch<D, CAUSAL, OVERLAP, false, false>(s, qkv, dout, lse, dvec, dqkv, sh, opt);
  else if (!drop) launch<D, CAUSAL, false, true, false>(s, qkv, dout, lse, dvec, dqkv, sh, opt);
  else if (!mask) launch<D, CAUSAL, false, false, true>(s, qkv, dout, lse, dvec, dqkv, sh, opt);
  else launch<D, CAUSAL, false, true, true>(s, qkv, dout, lse, dvec, dqkv, sh, opt);
}

template <bool OVERLAP, typename E>
void launch(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
            const AttentionShape& sh, const attn::OptionArgs& opt) {
  const bool c = sh.causal;
  // d128 runs the serial loop under either schedule: its overlap loop holds dQ (64), the next S and
  // dP (64) and dS (16) at once and spilled 256 bytes under the 168-register cap (ptxas, CUDA 13.0).
  if (sh.head_dim == 64)
    c ? launch<64, true, OVERLAP>(s, qkv, dout, lse, dvec, dqkv, sh, opt)
      : launch<64, false, OVERLAP>(s, qkv, dout, lse, dvec, dqkv, sh, opt);
  else
    c ? launch<128, true, false>(s, qkv, dout, lse, dvec, dqkv, sh, opt)
      : launch<128, false, false>(s, qkv, dout, lse, dvec, dqkv, sh, opt);
}

}  // namespace

std::uint32_t dq_smem_bytes(int head_dim) {
  return head_dim == 64 ? DqConfig<64, false>::kSmemBytes : DqConfig<128, false>::kSmemBytes;
}

template <typename E>
void dq_pass(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
             const AttentionShape& sh, const attn::OptionArgs& opt, DqSchedule schedule) {
  schedule == DqSchedule::Overlap ? launch<true>(s, qkv, dout, lse, dvec, dqkv, sh, opt)
                                  : launch<false>(s, qkv, dout, lse, dvec, dqkv, sh, opt);
}

template void dq_pass<bf16>(cudaStream_t, const bf16*, const bf16*, const float*, const float*, bf16*,
                            const AttentionShape&, const attn::OptionArgs&, DqSchedule);
template void dq_pass<f16>(cudaStream_t, const f16*, const f16*, const float*, const float*, f16*,
                           const AttentionShape&, const attn::OptionArgs&, DqSchedule);

}  // namespace cutrain::kernels::sm90
