// @brief The sm90 attention pair's tile geometry (kernels/attention_sm90/), shared by the kernels
// (device) and the CPU tests (host): the compile-time config, the shared-memory carve-up and its budget, the wgmma
// matrix-descriptor encoding, and where each wgmma operand slice starts inside a tile that the
// tensor-copy engine (TMA) wrote with its 128-byte swizzle.
//
// Tile layout in shared memory: a tile of R rows x D 16-bit (bf16 or fp16) columns is D/64 column blocks, each
// [R rows][64 columns] = R x 128 bytes, one TMA box each, 1024-byte aligned. Inside a block the TMA
// SWIZZLE_128B pattern places element (r, c) at r*128 + ((c/8) ^ (r%8))*16 + (c%8)*2: 8-row atoms
// of 1024 bytes whose 16-byte chunks are XOR-permuted by the row, so the tensor cores read
// without bank conflicts. wgmma reads the same pattern (descriptor swizzle mode "128B"):
//   K-major operand (Q as A, K as B of S = Q K^T; rows m, reduction index k contiguous):
//     8 rows of 128 B, the next 8 rows SBO = 1024 B further; a k16 step is 32 B inside the row
//     (start address + 32 B per step, + one column block per 4 steps); LBO unused (1).
//   MN-major operand (V as B of O = P V, read transposed: reduction index = key rows, n = d):
//     64 n-elements per 128-B row, the next 64 LBO = R*128 B further (the next column block),
//     8 key rows per 1024-B atom, the next 8 SBO = 1024 B further; a k16 step is 16 rows = 2048 B.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define CUTRAIN_HD __host__ __device__
#else
#define CUTRAIN_HD
#endif

namespace cutrain::kernels::sm90 {

// Causal launches' order (the forward, the dQ pass, the dK/dV pass): their blocks cost 1 to
// `blocks` tiles of work, and the block scheduler hands blocks out in grid order, so a heavy one
// handed out last would run on alone. So the (batch, head) pairs go in sections of `group` (the
// last may be shorter), and a section hands out its blocks heaviest first across its pairs (each
// pair's heaviest, then each pair's second heaviest, ...): the launch ends on its lightest blocks.
// Slot w of a 1-D grid -> the block's rank (0: its pair's heaviest) and its pair (batch * H + head).
struct SectionSlot {
  int rank, pair;
};
constexpr CUTRAIN_HD SectionSlot section_slot(int w, int blocks, int pairs, int group) {
  const int section = w / (group * blocks), r = w % (group * blocks), first = section * group;
  const int n = pairs - first < group ? pairs - first : group;  // this section's pairs
  return {r / n, first + r % n};
}
// A section's pairs: as many as keep their K and V (S x D 16-bit elements each) within
// kSectionBytes, at least one, at most all; L2 holds 50 MiB on an H100, so the K/V that a
// section's blocks read stays resident beside the rest of the traffic.
constexpr std::uint64_t kSectionBytes = 24ull << 20;
constexpr CUTRAIN_HD int causal_group(int S, int D, int pairs) {
  const std::uint64_t kv = 4ull * static_cast<std::uint64_t>(S) * static_cast<std::uint64_t>(D);
  const std::uint64_t g = kSectionBytes / kv;
  return g < 1 ? 1 : g > static_cast<std::uint64_t>(pairs) ? pairs : static_cast<int>(g);
}

// The query-tile schedule and operand slices shared by the kernels whose CTA owns BLOCK_M query
// rows (warpgroups of 64) and streams K/V tiles of BLOCK_N keys: the forward and the dQ pass.
template <int BLOCK_M, int BLOCK_N, bool CAUSAL>
struct QueryTileSchedule {
  // The K/V tiles a CTA of first query m0 streams: all of them, or (causal) those up to its last
  // query's key.
  static constexpr CUTRAIN_HD int kv_tiles(int S, int m0) {
    const int all = (S + BLOCK_N - 1) / BLOCK_N, diag = (m0 + BLOCK_M - 1) / BLOCK_N + 1;
    return CAUSAL && diag < all ? diag : all;
  }
  // Whether the warpgroup whose rows start at wg_row0 has work in tile j (causal: a tile wholly
  // after its 64 rows has none; it still waits for the tile and releases it).
  static constexpr CUTRAIN_HD bool tile_active(int j, int wg_row0) { return !CAUSAL || j * BLOCK_N <= wg_row0 + 63; }
  // The active tiles are a prefix of the n_tiles streamed (tile 0 always among them): their count.
  static constexpr CUTRAIN_HD int active_tiles(int n_tiles, int wg_row0) {
    const int last = (wg_row0 + 63) / BLOCK_N + 1;
    return CAUSAL && last < n_tiles ? last : n_tiles;
  }
  // The forward's count: none for a warpgroup whose rows all lie past S (the last query tile of a
  // sequence that is not a multiple of BLOCK_M), which then only takes its turns and releases the
  // tiles; otherwise active_tiles.
  static constexpr CUTRAIN_HD int live_tiles(int n_tiles, int wg_row0, int S) {
    return wg_row0 >= S ? 0 : active_tiles(n_tiles, wg_row0);
  }
  // With a key mask: of the n_tiles a CTA would stream, those up to the tile holding last_key, the
  // last key it may attend among them (-1: none, so no tile and every row gets O = 0, lse = -inf).
  // Trailing padding then costs nothing; masked keys before last_key score -inf in the softmax.
  static constexpr CUTRAIN_HD int masked_kv_tiles(int n_tiles, int last_key) {
    const int need = last_key < 0 ? 0 : last_key / BLOCK_N + 1;
    return need < n_tiles ? need : n_tiles;
  }
  // The work tiles of a launch over nq query tiles, H heads and B batches (fwd.cu's and dq.cu's CTAs
  // take them in this order): without causal, tile w is query tile w % nq of (batch, head) w / nq,
  // so the CTAs at work together share one (batch, head)'s K/V in L2; causal: section_slot's order
  // (a pair's heaviest query tile is its last), `group` pairs a section (causal_group).
  struct Work {
    int m0, head, b;
  };
  static constexpr CUTRAIN_HD Work work_tile(int w, int nq, int H, int B, int group) {
    if (!CAUSAL) {
      const int q = w % nq, bh = w / nq;
      return {q * BLOCK_M, bh % H, bh / H};
    }
    const SectionSlot slot = section_slot(w, nq, H * B, group);
    return {(nq - 1 - slot.rank) * BLOCK_M, slot.pair % H, slot.pair / H};
  }
  // Byte offset, from Q's (or dO's) base, where warpgroup `wg`'s K-major A operand for k16 step kk
  // starts (rows 64wg.., columns 16kk..).
  static constexpr CUTRAIN_HD std::uint32_t q_slice(int wg, int kk) {
    return (kk / 4) * (BLOCK_M * 128) + wg * 64 * 128 + (kk % 4) * 32;
  }
  // Byte offset, from a K (or V) tile's base, of the K-major B operand of k16 step kk (all BLOCK_N
  // keys, columns 16kk..).
  static constexpr CUTRAIN_HD std::uint32_t k_slice(int kk) { return (kk / 4) * (BLOCK_N * 128) + (kk % 4) * 32; }
};

// The forward (fwd.cu). D: head dim (64 or 128); CONSUMERS: consumer warpgroups of 64 query rows
// (2, or 3 at d64: FwdTile). FlashAttention-3's ping-pong schedule: the consumer warpgroups take
// turns at issuing their wgmma, handed round through one named barrier each, and each one's
// softmax runs under the others' products (fwd.cu's consume). The producer is a
// whole warpgroup (one thread issues the copies), so setmaxnreg moves registers from it to the
// consumers, which lets both score buffers and 128-key tiles fit at d128 too.
template <int D, bool CAUSAL, int CONSUMERS = 2>
struct FwdConfig : QueryTileSchedule<64 * CONSUMERS, 128, CAUSAL> {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(CONSUMERS == 2 || (CONSUMERS == 3 && D == 64),
                "two consumer warpgroups, or three at d64 (d128's O does not fit 160 registers beside S and P)");
  static constexpr int kHeadDim = D;
  static constexpr bool kCausal = CAUSAL;
  static constexpr int kConsumers = CONSUMERS;          // consumer warpgroups
  static constexpr int kBlockM = 64 * kConsumers;       // query rows per CTA
  static constexpr int kBlockN = 128;                   // keys per K/V tile
  static constexpr int kStages = 3;                     // K/V ring depth
  static constexpr int kProducerThreads = 128;          // setmaxnreg acts on whole warpgroups
  static constexpr int kThreads = 128 * kConsumers + kProducerThreads;
  static constexpr int kProducerWarp = 4 * kConsumers;  // the warp after the consumer warpgroups (lane 0 issues)

  // The register reallocation: at one CTA per SM a thread starts with kLaunchRegs (65536 / threads,
  // rounded down to ptxas's multiple of 8: 168 at 384 threads, 128 at 512); the producer warpgroup
  // drops to kProducerRegs and the consumers take what it frees. The sum may not exceed what the
  // CTA was given at launch (setmaxnreg.inc would wait forever for registers nobody frees).
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= kLaunchRegs * kThreads,
                "setmaxnreg: the warpgroups' registers must fit the CTA's launch allocation");
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 && kProducerRegs >= 24 && kConsumerRegs <= 256,
                "setmaxnreg takes a multiple of 8 in [24, 256]");
  // The turns: warpgroup wg issues wgmma only between bar.sync on turn_barrier(wg) and bar.arrive
  // on the next one's (turn_next: wg + 1, the last hands to 0); each barrier counts the 128
  // threads that wait on it and the 128 that arrive (kTurnThreads). Ids 1..kConsumers: 0 is
  // __syncthreads' (the kernel's set-up and the key mask's scan); the forward uses no other named
  // barrier. Every warpgroup takes `turns` turns per work tile (its K/V tile count, the same for
  // all); the last warpgroup opens with one arrival on 0's barrier so that 0 goes first, and skips
  // the hand-over of its last turn, so every barrier phase that starts also completes (turn_opens
  // / turn_passes; the CPU test plays the protocol out).
  static constexpr int kTurnBarrierBase = 1;
  static constexpr int kTurnThreads = 256;
  static constexpr CUTRAIN_HD int turn_barrier(int wg) { return kTurnBarrierBase + wg; }
  // (Two warpgroups: the other one's, 1 - wg, as the two-warpgroup kernel always computed it.)
  static constexpr CUTRAIN_HD int turn_next(int wg) {
    return turn_barrier(kConsumers == 2 ? 1 - wg : wg + 1 < kConsumers ? wg + 1 : 0);
  }
  static constexpr CUTRAIN_HD bool turn_opens(int wg, int turns) { return wg == kConsumers - 1 && turns > 0; }
  static constexpr CUTRAIN_HD bool turn_passes(int wg, int t, int turns) {
    return (kConsumers == 2 ? wg == 0 : wg != kConsumers - 1) || t + 1 < turns;
  }
  static constexpr int kColBlocks = D / 64;             // 128-byte column blocks per row
  static constexpr std::uint32_t kQBytes = kBlockM * D * 2;
  static constexpr std::uint32_t kKVBytes = kBlockN * D * 2;  // one K or one V tile
  // Persistent CTAs (fwd.cu): a CTA per SM at most, each looping over work tiles, so the producer
  // streams the next work tile's Q and K/V under the current one's last products and epilogue.
  // Without causal only: causal work tiles differ in length (1 to S / kBlockN K/V tiles), which a
  // static split balances worse than the hardware's block scheduler (so a CTA per work tile,
  // in section_slot's order).
  static constexpr bool kPersistent = !CAUSAL;
  static constexpr CUTRAIN_HD int grid_ctas(int work_tiles, int sms) {
    return !kPersistent || work_tiles < sms ? work_tiles : sms;
  }
  // O's staging for the epilogue: each consumer warp's 16 rows x D (o_stage_offset's layout),
  // written with stmatrix and copied out in 16-byte pieces, whole 128-byte lines per row.
  static constexpr std::uint32_t kOWarpBytes = 16 * D * 2;
  static constexpr std::uint32_t kOBytes = kBlockM * D * 2;
  // Carve-up from a 1024-aligned base: Q[q_buffers], K[kStages], V[kStages], O's staging (o_bytes),
  // then the mbarriers (q_full[q_buffers], q_empty[q_buffers], k_full[kStages], v_full[kStages],
  // kv_empty[kStages]); +1024: the dynamic shared memory base is rounded up to 1024 bytes inside
  // the kernel.
  static constexpr std::uint32_t smem_bytes(int q_buffers, std::uint32_t o_bytes) {
    return 1024 + q_buffers * kQBytes + 2 * kStages * kKVBytes + o_bytes + 8 * (2 * q_buffers + 3 * kStages);
  }
  // Q buffers: two where shared memory holds them (the next work tile's Q loads while the current
  // one's is read), else one (d128: its ring leaves room for one). O is staged where the room is
  // left beside them (d64); d128 stores O from the accumulator fragments (attn::store_rows).
  static constexpr int kQBuffers = smem_bytes(2, 0) <= 227u * 1024u ? 2 : 1;
  static constexpr bool kStageO = smem_bytes(kQBuffers, kOBytes) <= 227u * 1024u;
  static constexpr std::uint32_t kOStageBytes = kStageO ? kOBytes : 0;  // the staging's share of the carve-up
  static constexpr std::uint32_t kQOff = 0;
  static constexpr std::uint32_t kKOff = kQOff + kQBuffers * kQBytes;
  static constexpr std::uint32_t kVOff = kKOff + kStages * kKVBytes;
  static constexpr std::uint32_t kOOff = kVOff + kStages * kKVBytes;
  static constexpr std::uint32_t kBarOff = kOOff + kOStageBytes;
  static constexpr int kBarriers = 2 * kQBuffers + 3 * kStages;
  static constexpr std::uint32_t kSmemBytes = smem_bytes(kQBuffers, kOStageBytes);
  static_assert(kSmemBytes <= 227u * 1024u, "shared memory over the sm_90 per-block limit (227 KiB)");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles must keep 1024-byte swizzle atoms aligned");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256 && kBlockM <= 256, "TMA boxes hold at most 256 rows");
  // wgmma K-major: 8-row atoms 1024 B apart. MN-major V: column blocks kBlockN*128 B apart.
  static constexpr std::uint32_t kSbo = 1024;
  static constexpr std::uint32_t kVLbo = kBlockN * 128;
  static_assert(kVLbo < (1u << 18), "LBO must fit the descriptor's 14-bit field (bytes >> 4)");

  // The schedule and the K-major slices: QueryTileSchedule's (its BLOCK_M / BLOCK_N are kBlockM /
  // kBlockN: test_attention_hopper_layout checks it). Byte offset, from a V tile's base, of the
  // MN-major B operand of k16 step ks (keys 16ks.., all D columns).
  static constexpr CUTRAIN_HD std::uint32_t v_slice(int ks) { return ks * 16 * 128; }
};

// Byte offset, in a warp's O staging (16 rows of D 2-byte elements, 2D bytes apart), of row r's
// 16-byte chunk c: the chunk index XOR (r & 7), so that an stmatrix 8x8 matrix's eight rows (one
// chunk column) and each 8-lane phase of the row-major copy-out fall in eight distinct 16-byte
// bank groups.
constexpr CUTRAIN_HD std::uint32_t o_stage_offset(int r, int c, int D) {
  return static_cast<std::uint32_t>(r * 2 * D + ((c ^ (r & 7)) << 4));
}

// wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
// leading and stride byte offsets, each >> 4 in 14 bits; base offset 0 (1024-aligned atoms);
// swizzle mode 1 = 128-byte swizzle in bits 62-63.
constexpr CUTRAIN_HD std::uint64_t smem_desc(std::uint32_t smem_addr, std::uint32_t lbo, std::uint32_t sbo) {
  return static_cast<std::uint64_t>((smem_addr & 0x3FFFFu) >> 4) |
         (static_cast<std::uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<std::uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
constexpr std::uint32_t kUnusedLbo = 16;  // K-major 128B-swizzle operands ignore LBO (encoded 1)
// smem_desc(addr + bytes, ...) from smem_desc(addr, ...), with one add on the low word: the start
// address field is bits 0-13 (addr >> 4), and an operand slice lies in the shared window (below
// 2^18), so the add never carries out of the field. A kernel encodes one descriptor per tile and
// advances it per k16 step by a compile-time offset, instead of masking, shifting and or-ing each
// step's address inside its wgmma issue. bytes: a multiple of 16.
constexpr CUTRAIN_HD std::uint64_t desc_advance(std::uint64_t desc, std::uint32_t bytes) {
  const std::uint32_t lo = static_cast<std::uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// Where the TMA's SWIZZLE_128B places element (r, c) of a [rows][D] tile (column blocks of 64).
constexpr CUTRAIN_HD std::uint32_t tma_sw128_offset(int rows, int r, int c) {
  const int block = c / 64, cc = c % 64;
  return block * rows * 128 + r * 128 + (((cc / 8) ^ (r % 8)) * 16) + (cc % 8) * 2;
}
// The same for fp32 elements: column blocks of 32 (128 bytes), 16-byte chunks of 4.
constexpr CUTRAIN_HD std::uint32_t tma_sw128_offset_f32(int rows, int r, int c) {
  const int block = c / 32, cc = c % 32;
  return block * rows * 128 + r * 128 + (((cc / 4) ^ (r % 8)) * 16) + (cc % 4) * 4;
}
// The 128-byte swizzle the tensor cores apply to a canonical (unswizzled) byte offset.
constexpr CUTRAIN_HD std::uint32_t sw128(std::uint32_t off) { return off ^ (((off >> 7) & 7u) << 4); }
// Byte offset wgmma reads element (m, k) of a K-major operand from (k < 16: one k16 step), given
// the step's start offset and SBO.
constexpr CUTRAIN_HD std::uint32_t wgmma_kmajor_offset(std::uint32_t start, std::uint32_t sbo, int m, int k) {
  return sw128(start + (m % 8) * 128 + (m / 8) * sbo + k * 2);
}
// Byte offset wgmma reads element (k, n) of an MN-major operand from (k < 16), given the step's
// start offset, LBO and SBO.
constexpr CUTRAIN_HD std::uint32_t wgmma_mnmajor_offset(std::uint32_t start, std::uint32_t lbo, std::uint32_t sbo,
                                                        int k, int n) {
  return sw128(start + (n % 64) * 2 + (n / 64) * lbo + (k % 8) * 128 + (k / 8) * sbo);
}

// The backward's dK/dV pass (bwd.cu). D: head dim (64 or 128). A CTA owns kBlockN = 128 keys
// of one (batch, head), two warpgroups of 64 keys each and no producer warp (256 threads, so the
// register cap is 255, not the 168 of a 288- or 384-thread CTA: a warpgroup's dK and dV alone are
// D fp32 registers per thread). It walks query tiles of kBlockM = 64 rows; Q and dO arrive by TMA
// through a kStages ring, lse and Dvec by plain loads into shared memory. Per warpgroup and tile:
//   S^T = K_w Q^T and dP^T = V_w dO^T      (A K-major: K_w / V_w rows; B K-major: Q / dO rows)
//   dV_w += P^T dO and dK_w += dS^T Q      (A from registers; B MN-major: dO / Q read transposed)
//   dQ += dS_w K_w                         (A: dS^T_w from shared memory, MN-major; B: K_w MN-major)
// dS^T_w is written to shared memory in the TMA's 128-byte swizzle pattern (rows: the warpgroup's
// 64 keys, one 128-byte column block of 64 queries), so wgmma reads it like a TMA tile. Fast mode
// (fp32 dQ by TMA reduce-adds, the staging below): warpgroup w computes dQ's columns w D/2 .. over
// both warpgroups' keys once both dS^T are stored, so the CTA adds each dQ element once per tile.
// Without PRODUCER (lockstep) both warpgroups load and a CTA barrier ends every tile, which hands
// the ring stage back.
// PRODUCER (the warp-specialized schedules, bwd.cu's backward_ws_kernel): a third warpgroup, the
// producer, issues every load (K/V, the Q / dO ring, lse and Dvec) and the two consumer warpgroups
// only compute; stages are handed back through per-stage empty mbarriers. 384 threads cap a thread at 168
// registers at launch, so the producer gives its registers back (setmaxnreg.dec to
// kProducerRegs) and the consumers take them (setmaxnreg.inc to kConsumerRegs): the CTA's pool is
// 384 x 168 = 128 x 40 + 256 x 232 registers (40: the producer's loop, addresses and TMA operands
// without spilling). d64 only in practice: d128's consumers need about 250 (bwd.cu's launcher runs
// lockstep there). OVERLAP (PRODUCER only, deterministic mode): a
// consumer issues tile i+1's S^T and dP^T before it waits for tile i's dV / dK products.
template <int D, bool CAUSAL, bool PRODUCER = false, bool OVERLAP = false>
struct BwdConfig {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(!OVERLAP || PRODUCER, "the overlap schedule is a producer schedule");
  static constexpr int kHeadDim = D;
  static constexpr bool kCausal = CAUSAL;
  static constexpr bool kProducer = PRODUCER;
  static constexpr bool kOverlap = OVERLAP;
  static constexpr int kWarpgroups = 2;             // the warpgroups that own keys (the consumers)
  static constexpr int kBlockN = 64 * kWarpgroups;  // keys per CTA
  static constexpr int kBlockM = 64;                // queries per tile (one 128-byte column block of dS^T)
  static constexpr int kStages = 3;                 // Q / dO ring depth
  static constexpr int kThreads = 128 * kWarpgroups + (PRODUCER ? 128 : 0);
  static constexpr int kConsumerWarps = 4 * kWarpgroups;
  static constexpr int kProducerWarp = kConsumerWarps;  // PRODUCER: the producer warpgroup's first warp
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static_assert(!PRODUCER || 128 * kProducerRegs + 128 * kWarpgroups * kConsumerRegs <= kThreads * 168,
                "setmaxnreg: the consumers take no more than the producer gives back");
  static constexpr int kColBlocks = D / 64;
  static constexpr std::uint32_t kKVBytes = kBlockN * D * 2;  // K or V
  static constexpr std::uint32_t kQBytes = kBlockM * D * 2;   // one Q or one dO tile
  static constexpr std::uint32_t kDsBytes = 64 * kBlockM * 2;  // one warpgroup's dS^T
  // Carve-up from a 1024-aligned base: K, V, Q[kStages], dO[kStages], dS^T[kWarpgroups],
  // lse * log2(e) [kStages][kBlockM], Dvec [kStages][kBlockM], then the mbarriers (kv_full,
  // q_full[kStages]: each stage's Q, dO, lse and Dvec; q_empty[kStages]: its release, PRODUCER only).
  static constexpr std::uint32_t kKOff = 0;
  static constexpr std::uint32_t kVOff = kKOff + kKVBytes;
  static constexpr std::uint32_t kQOff = kVOff + kKVBytes;
  static constexpr std::uint32_t kdOOff = kQOff + kStages * kQBytes;
  static constexpr std::uint32_t kDsOff = kdOOff + kStages * kQBytes;
  static constexpr std::uint32_t kLseOff = kDsOff + kWarpgroups * kDsBytes;
  static constexpr std::uint32_t kDvecOff = kLseOff + kStages * kBlockM * 4;
  static constexpr std::uint32_t kBarOff = kDvecOff + kStages * kBlockM * 4;
  static constexpr int kBarriers = 1 + 2 * kStages;
  static constexpr std::uint32_t kSmemBytes = 1024 + kBarOff + 8 * kBarriers;  // +1024: base alignment
  static_assert(kSmemBytes <= 227u * 1024u, "shared memory over the sm_90 per-block limit (227 KiB)");
  // The fast mode's dQ: each warpgroup writes its 64 x kDqCols fp32 share into its own staging
  // tile after everything above (so the deterministic instances' offsets stay as they are), and one
  // TMA reduce-add per 32-column block adds it into the accumulator. The share is D/2 columns over
  // all the CTA's keys: each dQ element is added once per CTA and tile (a warpgroup adding its own
  // keys' share of every column would add each twice), the staging is half of a 64 x D tile (d128
  // has no room for two whole ones beside the 178 KiB above), and dQ takes D/4 registers a thread.
  static constexpr int kDqCols = D / 2;  // the dQ columns a warpgroup computes and adds: N of its wgmma
  static_assert(kDqCols % 32 == 0, "a warpgroup's dQ share is whole 32-column reduce boxes");
  static constexpr std::uint32_t kDqStageBytes = kBlockM * kDqCols * 4;  // one warpgroup's fp32 share
  static constexpr std::uint32_t kDqStageOff = (kBarOff + 8 * kBarriers + 1023u) / 1024u * 1024u;
  // The fast mode's dS^T buffers by query tile parity (ds_off). Each warpgroup's dQ product reads
  // both warpgroups' dS^T. Lockstep's CTA barrier ends every tile, so one set serves. In the
  // producer schedules a warpgroup may store tile i+1's dS^T while the other's product still
  // reads tile i's: odd tiles take a second set after the staging tiles. The dS barrier of tile
  // i+1, which the other passed only after waiting for its tile-i product, orders tile i+2's
  // stores into the first set after that product.
  static constexpr int kDsSets = PRODUCER ? 2 : 1;
  static constexpr std::uint32_t kDsOddOff = kDqStageOff + kWarpgroups * kDqStageBytes;
  static constexpr std::uint32_t kFastSmemBytes =
      1024 + kDqStageOff + kWarpgroups * kDqStageBytes + (kDsSets - 1) * kWarpgroups * kDsBytes;
  static_assert(kFastSmemBytes <= 227u * 1024u, "shared memory over the sm_90 per-block limit (227 KiB)");
  // The shared memory an instance takes: the fast mode's adds the staging tiles.
  static constexpr std::uint32_t smem_bytes(bool deterministic) { return deterministic ? kSmemBytes : kFastSmemBytes; }
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0 && kDsBytes % 1024 == 0,
                "tiles must keep 1024-byte swizzle atoms aligned");
  static_assert(kBlockM == 64, "dS^T holds one 128-byte column block of queries per key row");
  static_assert(kBlockN <= 256 && kBlockM <= 256, "TMA boxes hold at most 256 rows");
  static constexpr std::uint32_t kSbo = 1024;
  static constexpr std::uint32_t kKLbo = kBlockN * 128;  // K read MN-major (dQ): column blocks
  static constexpr std::uint32_t kQLbo = kBlockM * 128;  // Q, dO read MN-major (dK, dV): column blocks
  static_assert(kKLbo < (1u << 18) && kQLbo < (1u << 18), "LBO must fit the descriptor's 14-bit field");

  // The schedule: query tiles [q_first, q_tiles) for the CTA of first key n0 (causal: queries before
  // n0 see none of its keys).
  static constexpr CUTRAIN_HD int q_tiles(int S) { return (S + kBlockM - 1) / kBlockM; }
  static constexpr CUTRAIN_HD int q_first(int n0) { return CAUSAL ? n0 / kBlockM : 0; }
  // Whether warpgroup wg (keys n0 + 64wg ..) has any live score in the query tile at m0 (causal: a
  // tile whose last query precedes the warpgroup's first key has none). Uniform over the warpgroup.
  static constexpr CUTRAIN_HD bool wg_active(int m0, int n0, int wg) { return !CAUSAL || m0 + kBlockM - 1 >= n0 + 64 * wg; }
  // Whether the tile needs the element mask (sequence end for queries or keys, or the causal diagonal).
  static constexpr CUTRAIN_HD bool wg_edge(int m0, int n0, int wg, int S) {
    return m0 + kBlockM > S || n0 + 64 * (wg + 1) > S || (CAUSAL && m0 < n0 + 64 * wg + 63);
  }

  // Operand slices (byte offsets from the tile's base).
  // K_w / V_w as the K-major A of S^T / dP^T, k16 step kk (rows 64wg.., columns 16kk..).
  static constexpr CUTRAIN_HD std::uint32_t kv_a_slice(int wg, int kk) {
    return (kk / 4) * (kBlockN * 128) + wg * 64 * 128 + (kk % 4) * 32;
  }
  // Q / dO as the K-major B of S^T / dP^T, k16 step kk (all kBlockM rows, columns 16kk..).
  static constexpr CUTRAIN_HD std::uint32_t q_b_slice(int kk) { return (kk / 4) * (kBlockM * 128) + (kk % 4) * 32; }
  // Q / dO as the MN-major B of dK / dV, k16 step ks (query rows 16ks.., all D columns; LBO kQLbo).
  static constexpr CUTRAIN_HD std::uint32_t q_mn_slice(int ks) { return ks * 16 * 128; }
  // dS^T_w as the MN-major A of dQ, k16 step ks (key rows 16ks.. of the warpgroup's 64, all queries).
  static constexpr CUTRAIN_HD std::uint32_t ds_mn_slice(int ks) { return ks * 16 * 128; }
  // K_w as the MN-major B of dQ, k16 step ks (key rows 64wg + 16ks.., all D columns; LBO kKLbo).
  static constexpr CUTRAIN_HD std::uint32_t k_mn_slice(int wg, int ks) { return (64 * wg + 16 * ks) * 128; }
  // Fast mode: the first dQ column of warpgroup wg's share, and where K's column col starts in
  // K's tile (the B operand of that share's product): its 128-byte column block, then 2 bytes a
  // column into the block's rows (d64's second share starts 64 bytes into them; the swizzle is
  // applied to the whole address, as for a K-major k16 step's 32-byte advance).
  static constexpr CUTRAIN_HD int dq_col0(int wg) { return wg * kDqCols; }
  static constexpr CUTRAIN_HD std::uint32_t k_col_offset(int col) { return (col / 64) * kKLbo + (col % 64) * 2; }
  // Fast mode: warpgroup w's dS^T for query tile qt (byte offset from the base). The
  // deterministic mode has one set, at kDsOff.
  static constexpr CUTRAIN_HD std::uint32_t ds_off(int qt, int w) {
    return (kDsSets == 2 && (qt & 1) ? kDsOddOff : kDsOff) + w * kDsBytes;
  }
  // Where the kernel stores dS^T_w element (key row r < 64, query c < 64): the TMA's pattern.
  static constexpr CUTRAIN_HD std::uint32_t ds_offset(int r, int c) { return tma_sw128_offset(64, r, c); }
  // Where the kernel stores dQ_part element (query row r < kBlockM, column c < D) in a warpgroup's
  // staging tile: the TMA's 128-byte swizzle over fp32 column blocks of 32 (one reduce-add each).
  static constexpr CUTRAIN_HD std::uint32_t dq_stage_offset(int r, int c) { return tma_sw128_offset_f32(kBlockM, r, c); }
};

// The deterministic backward's dQ pass (dq.cu). D: head dim (64 or 128). The forward's shape:
// CTA = one (batch, head) and kBlockM = 128 queries, two consumer warpgroups of 64 queries each
// and one producer warp; Q and dO arrive once by TMA (q_full), K and V tiles of kBlockN keys are
// streamed through a kStages ring exactly as the forward streams them. Per warpgroup and tile:
//   S = Q_w K^T, dP = dO_w V^T       (A K-major: Q_w / dO_w rows; B K-major: K / V rows)
//   dS = P o (dP - Dvec)             (registers; P from lse)
//   dQ_w += dS K                     (A: dS from registers; B: K MN-major, as the forward's V)
// Register budget: the 288-thread CTA caps every thread at 168 (see FwdConfig); a thread holds dQ
// (D/2 fp32), S and dP (kBlockN/2 each) at once, so kBlockN = 64 at both head dims (128 keys at d64
// would be 32 + 64 + 64 accumulators before any address).
// OVERLAP (dq.cu's overlap consumer loop): a consumer issues tile j+1's S and dP before it waits for
// tile j's dQ += dS K, so dQ's product, the next tile's scores and P's exp overlap.
template <int D, bool CAUSAL, bool OVERLAP = false>
struct DqConfig : QueryTileSchedule<128, 64, CAUSAL> {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static constexpr int kHeadDim = D;
  static constexpr bool kCausal = CAUSAL;
  static constexpr bool kOverlap = OVERLAP;
  static constexpr int kConsumers = 2;                  // consumer warpgroups
  static constexpr int kBlockM = 64 * kConsumers;       // query rows per CTA
  static constexpr int kBlockN = 64;                    // keys per K/V tile
  static constexpr int kStages = 3;                     // K/V ring depth
  static constexpr int kThreads = 128 * kConsumers + 32;
  static constexpr int kProducerWarp = 4 * kConsumers;  // the warp after the consumer warpgroups
  static constexpr int kColBlocks = D / 64;
  static constexpr std::uint32_t kQBytes = kBlockM * D * 2;   // Q, and dO
  static constexpr std::uint32_t kKVBytes = kBlockN * D * 2;  // one K or one V tile
  // Carve-up from a 1024-aligned base: Q, dO, K[kStages], V[kStages], then the mbarriers
  // (q_full: Q and dO; q_empty (unused: a CTA owns one query tile); k_full[kStages],
  // v_full[kStages], kv_empty[kStages]).
  static constexpr int kQBuffers = 1;
  static constexpr std::uint32_t kQOff = 0;
  static constexpr std::uint32_t kdOOff = kQOff + kQBytes;
  static constexpr std::uint32_t kKOff = kdOOff + kQBytes;
  static constexpr std::uint32_t kVOff = kKOff + kStages * kKVBytes;
  static constexpr std::uint32_t kBarOff = kVOff + kStages * kKVBytes;
  static constexpr int kBarriers = 2 * kQBuffers + 3 * kStages;
  static constexpr std::uint32_t kSmemBytes = 1024 + kBarOff + 8 * kBarriers;  // +1024: base alignment
  static_assert(kSmemBytes <= 227u * 1024u, "shared memory over the sm_90 per-block limit (227 KiB)");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles must keep 1024-byte swizzle atoms aligned");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256 && kBlockM <= 256, "TMA boxes hold at most 256 rows");
  static_assert(kBlockN == 64, "dS holds 8 n-tiles per row: one row_keep_bits call per row half");
  static constexpr std::uint32_t kSbo = 1024;
  static constexpr std::uint32_t kKLbo = kBlockN * 128;  // K read MN-major (dQ): column blocks
  static_assert(kKLbo < (1u << 18), "LBO must fit the descriptor's 14-bit field (bytes >> 4)");

  // The schedule and the K-major slices: QueryTileSchedule's, as the forward's.
  // K as the MN-major B of dQ += dS K, k16 step ks (keys 16ks.., all D columns; LBO kKLbo).
  static constexpr CUTRAIN_HD std::uint32_t k_mn_slice(int ks) { return ks * 16 * 128; }
};

}  // namespace cutrain::kernels::sm90
