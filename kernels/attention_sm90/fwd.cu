// @brief The attention forward (kernels::attention_forward): warp-specialized, TMA + mbarrier
// pipeline, wgmma tensor cores; E = bf16 or fp16 (wgmma's .bf16 / .f16 inputs, the tensor maps'
// element type and P's conversion follow E; the fp32 softmax is the same). Built for sm_90a only
// (kernels/CMakeLists.txt).
//
// Work tile = one (batch, head) and FwdConfig::kBlockM query rows: 128 (FwdTile::Rows128) or 192
// (Rows192, d64); its consumer warpgroups (warps 0-3, 4-7[, 8-11]) own 64 rows each, the producer
// warpgroup after them (its first warp's lane 0 issues) feeds them. Without causal the CTAs are persistent (at most one per SM, FwdConfig::kPersistent),
// each looping over work tiles; causal runs one work tile per CTA (in sections of (batch, head)
// pairs, heaviest query tiles first, FwdConfig::work_tile):
//   producer: per work tile, Q into Q buffer it % kQBuffers once the consumers handed it back
//     (q_full / q_empty), then per K/V tile of kBlockN keys, into the ring's next stage after both
//     consumers released that stage's previous tile (kv_empty): K (k_full[s]) and V (v_full[s]),
//     each as D/64 TMA boxes of 128-byte swizzled rows. The ring runs on across work tiles, so the
//     next work tile's Q and K/V arrive under the current one's last products and its epilogue.
//     Its thread starts the first work tile's Q and first tiles before the CTA barrier.
//   consumers: S = Q K^T (wgmma, both operands from shared memory, K-major), the causal / sequence
//     -end mask and the online softmax in registers (the attention family's Softmax, Mask and
//     to_a_frags, kernels/attention_softmax.cuh / attention_tiles.cuh: the wgmma accumulator is
//     the mma.sync C fragment per 8 columns), then
//     O += P V (wgmma, P from registers, V read transposed from shared memory), then each consumer
//     warp arrives on kv_empty[s]. The epilogue normalizes O and stores it (d64: through each
//     warp's shared staging, whole 128-byte rows; d128, which has no room for it: the family's
//     store_rows) and the log-sum-exp.
// The consumer schedule is FlashAttention-3's ping-pong (consume): the warpgroups take
// turns, round-robin, at issuing their wgmma through one named barrier each, and each one's softmax
// runs while the others' products do (see consume for where ptxas puts P V's wait); the producer
// warpgroup hands its registers to the
// consumers (setmaxnreg: 24 / 240 with two consumers, 24 / 160 with three), which makes room for
// both score buffers and for 128-key tiles at d128.
// Causal: tiles past the CTA's last query are never loaded; a warpgroup whose rows all precede a
// tile skips its math but still waits for the tile and releases it, so the ring's phases stay in
// step for both consumers.
// BERT's options (kernels::AttentionOptions), template bools, so the plain kernel compiles as
// before. MASK: the CTA first finds the last key it may attend and streams no tile past it (no
// tile at all: O = 0, lse = -inf); each consumer warp fetches a tile's mask bytes right after
// issuing its S and ballots them into bit words before the softmax (the family's
// KeyMaskTiles), masked keys scoring -inf. DROP: after the online softmax (so lse stays that of the
// undropped softmax), the family's keep bits (row_keep_bits: the same Philox words for
// the same (seed, step, layer, element)) zero the dropped probabilities fed to P V, and the
// epilogue scales O by 1/(1-p) once.
#include <cuda.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention_sm90/attention_sm90.h"
#include "kernels/attention_sm90/layout.h"
#include "kernels/attention_sm90/production.h"
#include "kernels/attention_sm90/query_tile_ring.cuh"
#include "kernels/attention_sm90/tensor_map.h"
#include "kernels/attention_sm90/wgmma_tma.cuh"
#include "kernels/attention_options.cuh"
#include "kernels/attention_softmax.cuh"
#include "kernels/attention_tiles.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/error.h"

namespace cutrain::kernels::sm90 {
namespace {

// Issues S = Q K^T for warpgroup wg against the K tile at k_tile (one commit group; the first
// k16 step overwrites sc). One descriptor per operand, advanced per k16 step (desc_advance).
template <class Cfg, typename E>
__device__ __forceinline__ void issue_scores(float (&sc)[Cfg::kBlockN / 8][4], std::uint32_t sQ, std::uint32_t k_tile,
                                             int wg) {
  const std::uint64_t qd = smem_desc(sQ + Cfg::q_slice(wg, 0), kUnusedLbo, Cfg::kSbo);
  const std::uint64_t kd = smem_desc(k_tile, kUnusedLbo, Cfg::kSbo);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk)
    wgmma_ss<E, Cfg::kBlockN>(sc, desc_advance(qd, Cfg::q_slice(wg, kk) - Cfg::q_slice(wg, 0)),
                              desc_advance(kd, Cfg::k_slice(kk)), kk > 0);
  wgmma_commit();
}

// Issues O += P V against the V tile at v_tile (one commit group). O (rescaled by the softmax)
// and P (packed from the scores) are pinned before the fence.
template <class Cfg, typename E>
__device__ __forceinline__ void issue_pv(float (&o)[Cfg::kHeadDim / 8][4], std::uint32_t (&p)[Cfg::kBlockN / 16][4],
                                         std::uint32_t v_tile) {
  const std::uint64_t vd = smem_desc(v_tile, Cfg::kVLbo, Cfg::kSbo);
  operand_fence(o);
  operand_fence(p);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Cfg::kBlockN / 16; ++ks)
    wgmma_rs<E, Cfg::kHeadDim>(o, p[ks], desc_advance(vd, Cfg::v_slice(ks)), 1);
  wgmma_commit();
}

// A consumer warp's share of BERT's options (all of it compiled out of the plain kernel).
// MASK: fetch(j) loads tile j's mask bytes (issued right after tile j's S, so they arrive under the
// wgmma), mask_scores turns them into bit words (one ballot per 32 keys) and sets the masked
// scores to -inf; fetch and mask_scores alternate, tile by tile, in the order the softmax visits
// the tiles. DROP: drop zeroes the probabilities the family's keep bits (row_keep_bits) drop.
template <class Cfg, bool MASK, bool DROP>
struct FwdOptions {
  static constexpr int BN = Cfg::kBlockN;
  attn::KeyMaskTiles<BN> keys;  // MASK
  DropoutKey dkey;     // DROP: step resolved
  std::uint32_t threshold;
  std::uint64_t bh_e;  // (b*H + head) * S: the element index of (b, head, query 0, key 0)
  int S;

  __device__ __forceinline__ void fetch(int j) {
    if constexpr (MASK) keys.load(j);
  }
  __device__ __forceinline__ void mask_scores(float (&sc)[BN / 8][4]) {
    if constexpr (MASK) {
      std::uint32_t bits[attn::KeyMaskTiles<BN>::kWords];
      keys.take(bits);
      const int t = threadIdx.x & 3;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!attn::key_ok(bits, 8 * n + 2 * t + (e & 1))) sc[n][e] = -INFINITY;
    }
  }
  // Probabilities (after the softmax) of tile j, rows row0 + gi (+8): element (n, e) of the
  // accumulator is key 8n + 2t + (e & 1) of the tile, as in the mma.sync C fragments row_keep_bits serves.
  // row_keep_bits covers at most 8 n-tiles per call: 64-key chunks, then the rest (96-key tiles).
  __device__ __forceinline__ void drop(float (&sc)[BN / 8][4], int j, int row0) const {
    if constexpr (DROP) {
      const int gi = (threadIdx.x & 31) >> 2;
      const bool aligned = S % 4 == 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const std::uint64_t row_e = (bh_e + static_cast<std::uint64_t>(row0 + gi + 8 * h)) * S;
#pragma unroll
        for (int c = 0; c < BN / 64; ++c)
          apply<8>(sc, h, 8 * c, attn::row_keep_bits<8>(dkey, threshold, row_e, j * BN + 64 * c, aligned));
        if constexpr (BN % 64 != 0) {
          constexpr int kRest = (BN % 64) / 8, kFirst = 8 * (BN / 64);
          apply<kRest>(sc, h, kFirst, attn::row_keep_bits<kRest>(dkey, threshold, row_e, j * BN + 8 * kFirst, aligned));
        }
      }
    }
  }
  // Bit 2n + c of keep: element (n_first + n, 2h + c) is kept.
  template <int NT>
  __device__ __forceinline__ static void apply(float (&sc)[BN / 8][4], int h, int n_first, std::uint32_t keep) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        if (!((keep >> (2 * n + c)) & 1u)) sc[n_first + n][2 * h + c] = 0.f;
  }
};

// Finished scores of tile j (sc, fenced after their wait) -> the causal / sequence-end mask and the
// key mask, the online softmax (rescales O), dropout, P's A fragments. row0: this warp's first
// query row.
template <class Cfg, typename E, bool MASK, bool DROP>
__device__ __forceinline__ void softmax_tile(const attn::Mask<Cfg::kCausal>& mask, attn::Softmax<1>& softmax,
                                             FwdOptions<Cfg, MASK, DROP>& opts, float (&o)[Cfg::kHeadDim / 8][4],
                                             float (&sc)[Cfg::kBlockN / 8][4],
                                             std::uint32_t (&p)[Cfg::kBlockN / 16][4], int j, int row0,
                                             float scale_log2) {
  constexpr int BN = Cfg::kBlockN;
  mask.apply(attn::one_mtile(sc), row0, j * BN);
  opts.mask_scores(sc);
  softmax.template update<BN / 8, Cfg::kHeadDim>(0, sc, o, scale_log2);
  opts.drop(sc, j, row0);
  attn::to_a_frags<E, BN>(p, sc);
}

// A warp's 16 rows of O (rows row0.., D columns; rows at or past S are skipped) to global memory at
// g (rows `stride` elements apart) through its staging at `stage` (o_stage_offset's layout):
// four matrices per stmatrix, then 16-byte copies, each warp-wide copy four (d64) whole 128-byte
// rows. Stored from the fragments, a warp's store would write 16 bytes of each of 8 rows.
template <int D, typename E>
__device__ __forceinline__ void store_rows_staged(E* __restrict__ g, const float (&o)[D / 8][4], int row0, int S,
                                                  std::size_t stride, std::uint32_t stage) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  const int lane = threadIdx.x & 31, mi = lane >> 3, r = (lane & 7) + 8 * (mi & 1);
  __syncwarp();  // the previous work tile's copy-out has read the staging
#pragma unroll
  for (int k = 0; k < D / 16; ++k)
    stmatrix_x4(stage + o_stage_offset(r, 2 * k + (mi >> 1), D), mma::pack2<E>(o[2 * k][0], o[2 * k][1]),
                mma::pack2<E>(o[2 * k][2], o[2 * k][3]), mma::pack2<E>(o[2 * k + 1][0], o[2 * k + 1][1]),
                mma::pack2<E>(o[2 * k + 1][2], o[2 * k + 1][3]));
  __syncwarp();
#pragma unroll
  for (int i = 0; i < D / 16; ++i) {
    const int idx = 32 * i + lane, rr = idx / kChunks, c = idx % kChunks;
    const uint4 v = ld_shared_v4(stage + o_stage_offset(rr, c, D));
    if (row0 + rr < S) st_global_v4(g + static_cast<std::size_t>(row0 + rr) * stride + 8 * c, v);
  }
}

// Finish the row sums across the quad, normalize (times out_scale:
// dropout's 1/(1-p)), store O (staged through this warp's o_stage where Cfg::kStageO) and the
// log-sum-exp (rows at or past S are skipped). MASK: a row with no key left has l = 0 and m =
// -inf: O = 0, lse = -inf.
template <class Cfg, bool MASK, typename E>
__device__ __forceinline__ void epilogue(const attn::Softmax<1>& softmax, float (&o)[Cfg::kHeadDim / 8][4], int row0,
                                         E* __restrict__ out, float* __restrict__ lse, int S, int H, int head,
                                         int b, float out_scale, std::uint32_t o_stage) {
  constexpr int D = Cfg::kHeadDim;
  const int lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  E* gout = out + static_cast<std::size_t>(b) * S * H * D + static_cast<std::size_t>(head) * D;
  float* glse = lse + (static_cast<std::size_t>(b) * H + head) * S;
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = softmax.row_sum(0, h);
    inv[h] = MASK && l == 0.f ? 0.f : out_scale / l;
    const int row = row0 + gi + 8 * h;
    if (t == 0 && row < S) glse[row] = softmax.lse(0, h, l);
  }
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    o[d][0] *= inv[0];
    o[d][1] *= inv[0];
    o[d][2] *= inv[1];
    o[d][3] *= inv[1];
  }
  if constexpr (Cfg::kStageO)
    store_rows_staged<D>(gout, o, row0, S, static_cast<std::size_t>(H) * D, o_stage);
  else
    attn::store_rows<D>(gout, o, row0, S, static_cast<std::size_t>(H) * D, 1.f);
}

// The consumer warpgroups' share of work tile t (n_tiles K/V tiles), the CTA's it-th (its Q in
// buffer it % kQBuffers), whose first K/V tile is the ring's g0-th: the loop and the epilogue.
// The loop is FlashAttention-3's inter-warpgroup ping-pong. A
// turn is the stretch in which a warpgroup issues its wgmma: bar.sync on its own turn barrier, the
// issues, bar.arrive on the next one's (layout.h's turn_barrier / turn_next / turn_opens /
// turn_passes), so the warpgroups' batches reach the tensor cores in turn and each one's softmax
// runs while the others' products do. Turn 0 issues tile 0's S;
// turn j (1 <= j < active tiles) issues tile j's S, then tile j-1's P V; the source places the
// softmax of tile j (mask, max, exp2, row sums, dropout) between S's wait and P V's, and O's
// rescale and P's packing after P V's (they touch its accumulator and A operand). ptxas schedules
// P V's wait at the top of the softmax's basic block (`scripts/sass_wgmma_overlap.py` shows no
// MUFU between the two waits), so the softmax runs after this warpgroup's P V, under the other
// warpgroups' batches. Ending the block before the wait (a never-taken branch on the row sums)
// puts the softmax under its own P V, and measured 1-8% slower on the H100 at every shape but
// one (d64 S512 without causal, 5% faster; docs/perf-notes.md), so the loop leaves ptxas its choice. The last P V follows the turns. Both warpgroups
// take n_tiles turns (the CTA's count): a causal warpgroup's skipped tail tiles are turns without
// wgmma, so the barriers stay balanced. Both K and V a turn reads are waited for before it opens.
// Its waits are mbar_wait_realloc: a `trap` would cap this code at the launch's 168 registers.
template <class Cfg, typename E, bool MASK, bool DROP>
__device__ __forceinline__ void consume(std::uint32_t sQ0, std::uint32_t sK, std::uint32_t sV, std::uint32_t sO,
                                        const QueryTileBarriers<Cfg>& bar, E* __restrict__ out, float* __restrict__ lse,
                                        int S, int H, float scale_log2, const typename Cfg::Work& t, int n_tiles,
                                        int it, int g0, const attn::OptionArgs& opt) {
  using Ring = QueryTileBarriers<Cfg>;
  constexpr int BN = Cfg::kBlockN;
  const int m0 = t.m0, head = t.head, b = t.b;
  const int qb = it % Cfg::kQBuffers;
  const std::uint32_t q_phase = (it / Cfg::kQBuffers) & 1, sQ = sQ0 + qb * Cfg::kQBytes;
  const int warp = threadIdx.x >> 5;
  const int wg = warp >> 2;
  const int wg_row0 = m0 + 64 * wg, row0 = wg_row0 + 16 * (warp & 3);  // row0: this warp's first row
  float o[Cfg::kHeadDim / 8][4];
  attn::zero(o);
  float m_run[1][2], l_run[1][2];
  attn::Softmax<1> softmax{m_run, l_run};
  softmax.start();
  const attn::Mask<Cfg::kCausal> mask{S};
  float sc[BN / 8][4];          // raw scores of the tile in hand
  std::uint32_t p[BN / 16][4];  // the previous tile's probabilities as wgmma A fragments
  FwdOptions<Cfg, MASK, DROP> opts{};
  if constexpr (MASK) opts.keys = {opt.key_mask + static_cast<std::size_t>(b) * S, S, {}};
  if constexpr (DROP) {
    opts.dkey = opt.resolve_step();
    opts.threshold = opt.threshold;
    opts.bh_e = (static_cast<std::uint64_t>(b) * H + head) * S;
  }
  opts.S = S;
  const int turns = n_tiles;  // uniform over the CTA
  const int next = Cfg::turn_next(wg), mine = Cfg::turn_barrier(wg);

  if (Cfg::turn_opens(wg, turns)) named_barrier_arrive(next, Cfg::kTurnThreads);
  mbar_wait_realloc(bar.q_full(qb), q_phase);
  const int n_active = Cfg::live_tiles(n_tiles, wg_row0, S);
  if (n_active > 0) {  // tile 0 is active unless MASK left no tile or the rows lie past S; tile j is the ring's (g0 + j)-th
    mbar_wait_realloc(bar.k_full(Ring::stage(g0)), Ring::phase(g0));
    named_barrier_sync(mine, Cfg::kTurnThreads);
    issue_scores<Cfg, E>(sc, sQ, sK + Ring::stage(g0) * Cfg::kKVBytes, wg);
    if (Cfg::turn_passes(wg, 0, turns)) named_barrier_arrive(next, Cfg::kTurnThreads);
    opts.fetch(0);
    wgmma_wait<0>();
    operand_fence(sc);
    softmax_tile<Cfg, E>(mask, softmax, opts, o, sc, p, 0, row0, scale_log2);  // O is 0: its rescale is moot
    for (int j = 1; j < n_active; ++j) {
      const int s = Ring::stage(g0 + j), sp = Ring::stage(g0 + j - 1);
      mbar_wait_realloc(bar.k_full(s), Ring::phase(g0 + j));
      mbar_wait_realloc(bar.v_full(sp), Ring::phase(g0 + j - 1));
      named_barrier_sync(mine, Cfg::kTurnThreads);
      issue_scores<Cfg, E>(sc, sQ, sK + s * Cfg::kKVBytes, wg);
      issue_pv<Cfg, E>(o, p, sV + sp * Cfg::kKVBytes);
      if (Cfg::turn_passes(wg, j, turns)) named_barrier_arrive(next, Cfg::kTurnThreads);
      opts.fetch(j);
      wgmma_wait<1>();  // S of tile j; P V of tile j-1 still in flight
      operand_fence(sc);
      float alpha[2];
      mask.apply(attn::one_mtile(sc), row0, j * BN);
      opts.mask_scores(sc);
      softmax.template fold<BN / 8>(0, sc, alpha, scale_log2);
      opts.drop(sc, j, row0);
      wgmma_wait<0>();  // P V of tile j-1
      operand_fence(o);
      operand_fence(p);
      bar.release(sp);
      attn::Softmax<1>::rescale<Cfg::kHeadDim>(o, alpha);
      attn::to_a_frags<E, BN>(p, sc);
    }
    bar.release_q(qb);  // every S of this work tile is complete: the next Q may load under the last P V
    const int j = n_active - 1, s = Ring::stage(g0 + j);  // the last P V, after the turns
    mbar_wait_realloc(bar.v_full(s), Ring::phase(g0 + j));
    issue_pv<Cfg, E>(o, p, sV + s * Cfg::kKVBytes);
    wgmma_wait<0>();
    operand_fence(o);
    operand_fence(p);
    bar.release(s);
  } else {
    bar.release_q(qb);
  }
  for (int j = n_active; j < n_tiles; ++j) {  // tiles wholly after this warpgroup's rows (causal), or rows past S
    const int s = Ring::stage(g0 + j);
    const std::uint32_t phase = Ring::phase(g0 + j);
    named_barrier_sync(mine, Cfg::kTurnThreads);
    if (Cfg::turn_passes(wg, j, turns)) named_barrier_arrive(next, Cfg::kTurnThreads);
    mbar_wait_realloc(bar.k_full(s), phase);
    mbar_wait_realloc(bar.v_full(s), phase);
    bar.release(s);
  }
  epilogue<Cfg, MASK>(softmax, o, row0, out, lse, S, H, head, b, DROP ? opt.drop_scale : 1.f,
                      sO + warp * Cfg::kOWarpBytes);
}

// The producer thread's copies: Q of a work tile into a Q buffer (completing on `full`), its K/V
// tile j into ring stage s.
template <class Cfg>
__device__ __forceinline__ void load_q(const CUtensorMap* q_map, std::uint32_t dst, std::uint32_t full, int head,
                                       int m0, int b) {
  mbar_arrive_expect_tx(full, Cfg::kQBytes);
#pragma unroll
  for (int c = 0; c < Cfg::kColBlocks; ++c) tma_load_5d(dst + c * Cfg::kBlockM * 128, q_map, 64 * c, head, 0, m0, b, full);
}
template <class Cfg>
__device__ __forceinline__ void load_kv(const CUtensorMap* kv_map, std::uint32_t sK, std::uint32_t sV,
                                        const QueryTileBarriers<Cfg>& bar, int head, int b, int s, int j) {
  mbar_arrive_expect_tx(bar.k_full(s), Cfg::kKVBytes);
#pragma unroll
  for (int c = 0; c < Cfg::kColBlocks; ++c)
    tma_load_5d(sK + s * Cfg::kKVBytes + c * Cfg::kBlockN * 128, kv_map, 64 * c, head, 1, j * Cfg::kBlockN, b,
                bar.k_full(s));
  mbar_arrive_expect_tx(bar.v_full(s), Cfg::kKVBytes);
#pragma unroll
  for (int c = 0; c < Cfg::kColBlocks; ++c)
    tma_load_5d(sV + s * Cfg::kKVBytes + c * Cfg::kBlockN * 128, kv_map, 64 * c, head, 2, j * Cfg::kBlockN, b,
                bar.v_full(s));
}

// The K/V tiles work tile t streams (MASK: none past the last key its sequence lets be attended).
// MASK: every lane of the calling warp takes part (a warp-wide scan), and gets the same count.
template <class Cfg, bool MASK>
__device__ __forceinline__ int work_kv_tiles(const typename Cfg::Work& t, int S, const attn::OptionArgs& opt) {
  const int n = Cfg::kv_tiles(S, t.m0);
  if constexpr (MASK)
    return Cfg::masked_kv_tiles(
        n, attn::last_valid_key_warp(opt.key_mask + static_cast<std::size_t>(t.b) * S, min(S, n * Cfg::kBlockN)));
  return n;
}

// The producer thread's share of work tile t (n K/V tiles), the CTA's it-th, whose first K/V tile
// is the ring's g-th: Q into buffer it % kQBuffers once the consumers handed that buffer back,
// then its K/V tiles into the ring's next stages as the consumers free them. Without MASK the
// first work tile's Q and its first `early` K/V tiles went before the CTA barrier.
template <class Cfg, bool MASK>
__device__ __forceinline__ void produce(const CUtensorMap* q_map, const CUtensorMap* kv_map, std::uint32_t sQ,
                                        std::uint32_t sK, std::uint32_t sV, const QueryTileBarriers<Cfg>& bar,
                                        const typename Cfg::Work& t, int n, int it, int g, int early) {
  using Ring = QueryTileBarriers<Cfg>;
  constexpr int NQ = Cfg::kQBuffers;
  if ((threadIdx.x & 31) == 0) {
    const int qb = it % NQ;
    if (MASK || it > 0) {
      if (it >= NQ) mbar_wait_realloc(bar.q_empty(qb), ((it / NQ) - 1) & 1);
      load_q<Cfg>(q_map, sQ + qb * Cfg::kQBytes, bar.q_full(qb), t.head, t.m0, t.b);
    }
    for (int j = it == 0 ? early : 0; j < n; ++j) {
      const int r = g + j;
      if (r >= Cfg::kStages) mbar_wait_realloc(bar.kv_empty(Ring::stage(r)), Ring::phase(r) ^ 1u);
      load_kv<Cfg>(kv_map, sK, sV, bar, t.head, t.b, Ring::stage(r), j);
    }
  }
}

// A persistent CTA takes work tiles w = blockIdx.x, + gridDim.x, ... of the work_tiles
// (FwdConfig::work_tile, grid_ctas); causal CTAs run work tile blockIdx.x alone, loop state 0.
template <class Cfg, typename E, bool MASK, bool DROP>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    forward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kv_map,
                   E* __restrict__ out, float* __restrict__ lse, int S, int H, int B, float scale_log2,
                   int work_tiles, int group,
                   const __grid_constant__ attn::OptionArgs opt) {
  constexpr int ST = Cfg::kStages;
  extern __shared__ unsigned char smem_raw[];
  // Shared-window addresses; the TMA's 128-byte swizzle and wgmma's need 1024-aligned tiles.
  const std::uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const std::uint32_t sQ = base + Cfg::kQOff, sK = base + Cfg::kKOff, sV = base + Cfg::kVOff, sO = base + Cfg::kOOff;
  const QueryTileBarriers<Cfg> bar{base + Cfg::kBarOff};
  const int nq = (S + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int warp = threadIdx.x >> 5;

  // The producer thread initializes the barriers and at once starts the first work tile's Q and
  // (without a key mask, whose scan decides the tile count) its first K/V tiles, before the CTA
  // barrier: at S <= 512 a work tile streams 1-4 tiles, so the pipeline's fill is much of its time.
  const typename Cfg::Work first = Cfg::work_tile(blockIdx.x, nq, H, B, group);
  int n_first = Cfg::kv_tiles(S, first.m0);
  int early = 0;  // K/V tiles issued before the CTA barrier
  if (threadIdx.x == 32 * Cfg::kProducerWarp) {
    bar.init();
    if constexpr (!MASK) {
      load_q<Cfg>(&q_map, sQ, bar.q_full(0), first.head, first.m0, first.b);
      for (; early < ST && early < n_first; ++early)
        load_kv<Cfg>(&kv_map, sK, sV, bar, first.head, first.b, early, early);
    }
  }
  __syncthreads();
  // MASK, one work tile a CTA: the whole CTA finds the first (and only) work tile's count. (A
  // persistent CTA's warps each scan for every work tile: work_kv_tiles.)
  if constexpr (MASK && !Cfg::kPersistent)
    n_first = Cfg::masked_kv_tiles(n_first, attn::last_valid_key<Cfg::kThreads>(
                                                opt.key_mask + static_cast<std::size_t>(first.b) * S,
                                                min(S, n_first * Cfg::kBlockN)));
  // No CTA-wide barrier from here on: the producer's idle threads leave below.

  // The producer warpgroup's warps 1-3 only hand their registers back, then leave.
  if (warp >= Cfg::kProducerWarp) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (warp != Cfg::kProducerWarp) return;
    if constexpr (Cfg::kPersistent) {
      int g = 0, it = 0;  // the ring's K/V tiles so far, the CTA's work tiles so far
      for (int w = blockIdx.x; w < work_tiles; w += gridDim.x, ++it) {
        const typename Cfg::Work t = Cfg::work_tile(w, nq, H, B, group);
        const int n = work_kv_tiles<Cfg, MASK>(t, S, opt);  // the whole warp
        produce<Cfg, MASK>(&q_map, &kv_map, sQ, sK, sV, bar, t, n, it, g, early);
        g += n;
      }
    } else {
      produce<Cfg, MASK>(&q_map, &kv_map, sQ, sK, sV, bar, first, n_first, 0, 0, early);
    }
    return;
  }
  setmaxnreg_inc<Cfg::kConsumerRegs>();
  if constexpr (Cfg::kPersistent) {
    int g = 0, it = 0;  // as the producer's
    for (int w = blockIdx.x; w < work_tiles; w += gridDim.x, ++it) {
      const typename Cfg::Work t = Cfg::work_tile(w, nq, H, B, group);
      const int n = work_kv_tiles<Cfg, MASK>(t, S, opt);
      consume<Cfg, E, MASK, DROP>(sQ, sK, sV, sO, bar, out, lse, S, H, scale_log2, t, n, it, g, opt);
      g += n;
    }
  } else {
    consume<Cfg, E, MASK, DROP>(sQ, sK, sV, sO, bar, out, lse, S, H, scale_log2, first, n_first, 0, 0, opt);
  }
}

template <int D, bool CAUSAL, int CONSUMERS, bool MASK, bool DROP, typename E>
void launch(cudaStream_t st, const E* qkv, E* out, float* lse, const AttentionShape& sh,
            const attn::OptionArgs& opt) {
  using Cfg = FwdConfig<D, CAUSAL, CONSUMERS>;
  const CUtensorMap q_map = encode_qkv_map(qkv, sh, Cfg::kBlockM);
  const CUtensorMap kv_map = encode_qkv_map(qkv, sh, Cfg::kBlockN);
  auto kernel = forward_kernel<Cfg, E, MASK, DROP>;
  // Once per instance (a throw leaves it unchecked, so it throws again).
  static const bool pool = (check_register_pool(reinterpret_cast<const void*>(kernel), Cfg::kThreads,
                                                Cfg::kProducerRegs * 128 + Cfg::kConsumerRegs * 128 * Cfg::kConsumers,
                                                "attention_forward"),
                            true);
  (void)pool;
  CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  // check_forward_args keeps the count under 2^31.
  const int nq = (sh.seq + Cfg::kBlockM - 1) / Cfg::kBlockM, work_tiles = nq * sh.heads * sh.batch;
  const int grid = Cfg::grid_ctas(work_tiles, multiprocessors());
  const int group = causal_group(sh.seq, D, sh.heads * sh.batch);
  const float scale_log2 = attn::kLog2e / std::sqrt(static_cast<float>(D));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, st>>>(q_map, kv_map, out, lse, sh.seq, sh.heads, sh.batch,
                                                       scale_log2, work_tiles, group, opt);
  CUTRAIN_LAUNCH_CHECK("attention sm90 forward_kernel");
}

// The options' instance: the key mask where one is given, dropout where p > 0. Three consumer
// warpgroups have no dropout instances (the tile launcher below never asks for one).
template <int D, bool CAUSAL, int CONSUMERS, typename E>
void launch(cudaStream_t st, const E* qkv, E* out, float* lse, const AttentionShape& sh,
            const attn::OptionArgs& opt) {
  const bool mask = opt.key_mask != nullptr, drop = opt.threshold != 0;
  if (!mask && !drop) launch<D, CAUSAL, CONSUMERS, false, false>(st, qkv, out, lse, sh, opt);
  else if (!drop) launch<D, CAUSAL, CONSUMERS, true, false>(st, qkv, out, lse, sh, opt);
  else if constexpr (CONSUMERS == 2) {
    if (!mask) launch<D, CAUSAL, CONSUMERS, false, true>(st, qkv, out, lse, sh, opt);
    else launch<D, CAUSAL, CONSUMERS, true, true>(st, qkv, out, lse, sh, opt);
  }
}
// The tile's instance (FwdTile): three consumer warpgroups at d64 without dropout only (at 160
// registers a thread has no room for dropout's keep-bit state: ptxas spills those instances).
template <int D, bool CAUSAL, typename E>
void launch(cudaStream_t st, const E* qkv, E* out, float* lse, const AttentionShape& sh,
            const attn::OptionArgs& opt, FwdTile tile) {
  if constexpr (D == 64)
    if (tile == FwdTile::Rows192 && opt.threshold == 0) return launch<D, CAUSAL, 3>(st, qkv, out, lse, sh, opt);
  launch<D, CAUSAL, 2>(st, qkv, out, lse, sh, opt);
}

}  // namespace

template <typename E>
void attention_forward(cudaStream_t s, const E* qkv, E* out, float* lse, const AttentionShape& sh,
                       const AttentionOptions& options, std::optional<FwdTile> chosen) {
  const attn::OptionArgs opt = attn::option_args(options);  // refuses p outside [0, 1)
  check_forward_args(qkv, out, lse, sh);
  check_device("attention_forward", sh.head_dim == 64 ? std::max(FwdConfig<64, false, 2>::kSmemBytes,
                                                                   FwdConfig<64, false, 3>::kSmemBytes)
                                                        : FwdConfig<128, false>::kSmemBytes);
  const FwdTile tile = chosen ? *chosen : production_forward(sh, multiprocessors());
  const bool c = sh.causal;
  if (sh.head_dim == 64)
    c ? launch<64, true>(s, qkv, out, lse, sh, opt, tile) : launch<64, false>(s, qkv, out, lse, sh, opt, tile);
  else
    c ? launch<128, true>(s, qkv, out, lse, sh, opt, tile) : launch<128, false>(s, qkv, out, lse, sh, opt, tile);
}

template void attention_forward<bf16>(cudaStream_t, const bf16*, bf16*, float*, const AttentionShape&,
                                      const AttentionOptions&, std::optional<FwdTile>);
template void attention_forward<f16>(cudaStream_t, const f16*, f16*, float*, const AttentionShape&,
                                     const AttentionOptions&, std::optional<FwdTile>);

}  // namespace cutrain::kernels::sm90
