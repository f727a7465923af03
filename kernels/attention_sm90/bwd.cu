// @brief The attention backward's dK/dV pass (kernels::attention_backward): wgmma tensor cores,
// TMA + mbarrier loads, FlashAttention-3's dK/dV-stationary schedule; E = bf16 or fp16 (wgmma's
// .bf16 / .f16 inputs, the tensor maps' element type, the P^T / dS^T conversions). Built for sm_90a
// only (kernels/CMakeLists.txt); shapes and offsets in layout.h (BwdConfig).
//
// CTA = one (batch, head) and BwdConfig::kBlockN = 128 keys; 256 threads = two warpgroups of 64
// keys each, no producer warp (a 288-thread CTA would cap every thread at 168 registers; dK and dV
// alone take D of them). K and V arrive once by TMA; then the CTA walks the query tiles of
// kBlockM = 64 rows (causal: from the first tile holding a query >= its first key). Thread 0 keeps
// kStages - 1 tiles of Q and dO in flight through the ring (one full mbarrier per stage, the TMA's
// byte count), and the first 128 threads (warpgroup 0) copy the tile's lse (times log2 e) and
// Dvec = rowsum(dO o O) into shared memory beside it. A stage is refilled once both warpgroups are
// done with it: after the CTA barrier that ends every iteration (lockstep). The
// warp-specialized schedules (BwdConfig::kProducer: a producer warpgroup does all of the loading,
// the two warpgroups below only compute; an overlap loop) are backward_ws_kernel, further down.
// Per tile, each warpgroup w (keys kw0 = n0 + 64w ..):
//   S^T = K_w Q^T, dP^T = V_w dO^T              wgmma, both operands K-major from shared memory
//   P^T = exp2(S^T scale log2 e - lse log2 e)   registers; dead entries (query or key past S,
//   dS^T = P^T o (dP^T - Dvec)                  causal query < key) are 0
//   dS^T -> shared memory (E, the TMA's 128-byte swizzle pattern, this warpgroup's 64 rows)
//   dV += P^T dO, dK += dS^T Q                  wgmma, A from registers, B MN-major (transposed)
//   dQ share = dS K                             fast mode; wgmma, dS^T and K both read MN-major:
//                                               columns w D/2 .. over both warpgroups' keys
//   dq_acc += dQ share                          unscaled, staged in shared memory (fp32, swizzled)
//                                               and added by TMA reduce-adds, one per 32-column box
// In the fast mode the warpgroups meet once both dS^T are stored. Causal: a warpgroup whose keys
// all follow the tile's last query skips its products (in the fast mode it stores a zero dS^T and
// still computes its dQ share).
// The launcher runs the family's row_dot before (which zeroes the fast mode's dQ accumulator) and
// its dQ convert (x 1/sqrt(D) -> E q slot) after;
// dK (x 1/sqrt(D)) and dV are stored straight from the accumulators. Deterministic mode (template
// bool DET): the pass skips dS^T's store, the dQ product and its adds, and the dQ pass (dq.cu:
// wgmma, one CTA per 128 queries, no atomics) computes dQ after it.
// BERT's options (kernels::AttentionOptions), template bools, so the plain kernel compiles as
// before. MASK: each thread reads whether its two keys may be attended once; a masked key's P^T
// is 0 (so are its dS^T, dK, dV and its share of dQ), and a CTA whose 128 keys are all masked
// loads nothing and stores its zero dK, dV. DROP: the keep bits Z of the warp's P^T fragment are
// the family's (transposed_keep_bits, kernels/attention_options.cuh: the accumulator of S^T = K_w Q^T per warp is
// that pass's P^T fragment, 16 keys x the tile's queries), drawn while S^T and dP^T are in flight;
// dV += (P^T o Z) dO with 1/(1-p) applied at the store, dS^T = P^T o (dP^T o Z/(1-p) - Dvec).
#include <cuda.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention_sm90/attention_sm90.h"
#include "kernels/attention_sm90/layout.h"
#include "kernels/attention_sm90/tensor_map.h"
#include "kernels/attention_sm90/wgmma_tma.cuh"
#include "kernels/attention_options.cuh"
#include "kernels/attention_softmax.cuh"
#include "kernels/attention_tiles.cuh"
#include "runtime/check.h"
#include "runtime/error.h"

namespace cutrain::kernels::sm90 {
namespace {

// The mbarriers after the tiles: kv_full, q_full[kStages] (a stage's Q, dO, and, in the producer
// schedules, its lse and Dvec), q_empty[kStages] (producer schedules: the stage's release by the
// consumer threads).
template <class Cfg>
struct BwdBarriers {
  std::uint32_t base;
  __device__ __forceinline__ std::uint32_t kv_full() const { return base; }
  __device__ __forceinline__ std::uint32_t q_full(int s) const { return base + 8 * (1 + s); }
  __device__ __forceinline__ std::uint32_t q_empty(int s) const { return base + 8 * (1 + Cfg::kStages + s); }
};

// Where a CTA's shared memory lies: tile bases as shared-window addresses (TMA, wgmma) and the
// fp32 vectors and dS^T as generic pointers (ordinary loads and stores).
template <class Cfg>
struct BwdSmem {
  std::uint32_t k, v, q, dout, ds;  // stage s of Q / dO: + s * kQBytes; dS^T: base + kDsOff (ds_off)
  unsigned char* ds_ptr;            // generic pointer to ds
  std::uint32_t dq_stage;           // fast mode: warpgroup w's dQ share's staging at + w * kDqStageBytes
  unsigned char* dq_stage_ptr;      // generic pointer to dq_stage
  float *lse, *dvec;                // [kStages][kBlockM]
  BwdBarriers<Cfg> bar;
};

// Starts query tile qt into stage s: Q and dO by TMA (thread 0, completing on q_full[s]), the tile's
// lse * log2 e and Dvec by threads 0 .. 2*kBlockM-1 (rows at or past S: 0; those rows are masked;
// the CTA barrier after the tile publishes them).
template <class Cfg>
__device__ __forceinline__ void load_query_tile(const BwdSmem<Cfg>& sm, const CUtensorMap* q_map,
                                                const CUtensorMap* do_map, const float* __restrict__ glse,
                                                const float* __restrict__ gdvec, int qt, int s, int head, int b,
                                                int S) {
  constexpr int BM = Cfg::kBlockM;
  const int m0 = qt * BM;
  const int i = threadIdx.x;
  if (i < BM) {
    const int q = m0 + i;
    sm.lse[s * BM + i] = q < S ? glse[q] * attn::kLog2e : 0.f;
  } else if (i < 2 * BM) {
    const int q = m0 + i - BM;
    sm.dvec[s * BM + i - BM] = q < S ? gdvec[q] : 0.f;
  }
  if (i == 0) {
    mbar_arrive_expect_tx(sm.bar.q_full(s), 2 * Cfg::kQBytes);
#pragma unroll
    for (int c = 0; c < Cfg::kColBlocks; ++c) {
      tma_load_5d(sm.q + s * Cfg::kQBytes + c * BM * 128, q_map, 64 * c, head, 0, m0, b, sm.bar.q_full(s));
      tma_load_5d(sm.dout + s * Cfg::kQBytes + c * BM * 128, do_map, 64 * c, head, 0, m0, b, sm.bar.q_full(s));
    }
  }
}

// A thread's share of BERT's options in the backward (all of it compiled out of the plain kernel).
struct BwdOptions {
  std::uint32_t key_live;     // MASK: bit e, the key of fragment element e (key_row0 + gi + 8(e >> 1)) may be attended
  DropoutKey dkey;            // DROP: step resolved
  std::uint32_t threshold;
  float drop_scale;           // 1 / (1 - p)
  std::uint64_t bh_e;         // (b*H + head) * S
};

// Issues S^T = K_w Q^T, then dP^T = V_w dO^T (two commit groups, S^T first) against a stage.
template <class Cfg, typename E>
__device__ __forceinline__ void issue_st_dpt(float (&st)[Cfg::kBlockM / 8][4], float (&dp)[Cfg::kBlockM / 8][4],
                                             const BwdSmem<Cfg>& sm, std::uint32_t q_tile, std::uint32_t do_tile,
                                             int wg) {
  constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM;
  // One descriptor per operand, advanced per k16 step (desc_advance).
  const std::uint64_t kd = smem_desc(sm.k + Cfg::kv_a_slice(wg, 0), kUnusedLbo, Cfg::kSbo);
  const std::uint64_t vd = smem_desc(sm.v + Cfg::kv_a_slice(wg, 0), kUnusedLbo, Cfg::kSbo);
  const std::uint64_t qd = smem_desc(q_tile, kUnusedLbo, Cfg::kSbo);
  const std::uint64_t dod = smem_desc(do_tile, kUnusedLbo, Cfg::kSbo);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss<E, BM>(st, desc_advance(kd, Cfg::kv_a_slice(wg, kk) - Cfg::kv_a_slice(wg, 0)),
                    desc_advance(qd, Cfg::q_b_slice(kk)), kk > 0);
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss<E, BM>(dp, desc_advance(vd, Cfg::kv_a_slice(wg, kk) - Cfg::kv_a_slice(wg, 0)),
                    desc_advance(dod, Cfg::q_b_slice(kk)), kk > 0);
  wgmma_commit();
}

// Issues dV += P^T dO, dK += dS^T Q (one commit group); the A fragments pinned before the fence.
template <class Cfg, typename E>
__device__ __forceinline__ void issue_dkdv(float (&dk)[Cfg::kHeadDim / 8][4], float (&dv)[Cfg::kHeadDim / 8][4],
                                           std::uint32_t (&pf)[Cfg::kBlockM / 16][4],
                                           std::uint32_t (&dsf)[Cfg::kBlockM / 16][4], std::uint32_t q_tile,
                                           std::uint32_t do_tile) {
  constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM;
  const std::uint64_t dod = smem_desc(do_tile, Cfg::kQLbo, Cfg::kSbo);
  const std::uint64_t qd = smem_desc(q_tile, Cfg::kQLbo, Cfg::kSbo);
  operand_fence(dv);
  operand_fence(dk);
  operand_fence(pf);
  operand_fence(dsf);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < BM / 16; ++ks) wgmma_rs<E, D>(dv, pf[ks], desc_advance(dod, Cfg::q_mn_slice(ks)), 1);
#pragma unroll
  for (int ks = 0; ks < BM / 16; ++ks) wgmma_rs<E, D>(dk, dsf[ks], desc_advance(qd, Cfg::q_mn_slice(ks)), 1);
  wgmma_commit();
}

// P^T (in st, from the finished S^T): exp2 from lse, dead entries and MASK's masked keys 0. Element
// (j, e): key key_row0 + gi + 8(e >> 1), query m0 + 8j + 2t + (e & 1). A row with lse -inf has
// every key masked, so its inf never survives.
template <class Cfg, bool MASK>
__device__ __forceinline__ void probs_t(float (&st)[Cfg::kBlockM / 8][4], const float* lse_t, int m0, int n0, int wg,
                                        int key_row0, int S, float scale_log2, const BwdOptions& opts) {
  constexpr int BM = Cfg::kBlockM;
  const int gi = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const bool edge = Cfg::wg_edge(m0, n0, wg, S);
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
    const float2 l = *reinterpret_cast<const float2*>(lse_t + 8 * j + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float p = attn::scaled_exp2(st[j][e], scale_log2, (e & 1) ? l.y : l.x);
      if (edge) {
        const int q = m0 + 8 * j + 2 * t + (e & 1), key = key_row0 + gi + 8 * (e >> 1);
        if (q >= S || key >= S || (Cfg::kCausal && q < key)) p = 0.f;  // also drops exp2's inf on zero-filled keys
      }
      st[j][e] = p;
    }
  }
  if constexpr (MASK) {
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (!((opts.key_live >> e) & 1u)) st[j][e] = 0.f;
  }
}

// dS^T = P^T o (dP^T - Dvec) (DROP: dP^T o Z/(1-p)) in dp, then P^T (DROP: P^T o Z) and
// dS^T as k16 A fragments.
template <class Cfg, typename E, bool DROP>
__device__ __forceinline__ void ds_frags(std::uint32_t (&pf)[Cfg::kBlockM / 16][4],
                                         std::uint32_t (&dsf)[Cfg::kBlockM / 16][4],
                                         const float (&st)[Cfg::kBlockM / 8][4], float (&dp)[Cfg::kBlockM / 8][4],
                                         const float* dvec_t, std::uint32_t keep, const BwdOptions& opts) {
  constexpr int BM = Cfg::kBlockM;
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
    const float2 dd = *reinterpret_cast<const float2*>(dvec_t + 8 * j + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float dpe = dp[j][e];
      if constexpr (DROP) dpe = (keep >> (4 * j + e)) & 1u ? dpe * opts.drop_scale : 0.f;
      dp[j][e] = st[j][e] * (dpe - ((e & 1) ? dd.y : dd.x));
    }
  }
  if constexpr (DROP) attn::to_a_frags_kept<E, BM>(pf, st, keep);
  else attn::to_a_frags<E, BM>(pf, st);
  attn::to_a_frags<E, BM>(dsf, dp);
}

// Whether a warpgroup takes every query tile, live scores or not: in the fast mode a warpgroup
// without any still computes its dQ share over the other's keys; in the deterministic mode one
// without any skips the tile.
template <bool DET>
inline constexpr bool kEveryTile = !DET;

// One query tile for warpgroup wg (see the file comment). q_tile / do_tile: the stage's Q and dO
// bases; lse_t / dvec_t: the stage's vectors; key_row0: this warp's first key. Every wgmma batch
// is waited for before the function returns.
template <class Cfg, typename E, bool MASK, bool DROP, bool DET>
__device__ __forceinline__ void tile_step(float (&dk)[Cfg::kHeadDim / 8][4], float (&dv)[Cfg::kHeadDim / 8][4],
                                          const BwdSmem<Cfg>& sm, std::uint32_t q_tile, std::uint32_t do_tile,
                                          const float* lse_t, const float* dvec_t, const CUtensorMap* dq_map,
                                          int m0, int n0, int wg, bool own, int key_row0, int S,
                                          int H, int head, int b, float scale_log2, const BwdOptions& opts) {
  constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM;
  [[maybe_unused]] const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  [[maybe_unused]] const int qt = m0 / BM;  // the query tile: its parity picks the dS^T set (ds_off)

  // own: this warpgroup has live scores in the tile (always, unless kEveryTile).
  const bool run_own = own || !kEveryTile<DET>;
  std::uint32_t pf[BM / 16][4], dsf[BM / 16][4];  // P^T (DROP: P^T o Z; 1/(1-p) at dV's store), dS^T
  if (run_own) {
    // DROP: the keep bits of this thread's P^T elements (bit 4j + e: element e of n-tile j). d64:
    // drawn under the S^T and dP^T wgmma; d128: before them, while their 64 accumulator registers
    // are not yet taken (drawn under them, ptxas spilled 8-48 bytes).
    constexpr bool kDrawUnder = D == 64;
    [[maybe_unused]] std::uint32_t keep = 0;
    [[maybe_unused]] auto draw = [&] {
      keep = attn::transposed_keep_bits<BM / 8>(opts.dkey, opts.threshold, opts.bh_e, S, key_row0 + gi, m0, S % 4 == 0);
    };
    if constexpr (DROP && !kDrawUnder) draw();

    // S^T and dP^T: two commit groups, S^T first.
    float st[BM / 8][4], dp[BM / 8][4];
    issue_st_dpt<Cfg, E>(st, dp, sm, q_tile, do_tile, wg);
    if constexpr (DROP && kDrawUnder) draw();

    // P^T while dP^T is still in flight.
    wgmma_wait<1>();
    operand_fence(st);
    probs_t<Cfg, MASK>(st, lse_t, m0, n0, wg, key_row0, S, scale_log2, opts);
    wgmma_wait<0>();
    operand_fence(dp);
    ds_frags<Cfg, E, DROP>(pf, dsf, st, dp, dvec_t, keep, opts);

    // dS^T (E, the values dK uses) into this warpgroup's buffer: fragment word e of k-slice j is
    // (row gi + 8(e & 1), queries 16j + 8(e >> 1) + 2t, +1), rows counted from the warpgroup's first key.
    // DET: no dQ product here (the dQ pass computes it), so no dS^T in shared memory either.
    if constexpr (!DET) {
      unsigned char* ds_w = sm.ds_ptr + (Cfg::ds_off(qt, wg) - Cfg::kDsOff);
      const int r0 = 16 * (warp & 3) + gi;
#pragma unroll
      for (int j = 0; j < BM / 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          *reinterpret_cast<std::uint32_t*>(ds_w + Cfg::ds_offset(r0 + 8 * (e & 1), 16 * j + 8 * (e >> 1) + 2 * t)) =
              dsf[j][e];
      fence_proxy_async_smem();  // before the barrier below: dQ's wgmma reads these through the async proxy
    }

    // dV += P^T dO, dK += dS^T Q.
    issue_dkdv<Cfg, E>(dk, dv, pf, dsf, q_tile, do_tile);
  } else if constexpr (!DET) {
    // No live score here (causal: these keys all follow the tile's last query), so dS^T is 0:
    // stored as such, the dQ products read both warpgroups' keys in every tile (a product that
    // depends on the tile would have ptxas fence the wgmma around its branch).
    uint4* ds_w = reinterpret_cast<uint4*>(sm.ds_ptr + (Cfg::ds_off(qt, wg) - Cfg::kDsOff));
    static_assert(Cfg::kDsBytes == 128 * 4 * 16, "128 threads store 4 x 16 bytes each");
#pragma unroll
    for (int k = 0; k < 4; ++k) ds_w[(threadIdx.x & 127) + 128 * k] = make_uint4(0u, 0u, 0u, 0u);
    fence_proxy_async_smem();
  }

  if constexpr (DET) {
    wgmma_wait<0>();
    operand_fence(dv);
    operand_fence(dk);
    operand_fence(pf);
    operand_fence(dsf);
  } else {
    // dQ's share (layout.h, BwdConfig::kDqCols): dQ[:, c0 .. c0 + D/2) = dS K over both warpgroups'
    // keys, once the CTA's 256 threads have stored their dS^T and the warpgroup's previous
    // reduce-add has read its staging tile.
    constexpr int NC = Cfg::kDqCols;
    const bool issuer = (threadIdx.x & 127) == 0;  // the thread that issues the reduce-adds
    if (issuer) bulk_wait_read<0>();
    named_barrier_sync(3, 256);
    const int c0 = Cfg::dq_col0(wg);
    float dq[NC / 8][4];
    wgmma_fence();
#pragma unroll
    for (int w = 0; w < Cfg::kWarpgroups; ++w) {
      const std::uint64_t dsd = smem_desc(sm.ds + (Cfg::ds_off(qt, w) - Cfg::kDsOff), kUnusedLbo, Cfg::kSbo);
      const std::uint64_t kd =
          smem_desc(sm.k + Cfg::k_col_offset(c0) + Cfg::k_mn_slice(w, 0), Cfg::kKLbo, Cfg::kSbo);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)  // warpgroup w's 64 keys
        wgmma_ss_mn<E, NC>(dq, desc_advance(dsd, Cfg::ds_mn_slice(ks)),
                           desc_advance(kd, Cfg::k_mn_slice(w, ks) - Cfg::k_mn_slice(w, 0)), w > 0 || ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    if (run_own) {  // dV / dK's products are done too: their operands may be reused
      operand_fence(dv);
      operand_fence(dk);
      operand_fence(pf);
      operand_fence(dsf);
    }
    operand_fence(dq);

    // The share into the warpgroup's staging tile (row 16(warp % 4) + gi (+8), columns 8j + 2t, +1:
    // a warp's float2 stores cover every bank twice under the swizzle), then one TMA reduce-add per
    // 32-column block into dq_acc [B, S, H, D]; rows at or past S lie outside the map and are left out.
    unsigned char* stage = sm.dq_stage_ptr + wg * Cfg::kDqStageBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * (warp & 3) + gi + 8 * h;
#pragma unroll
      for (int j = 0; j < NC / 8; ++j)
        *reinterpret_cast<float2*>(stage + Cfg::dq_stage_offset(r, 8 * j + 2 * t)) =
            make_float2(dq[j][2 * h], dq[j][2 * h + 1]);
    }
    fence_proxy_async_smem();  // the reduce-add reads the tile through the async proxy
    named_barrier_sync(1 + wg, 128);
    if (issuer) {
      const std::uint32_t src = sm.dq_stage + wg * Cfg::kDqStageBytes;
#pragma unroll
      for (int c = 0; c < NC / 32; ++c) tma_reduce_add_4d(src + c * BM * 128, dq_map, c0 + 32 * c, head, m0, b);
      bulk_commit();
    }
  }
}

// Fast mode: the warpgroup's issuing thread waits for its last reduce-adds before the
// CTA leaves (their staging tile must stay until read; their adds land before the dQ convert).
template <class Cfg, bool DET>
__device__ __forceinline__ void finish_dq_adds() {
  if constexpr (!DET)
    if ((threadIdx.x & 127) == 0) bulk_wait<0>();
}

// dK (x dk_scale = 1/sqrt(D)) and dV (x dv_scale: DROP's 1/(1-p)) of this warp's 16 keys from
// key_row0 into dqkv's k and v slots (keys at or past S skipped).
template <int D, typename E>
__device__ __forceinline__ void store_dkdv(E* __restrict__ dqkv, const float (&dk)[D / 8][4], const float (&dv)[D / 8][4],
                                           int key_row0, int S, int H, int head, int b, float dk_scale,
                                           float dv_scale) {
  const std::size_t tok = 3ull * H * D, otok = static_cast<std::size_t>(H) * D;
  E* gdk = dqkv + static_cast<std::size_t>(b) * S * tok + static_cast<std::size_t>(head) * D + otok;
  attn::store_rows<D>(gdk, dk, key_row0, S, tok, dk_scale);
  attn::store_rows<D>(gdk + otok, dv, key_row0, S, tok, dv_scale);
}

// The CTA's 128 keys and (batch, head). Causal: a 1-D grid in section_slot's order (a pair's
// heaviest key block is its first: it meets every query tile from its own on); otherwise a (key
// block, head, batch) grid.
struct KeyBlock {
  int n0, head, b;
};
template <class Cfg>
__device__ __forceinline__ KeyBlock key_block(int H, int B, int group) {
  if constexpr (Cfg::kCausal) {
    const SectionSlot s = section_slot(blockIdx.x, gridDim.x / (H * B), H * B, group);
    return {s.rank * Cfg::kBlockN, s.pair % H, s.pair / H};
  }
  return {static_cast<int>(blockIdx.x) * Cfg::kBlockN, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
}

template <class Cfg, typename E, bool MASK, bool DROP, bool DET>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    backward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kv_map,
                    const __grid_constant__ CUtensorMap do_map, const __grid_constant__ CUtensorMap dq_map,
                    const float* __restrict__ lse,
                    const float* __restrict__ dvec, E* __restrict__ dqkv, int S,
                    int H, int B, int group, float scale_log2, float scale,
                    const __grid_constant__ attn::OptionArgs opt) {
  constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN, ST = Cfg::kStages;
  extern __shared__ unsigned char smem_raw[];
  // Shared-window addresses; the TMA's 128-byte swizzle and wgmma's need 1024-aligned tiles.
  const std::uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  unsigned char* gbase = smem_raw + (base - raw);
  const BwdSmem<Cfg> sm{base + Cfg::kKOff,
                        base + Cfg::kVOff,
                        base + Cfg::kQOff,
                        base + Cfg::kdOOff,
                        base + Cfg::kDsOff,
                        gbase + Cfg::kDsOff,
                        base + Cfg::kDqStageOff,
                        gbase + Cfg::kDqStageOff,
                        reinterpret_cast<float*>(gbase + Cfg::kLseOff),
                        reinterpret_cast<float*>(gbase + Cfg::kDvecOff),
                        BwdBarriers<Cfg>{base + Cfg::kBarOff}};

  const KeyBlock kb = key_block<Cfg>(H, B, group);
  const int n0 = kb.n0, head = kb.head, b = kb.b;
  const int warp = threadIdx.x >> 5, wg = warp >> 2;
  const int key_row0 = n0 + 64 * wg + 16 * (warp & 3);  // this warp's first key
  BwdOptions opts{};
  if constexpr (MASK) {
    const std::uint8_t* km = opt.key_mask + static_cast<std::size_t>(b) * S;
    const int k0 = key_row0 + ((threadIdx.x & 31) >> 2);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (k0 + 8 * h < S && __ldg(km + k0 + 8 * h) != 0) opts.key_live |= 3u << (2 * h);
  }
  if constexpr (DROP) {
    opts.dkey = opt.resolve_step();
    opts.threshold = opt.threshold;
    opts.drop_scale = opt.drop_scale;
    opts.bh_e = (static_cast<std::uint64_t>(b) * H + head) * S;
  }
  const float* glse = lse + (static_cast<std::size_t>(b) * H + head) * S;
  const float* gdvec = dvec + (static_cast<std::size_t>(b) * H + head) * S;
  const int q_first = Cfg::q_first(n0), n_tiles = Cfg::q_tiles(S) - q_first;

  static_assert(Cfg::kThreads >= 2 * BM, "threads 0 .. 2*kBlockM-1 write lse and Dvec");
  if (threadIdx.x == 0) {
    mbar_init(sm.bar.kv_full(), 1);
#pragma unroll
    for (int s = 0; s < ST; ++s) mbar_init(sm.bar.q_full(s), 1);
    mbar_init_fence();
  }
  if constexpr (MASK) {
    // A CTA none of whose keys may be attended loads nothing: its dK, dV are 0, its dQ share none.
    if (!__syncthreads_or(opts.key_live != 0)) {
      float zero[D / 8][4];
      attn::zero(zero);
      store_dkdv<D>(dqkv, zero, zero, key_row0, S, H, head, b, 1.f, 1.f);
      return;
    }
  } else {
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(sm.bar.kv_full(), 2 * Cfg::kKVBytes);
#pragma unroll
    for (int c = 0; c < Cfg::kColBlocks; ++c) {
      tma_load_5d(sm.k + c * BN * 128, &kv_map, 64 * c, head, 1, n0, b, sm.bar.kv_full());
      tma_load_5d(sm.v + c * BN * 128, &kv_map, 64 * c, head, 2, n0, b, sm.bar.kv_full());
    }
  }
  for (int i = 0; i < ST - 1 && i < n_tiles; ++i)
    load_query_tile<Cfg>(sm, &q_map, &do_map, glse, gdvec, q_first + i, i, head, b, S);
  __syncthreads();  // the first tiles' lse and Dvec

  float dk[D / 8][4], dv[D / 8][4];
  attn::zero(dk);
  attn::zero(dv);
  mbar_wait(sm.bar.kv_full(), 0);

  for (int i = 0; i < n_tiles; ++i) {
    const int s = i % ST, m0 = (q_first + i) * BM;
    // Refill stage (i - 1) % ST with tile i + ST - 1: the barrier that ended iteration i - 1
    // released it.
    if (i + ST - 1 < n_tiles)
      load_query_tile<Cfg>(sm, &q_map, &do_map, glse, gdvec, q_first + i + ST - 1, (i + ST - 1) % ST, head, b, S);
    mbar_wait(sm.bar.q_full(s), (i / ST) & 1);
    const bool own = Cfg::wg_active(m0, n0, wg);
    if (own || kEveryTile<DET>)
      tile_step<Cfg, E, MASK, DROP, DET>(dk, dv, sm, sm.q + s * Cfg::kQBytes, sm.dout + s * Cfg::kQBytes,
                                         sm.lse + s * BM, sm.dvec + s * BM, &dq_map, m0, n0, wg, own, key_row0, S,
                                         H, head, b, scale_log2, opts);
    __syncthreads();  // stage s, its vectors and dS^T are free for the next tiles
  }

  finish_dq_adds<Cfg, DET>();
  store_dkdv<D>(dqkv, dk, dv, key_row0, S, H, head, b, scale, DROP ? opt.drop_scale : 1.f);
}

// ---- The warp-specialized schedules (BwdConfig::kProducer): backward_ws_kernel ----
// 384 threads: consumer warpgroups 0 and 1 (keys n0 + 64w ..) compute exactly as above, the
// producer warpgroup (warps 8-11) loads. Warp 8 alone works: lane 0 issues K and V (kv_full) and
// every Q / dO tile by TMA, its 32 lanes copy the tile's lse * log2 e and Dvec into the stage's
// vectors (two rows each) and each arrives on q_full[s] after its writes (lane 0's arrival carries
// the TMA's byte count: q_full counts 32 arrivals), so the full barrier publishes the vectors
// too. It refills stage s once the 256 consumer threads have released it on q_empty[s]: each
// thread arrives after its own reads of the stage's vectors, so its own arrival orders them before
// the producer's next writes (compute-sanitizer's racecheck reported the single lane-0 arrival
// after __syncwarp as a hazard on lse / Dvec). Warps 9-11
// leave after the register hand-back. setmaxnreg: the producer warpgroup drops to
// kProducerRegs, the consumers rise to kConsumerRegs (layout.h, BwdConfig). Every wait after the
// split is mbar_wait_realloc: with a `trap` reachable, ptxas would hold the consumers at the
// launch's 168 registers (wgmma_tma.cuh).
// Consumers, Producer's loop: per tile, wait q_full[s], tile_step (every wgmma waited for inside),
// release q_empty[s]; in the fast mode both warpgroups step every tile, since they meet in it at
// the dQ shares' barrier. OVERLAP (deterministic mode): tile i+1's S^T and dP^T are issued right
// behind tile i's dV / dK products (no tensor-core gap between them), then the wait for the oldest
// group (tile i's products) releases stage i, as the forward's overlap loop retires P V. Causal: a
// warpgroup's inactive tiles are a prefix (wg_active grows with m0); it waits for them and releases
// them before its first product.

// The producer warp's share of query tile qt into stage s (see above).
template <class Cfg>
__device__ __forceinline__ void produce_query_tile(const BwdSmem<Cfg>& sm, const CUtensorMap* q_map,
                                                   const CUtensorMap* do_map, const float* __restrict__ glse,
                                                   const float* __restrict__ gdvec, int qt, int s, int head, int b,
                                                   int S) {
  constexpr int BM = Cfg::kBlockM;
  static_assert(BM == 64, "a lane copies rows lane and lane + 32");
  const int m0 = qt * BM, lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lane + 32 * h, q = m0 + r;
    sm.lse[s * BM + r] = q < S ? glse[q] * attn::kLog2e : 0.f;
    sm.dvec[s * BM + r] = q < S ? gdvec[q] : 0.f;
  }
  if (lane == 0) {
    mbar_arrive_expect_tx(sm.bar.q_full(s), 2 * Cfg::kQBytes);
#pragma unroll
    for (int c = 0; c < Cfg::kColBlocks; ++c) {
      tma_load_5d(sm.q + s * Cfg::kQBytes + c * BM * 128, q_map, 64 * c, head, 0, m0, b, sm.bar.q_full(s));
      tma_load_5d(sm.dout + s * Cfg::kQBytes + c * BM * 128, do_map, 64 * c, head, 0, m0, b, sm.bar.q_full(s));
    }
  } else {
    mbar_arrive(sm.bar.q_full(s));
  }
}

// The overlap consumer loop of warpgroup wg (deterministic mode; see the block comment).
template <class Cfg, typename E, bool MASK, bool DROP>
__device__ __forceinline__ void consume_overlap(float (&dk)[Cfg::kHeadDim / 8][4], float (&dv)[Cfg::kHeadDim / 8][4],
                                                const BwdSmem<Cfg>& sm, int q_first, int n_tiles, int n0, int wg,
                                                int key_row0, int S, float scale_log2, const BwdOptions& opts) {
  constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, ST = Cfg::kStages;
  const int lane = threadIdx.x & 31, gi = lane >> 2;
  // DROP: keep bits of tile qt's P^T (tile_step's placement: d64 under S^T / dP^T, d128 before them).
  constexpr bool kDrawUnder = D == 64;
  [[maybe_unused]] auto draw = [&](int qt) {
    return attn::transposed_keep_bits<BM / 8>(opts.dkey, opts.threshold, opts.bh_e, S, key_row0 + gi, qt * BM,
                                              S % 4 == 0);
  };
  int i = 0;
  for (; i < n_tiles && !Cfg::wg_active((q_first + i) * BM, n0, wg); ++i) {  // causal: keys after the tile
    const int s = i % ST;
    mbar_wait_realloc(sm.bar.q_full(s), (i / ST) & 1);
    mbar_arrive(sm.bar.q_empty(s));
  }
  if (i == n_tiles) return;
  float st[BM / 8][4], dp[BM / 8][4];
  std::uint32_t pf[BM / 16][4] = {}, dsf[BM / 16][4] = {};
  [[maybe_unused]] std::uint32_t keep = 0;
  {
    const int s = i % ST;
    mbar_wait_realloc(sm.bar.q_full(s), (i / ST) & 1);
    if constexpr (DROP && !kDrawUnder) keep = draw(q_first + i);
    issue_st_dpt<Cfg, E>(st, dp, sm, sm.q + s * Cfg::kQBytes, sm.dout + s * Cfg::kQBytes, wg);
    if constexpr (DROP && kDrawUnder) keep = draw(q_first + i);
  }
  for (;; ++i) {
    const int s = i % ST, m0 = (q_first + i) * BM;
    wgmma_wait<1>();  // S^T of tile i, the older of the two groups in flight
    operand_fence(st);
    probs_t<Cfg, MASK>(st, sm.lse + s * BM, m0, n0, wg, key_row0, S, scale_log2, opts);
    wgmma_wait<0>();  // dP^T of tile i
    operand_fence(dp);
    ds_frags<Cfg, E, DROP>(pf, dsf, st, dp, sm.dvec + s * BM, keep, opts);
    issue_dkdv<Cfg, E>(dk, dv, pf, dsf, sm.q + s * Cfg::kQBytes, sm.dout + s * Cfg::kQBytes);
    if (i + 1 == n_tiles) {
      wgmma_wait<0>();  // the last tile's dV / dK
      operand_fence(dv);
      operand_fence(dk);
      operand_fence(pf);
      operand_fence(dsf);
      mbar_arrive(sm.bar.q_empty(s));
      break;
    }
    const int s1 = (i + 1) % ST;
    mbar_wait_realloc(sm.bar.q_full(s1), ((i + 1) / ST) & 1);
    if constexpr (DROP && !kDrawUnder) keep = draw(q_first + i + 1);
    issue_st_dpt<Cfg, E>(st, dp, sm, sm.q + s1 * Cfg::kQBytes, sm.dout + s1 * Cfg::kQBytes, wg);
    if constexpr (DROP && kDrawUnder) keep = draw(q_first + i + 1);
    wgmma_wait<2>();  // tile i's dV / dK, the oldest group: stage i is read
    operand_fence(dv);
    operand_fence(dk);
    operand_fence(pf);
    operand_fence(dsf);
    mbar_arrive(sm.bar.q_empty(s));
  }
}

// Where a CTA's shared memory lies, from the dynamic shared memory's raw base (each role of
// backward_ws_kernel computes it after the split, so nothing of it stays live across the producer's
// register hand-back).
template <class Cfg>
__device__ __forceinline__ BwdSmem<Cfg> bwd_smem(unsigned char* smem_raw) {
  const std::uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  unsigned char* gbase = smem_raw + (base - raw);
  return BwdSmem<Cfg>{base + Cfg::kKOff,
                      base + Cfg::kVOff,
                      base + Cfg::kQOff,
                      base + Cfg::kdOOff,
                      base + Cfg::kDsOff,
                      gbase + Cfg::kDsOff,
                      base + Cfg::kDqStageOff,
                      gbase + Cfg::kDqStageOff,
                      reinterpret_cast<float*>(gbase + Cfg::kLseOff),
                      reinterpret_cast<float*>(gbase + Cfg::kDvecOff),
                      BwdBarriers<Cfg>{base + Cfg::kBarOff}};
}

// The producer warp (see the block comment): K and V once, then every query tile into the ring.
template <class Cfg>
__device__ __forceinline__ void produce(unsigned char* smem_raw, const CUtensorMap* q_map, const CUtensorMap* kv_map,
                                        const CUtensorMap* do_map, const float* __restrict__ lse,
                                        const float* __restrict__ dvec, int S, int H, const KeyBlock& kb) {
  constexpr int BN = Cfg::kBlockN, ST = Cfg::kStages;
  const BwdSmem<Cfg> sm = bwd_smem<Cfg>(smem_raw);
  const int n0 = kb.n0, head = kb.head, b = kb.b;
  if ((threadIdx.x & 31) == 0) {
    mbar_arrive_expect_tx(sm.bar.kv_full(), 2 * Cfg::kKVBytes);
#pragma unroll
    for (int c = 0; c < Cfg::kColBlocks; ++c) {
      tma_load_5d(sm.k + c * BN * 128, kv_map, 64 * c, head, 1, n0, b, sm.bar.kv_full());
      tma_load_5d(sm.v + c * BN * 128, kv_map, 64 * c, head, 2, n0, b, sm.bar.kv_full());
    }
  }
  const float* glse = lse + (static_cast<std::size_t>(b) * H + head) * S;
  const float* gdvec = dvec + (static_cast<std::size_t>(b) * H + head) * S;
  const int q_first = Cfg::q_first(n0), n_tiles = Cfg::q_tiles(S) - q_first;
  for (int i = 0; i < n_tiles; ++i) {
    const int s = i % ST;
    if (i >= ST) mbar_wait_realloc(sm.bar.q_empty(s), ((i / ST) - 1) & 1);
    produce_query_tile<Cfg>(sm, q_map, do_map, glse, gdvec, q_first + i, s, head, b, S);
  }
}

template <class Cfg, typename E, bool MASK, bool DROP, bool DET>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    backward_ws_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kv_map,
                       const __grid_constant__ CUtensorMap do_map, const __grid_constant__ CUtensorMap dq_map,
                       const float* __restrict__ lse,
                       const float* __restrict__ dvec, E* __restrict__ dqkv, int S,
                       int H, int B, int group, float scale_log2, float scale,
                       const __grid_constant__ attn::OptionArgs opt) {
  static_assert(Cfg::kProducer, "backward_ws_kernel runs the producer schedules");
  static_assert(!Cfg::kOverlap || DET, "the overlap loop has no dQ product (deterministic mode)");
  constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, ST = Cfg::kStages;
  extern __shared__ unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5;
  const bool consumer = warp < Cfg::kConsumerWarps;

  if (threadIdx.x == 0) {
    const BwdBarriers<Cfg> bar = bwd_smem<Cfg>(smem_raw).bar;
    mbar_init(bar.kv_full(), 1);
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      mbar_init(bar.q_full(s), 32);                    // the producer warp's lanes
      mbar_init(bar.q_empty(s), 32 * Cfg::kConsumerWarps);  // every consumer thread releases
    }
    mbar_init_fence();
  }
  // MASK: whether each consumer thread's two keys may be attended (bit e: fragment element e's key).
  [[maybe_unused]] std::uint32_t key_live = 0;
  if constexpr (MASK) {
    if (consumer) {
      const KeyBlock kb = key_block<Cfg>(H, B, group);
      const int b = kb.b, k0 = kb.n0 + 64 * (warp >> 2) + 16 * (warp & 3) + ((threadIdx.x & 31) >> 2);
      const std::uint8_t* km = opt.key_mask + static_cast<std::size_t>(b) * S;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (k0 + 8 * h < S && __ldg(km + k0 + 8 * h) != 0) key_live |= 3u << (2 * h);
    }
    // A CTA none of whose keys may be attended loads nothing: its dK, dV are 0, its dQ share none.
    if (!__syncthreads_or(key_live != 0)) {
      if (consumer) {
        float zero[D / 8][4];
        attn::zero(zero);
        const KeyBlock kb = key_block<Cfg>(H, B, group);
        store_dkdv<D>(dqkv, zero, zero, kb.n0 + 64 * (warp >> 2) + 16 * (warp & 3), S, H, kb.head, kb.b, 1.f, 1.f);
      }
      return;
    }
  } else {
    __syncthreads();
  }
  // No CTA-wide barrier from here on: the producer warpgroup's idle warps leave below.

  if (!consumer) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (warp == Cfg::kProducerWarp) produce<Cfg>(smem_raw, &q_map, &kv_map, &do_map, lse, dvec, S, H, key_block<Cfg>(H, B, group));
    return;
  }

  setmaxnreg_inc<Cfg::kConsumerRegs>();
  const BwdSmem<Cfg> sm = bwd_smem<Cfg>(smem_raw);
  const KeyBlock kb = key_block<Cfg>(H, B, group);
  const int n0 = kb.n0, head = kb.head, b = kb.b;
  const int wg = warp >> 2;
  const int key_row0 = n0 + 64 * wg + 16 * (warp & 3);  // this warp's first key
  BwdOptions opts{};
  if constexpr (MASK) opts.key_live = key_live;
  if constexpr (DROP) {
    opts.dkey = opt.resolve_step();
    opts.threshold = opt.threshold;
    opts.drop_scale = opt.drop_scale;
    opts.bh_e = (static_cast<std::uint64_t>(b) * H + head) * S;
  }
  const int q_first = Cfg::q_first(n0), n_tiles = Cfg::q_tiles(S) - q_first;
  float dk[D / 8][4], dv[D / 8][4];
  attn::zero(dk);
  attn::zero(dv);
  mbar_wait_realloc(sm.bar.kv_full(), 0);
  if constexpr (Cfg::kOverlap) {
    consume_overlap<Cfg, E, MASK, DROP>(dk, dv, sm, q_first, n_tiles, n0, wg, key_row0, S, scale_log2, opts);
  } else {
    for (int i = 0; i < n_tiles; ++i) {
      const int s = i % ST, m0 = (q_first + i) * BM;
      mbar_wait_realloc(sm.bar.q_full(s), (i / ST) & 1);
      const bool own = Cfg::wg_active(m0, n0, wg);
      if (own || kEveryTile<DET>)  // the fast mode: both warpgroups meet in every tile (the dQ shares)
        tile_step<Cfg, E, MASK, DROP, DET>(dk, dv, sm, sm.q + s * Cfg::kQBytes, sm.dout + s * Cfg::kQBytes,
                                           sm.lse + s * BM, sm.dvec + s * BM, &dq_map, m0, n0, wg, own,
                                           key_row0, S, H, head, b, scale_log2, opts);
      mbar_arrive(sm.bar.q_empty(s));  // this thread is done with stage s (its wgmma waited for)
    }
  }
  finish_dq_adds<Cfg, DET>();
  store_dkdv<D>(dqkv, dk, dv, key_row0, S, H, head, b, scale, DROP ? opt.drop_scale : 1.f);
}

// The schedules as launch's KIND (BackwardSchedule's order). ProducerOverlap's overlap loop runs in
// the deterministic mode only: the fast mode's dQ product waits for its tile, so there it is Producer.
constexpr int kLockstep = 0, kProducer = 1, kProducerOverlap = 2;

template <int D, bool CAUSAL, int KIND, bool DET, bool MASK, bool DROP, typename E>
void launch(cudaStream_t st, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
            float* dq_acc, const AttentionShape& sh, const attn::OptionArgs& opt) {
  using Cfg = BwdConfig<D, CAUSAL, KIND >= kProducer, KIND == kProducerOverlap && DET>;
  const CUtensorMap q_map = encode_qkv_map(qkv, sh, Cfg::kBlockM);
  const CUtensorMap kv_map = encode_qkv_map(qkv, sh, Cfg::kBlockN);
  const CUtensorMap do_map = encode_rows_map(dout, sh, 1, Cfg::kBlockM);
  // The fast mode's reduce-adds go through a map of dq_acc; otherwise it is never read.
  const CUtensorMap dq_map = !DET ? encode_dq_acc_map(dq_acc, sh) : CUtensorMap{};
  constexpr std::uint32_t smem = Cfg::smem_bytes(DET);
  constexpr auto kernel = [] {
    if constexpr (Cfg::kProducer) return backward_ws_kernel<Cfg, E, MASK, DROP, DET>;
    else return backward_kernel<Cfg, E, MASK, DROP, DET>;
  }();
  if constexpr (Cfg::kProducer) {  // once per instance (a throw leaves it unchecked, so it throws again)
    static const bool pool = (check_register_pool(reinterpret_cast<const void*>(kernel), Cfg::kThreads,
                                                  Cfg::kProducerRegs * 128 + Cfg::kConsumerRegs * 128 * Cfg::kWarpgroups,
                                                  "attention_backward (producer schedule)"),
                              true);
    (void)pool;
  }
  CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int nk = (sh.seq + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const dim3 grid = CAUSAL ? dim3(nk * sh.heads * sh.batch) : dim3(nk, sh.heads, sh.batch);  // key_block's
  const int group = causal_group(sh.seq, D, sh.heads * sh.batch);
  const float scale = 1.f / std::sqrt(static_cast<float>(D)), scale_log2 = scale * attn::kLog2e;
  kernel<<<grid, Cfg::kThreads, smem, st>>>(q_map, kv_map, do_map, dq_map, lse, dvec, dqkv, sh.seq, sh.heads,
                                            sh.batch, group, scale_log2, scale, opt);
  CUTRAIN_LAUNCH_CHECK(Cfg::kProducer
                           ? (DET ? "attention sm90 backward_ws_kernel" : "attention sm90 backward_ws_kernel(dq accumulated)")
                           : (DET ? "attention sm90 backward_kernel" : "attention sm90 backward_kernel(dq accumulated)"));
}

// The options' instance: the key mask where one is given, dropout where p > 0.
template <int D, bool CAUSAL, int KIND, bool DET, typename E>
void launch(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
            float* dq_acc, const AttentionShape& sh, const attn::OptionArgs& opt) {
  const bool mask = opt.key_mask != nullptr, drop = opt.threshold != 0;
  if (!mask && !drop) launch<D, CAUSAL, KIND, DET, false, false>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
  else if (!drop) launch<D, CAUSAL, KIND, DET, true, false>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
  else if (!mask) launch<D, CAUSAL, KIND, DET, false, true>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
  else launch<D, CAUSAL, KIND, DET, true, true>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
}

// Deterministic (no dQ accumulator: the dQ pass follows) or fast.
template <int D, bool CAUSAL, int KIND, typename E>
void launch(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
            float* dq_acc, const AttentionShape& sh, const attn::OptionArgs& opt) {
  dq_acc ? launch<D, CAUSAL, KIND, false>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt)
         : launch<D, CAUSAL, KIND, true>(s, qkv, dout, lse, dvec, dqkv, nullptr, sh, opt);
}

// d128 runs the producer schedules' requests with lockstep's kernel: its consumers hold dK and dV
// (128 registers) beside S^T / dP^T and their fragments, about 250 registers (the 256-thread
// kernel's count), over the 240 setmaxnreg can give them in a 384-thread CTA; compiled, they
// spilled 272-1096 bytes and ptxas serialized their wgmma (CUDA 13.0).
template <int KIND, typename E>
void launch(cudaStream_t s, const E* qkv, const E* dout, const float* lse, const float* dvec, E* dqkv,
            float* dq_acc, const AttentionShape& sh, const attn::OptionArgs& opt) {
  constexpr int kD128 = KIND >= kProducer ? kLockstep : KIND;
  const bool c = sh.causal;
  if (sh.head_dim == 64)
    c ? launch<64, true, KIND>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt)
      : launch<64, false, KIND>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
  else
    c ? launch<128, true, kD128>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt)
      : launch<128, false, kD128>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
}

}  // namespace

template <typename E>
void attention_backward(cudaStream_t s, const E* qkv, const E* out, const E* dout, const float* lse, E* dqkv,
                        void* scratch, const AttentionShape& sh, BackwardSchedule schedule,
                        const AttentionOptions& options, bool deterministic, DqSchedule dq_schedule) {
  const attn::OptionArgs opt = attn::option_args(options);  // refuses p outside [0, 1)
  check_backward_args(qkv, out, dout, lse, dqkv, scratch, sh);
  CUTRAIN_CHECK(schedule == BackwardSchedule::Lockstep || schedule == BackwardSchedule::Producer ||
                    schedule == BackwardSchedule::ProducerOverlap,
                "attention_backward: schedule must be Lockstep, Producer or ProducerOverlap, got ",
                static_cast<int>(schedule));
  CUTRAIN_CHECK(dq_schedule == DqSchedule::Serial || dq_schedule == DqSchedule::Overlap,
                "attention_backward: dq_schedule must be Serial or Overlap, got ", static_cast<int>(dq_schedule));
  const std::uint32_t dkdv_smem = sh.head_dim == 64 ? BwdConfig<64, false>::smem_bytes(deterministic)
                                                    : BwdConfig<128, false>::smem_bytes(deterministic);
  check_device("attention_backward", deterministic ? std::max(dkdv_smem, dq_smem_bytes(sh.head_dim)) : dkdv_smem);
  // The scratch (attention_backward_scratch_bytes): Dvec, then, fast mode only, the fp32 dQ accumulator.
  float* dvec = static_cast<float*>(scratch);
  float* dq_acc =
      deterministic ? nullptr : reinterpret_cast<float*>(static_cast<char*>(scratch) + attn::dvec_bytes(sh));
  attn::row_dot<E>(s, out, dout, dvec, sh, dq_acc);  // also zeroes the fast mode's accumulator
  switch (schedule) {
    case BackwardSchedule::Lockstep: launch<kLockstep>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt); break;
    case BackwardSchedule::Producer: launch<kProducer>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt); break;
    case BackwardSchedule::ProducerOverlap:
      launch<kProducerOverlap>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
      break;
  }
  if (dq_acc)
    attn::dq_convert<E>(s, dq_acc, dqkv, sh);
  else
    dq_pass<E>(s, qkv, dout, lse, dvec, dqkv, sh, opt, dq_schedule);
}

template void attention_backward<bf16>(cudaStream_t, const bf16*, const bf16*, const bf16*, const float*, bf16*, void*,
                                       const AttentionShape&, BackwardSchedule, const AttentionOptions&, bool,
                                       DqSchedule);
template void attention_backward<f16>(cudaStream_t, const f16*, const f16*, const f16*, const float*, f16*, void*,
                                      const AttentionShape&, BackwardSchedule, const AttentionOptions&, bool,
                                      DqSchedule);

}  // namespace cutrain::kernels::sm90
