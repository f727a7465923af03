// @brief The Hopper attention experiment's tile geometry, shared by the kernel (device) and the CPU
// tests (host): the compile-time config, the shared-memory carve-up and its budget, the wgmma
// matrix-descriptor encoding, and where each wgmma operand slice starts inside a tile that the
// tensor-copy engine (TMA) wrote with its 128-byte swizzle.
//
// Tile layout in shared memory: a tile of R rows x D bf16 columns is D/64 column blocks, each
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

namespace cutrain::bench::hopper {

// D: head dim (64 or 128). Two consumer warpgroups of 64 query rows each and one producer warp
// (one thread of it issues the copies). Register budget: ptxas gives every thread of the 288 the
// same cap, 168 (nvcc 13.0; setmaxnreg moved none of it to the consumers at compile time: d128 with
// 128-key tiles spilled 80 bytes with or without it), so d128 streams 96-key tiles, which fit.
// OVERLAP: the consumer loop keeps tile j's P V in flight while it issues tile j+1's S (see
// attention_hopper_fwd.cu); same tiles, same registers budget.
template <int D, bool CAUSAL, bool OVERLAP = false>
struct FwdConfig {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static constexpr int kHeadDim = D;
  static constexpr bool kCausal = CAUSAL;
  static constexpr bool kOverlap = OVERLAP;
  static constexpr int kConsumers = 2;                  // consumer warpgroups
  static constexpr int kBlockM = 64 * kConsumers;       // query rows per CTA
  static constexpr int kBlockN = D == 64 ? 128 : 96;    // keys per K/V tile
  static constexpr int kStages = 3;                     // K/V ring depth
  static constexpr int kThreads = 128 * kConsumers + 32;
  static constexpr int kProducerWarp = 4 * kConsumers;  // the warp after the consumer warpgroups
  static constexpr int kColBlocks = D / 64;             // 128-byte column blocks per row
  static constexpr std::uint32_t kQBytes = kBlockM * D * 2;
  static constexpr std::uint32_t kKVBytes = kBlockN * D * 2;  // one K or one V tile
  // Carve-up from a 1024-aligned base: Q, K[kStages], V[kStages], then the mbarriers
  // (q_full, k_full[kStages], v_full[kStages], kv_empty[kStages]).
  static constexpr std::uint32_t kQOff = 0;
  static constexpr std::uint32_t kKOff = kQOff + kQBytes;
  static constexpr std::uint32_t kVOff = kKOff + kStages * kKVBytes;
  static constexpr std::uint32_t kBarOff = kVOff + kStages * kKVBytes;
  static constexpr int kBarriers = 1 + 3 * kStages;
  // +1024: the dynamic shared memory base is rounded up to 1024 bytes inside the kernel.
  static constexpr std::uint32_t kSmemBytes = 1024 + kBarOff + 8 * kBarriers;
  static_assert(kSmemBytes <= 227u * 1024u, "shared memory over the sm_90 per-block limit (227 KiB)");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles must keep 1024-byte swizzle atoms aligned");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256 && kBlockM <= 256, "TMA boxes hold at most 256 rows");
  // wgmma K-major: 8-row atoms 1024 B apart. MN-major V: column blocks kBlockN*128 B apart.
  static constexpr std::uint32_t kSbo = 1024;
  static constexpr std::uint32_t kVLbo = kBlockN * 128;
  static_assert(kVLbo < (1u << 18), "LBO must fit the descriptor's 14-bit field (bytes >> 4)");

  // The schedule. K/V tiles a CTA of first query m0 streams: all of them, or (causal) those up to
  // its last query's key.
  static constexpr CUTRAIN_HD int kv_tiles(int S, int m0) {
    const int all = (S + kBlockN - 1) / kBlockN, diag = (m0 + kBlockM - 1) / kBlockN + 1;
    return CAUSAL && diag < all ? diag : all;
  }
  // Whether the warpgroup whose rows start at wg_row0 has work in tile j (causal: a tile wholly
  // after its 64 rows has none; it still waits for the tile and releases it).
  static constexpr CUTRAIN_HD bool tile_active(int j, int wg_row0) { return !CAUSAL || j * kBlockN <= wg_row0 + 63; }
  // The active tiles are a prefix of the n_tiles streamed (tile 0 always among them): their count.
  static constexpr CUTRAIN_HD int active_tiles(int n_tiles, int wg_row0) {
    const int last = (wg_row0 + 63) / kBlockN + 1;
    return CAUSAL && last < n_tiles ? last : n_tiles;
  }

  // Byte offset, from Q's base, where consumer warpgroup `wg`'s A operand for k16 step kk starts.
  static constexpr CUTRAIN_HD std::uint32_t q_slice(int wg, int kk) {
    return (kk / 4) * (kBlockM * 128) + wg * 64 * 128 + (kk % 4) * 32;
  }
  // Byte offset, from a K tile's base, of the B operand of k16 step kk (all kBlockN keys).
  static constexpr CUTRAIN_HD std::uint32_t k_slice(int kk) { return (kk / 4) * (kBlockN * 128) + (kk % 4) * 32; }
  // Byte offset, from a V tile's base, of the B operand of k16 step ks (keys 16ks.., all D columns).
  static constexpr CUTRAIN_HD std::uint32_t v_slice(int ks) { return ks * 16 * 128; }
};

// wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
// leading and stride byte offsets, each >> 4 in 14 bits; base offset 0 (1024-aligned atoms);
// swizzle mode 1 = 128-byte swizzle in bits 62-63.
constexpr CUTRAIN_HD std::uint64_t smem_desc(std::uint32_t smem_addr, std::uint32_t lbo, std::uint32_t sbo) {
  return static_cast<std::uint64_t>((smem_addr & 0x3FFFFu) >> 4) |
         (static_cast<std::uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<std::uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
constexpr std::uint32_t kUnusedLbo = 16;  // K-major 128B-swizzle operands ignore LBO (encoded 1)

// Where the TMA's SWIZZLE_128B places element (r, c) of a [rows][D] tile (column blocks of 64).
constexpr CUTRAIN_HD std::uint32_t tma_sw128_offset(int rows, int r, int c) {
  const int block = c / 64, cc = c % 64;
  return block * rows * 128 + r * 128 + (((cc / 8) ^ (r % 8)) * 16) + (cc % 8) * 2;
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

}  // namespace cutrain::bench::hopper
