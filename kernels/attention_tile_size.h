// @brief Internal to the attention family: the one table of compile-time tile shapes of the mma.sync
// passes: Pass::Fwd / Pass::Dkdv / Pass::Dq, the mma.sync baseline's forward, dK/dV pass and
// deterministic dQ pass (bench/attention_mma/, bench_attention_hopper's baseline since the sm90
// kernels, kernels/attention_sm90/layout.h, replaced them). Each such kernel is templated on a Tile<...> type read from tile_size(); nothing about the
// shapes is chosen at run time. A CTA is kWarps warps; each warp owns kMTiles m-tiles of 16 rows,
// so a CTA covers kBlockM rows of its fixed operand and streams the other in tiles of kBlockN rows
// through a cp.async double buffer.
//   Pass::Fwd   rows: queries, streamed: keys.    Pass::Dkdv  rows: keys, streamed: queries.
//   Pass::Dq    rows: queries, streamed: keys (the deterministic mode's dQ pass; the fast mode
//               has none: its dK/dV pass adds dS K into an fp32 accumulator with atomics).
#pragma once

namespace cutrain::kernels::attn {

enum class Pass { Fwd, Dkdv, Dq };

struct TileSize {
  int warps;       // warps per CTA
  int m_tiles;     // 16-row m-tiles per warp
  int block_n;     // rows of the streamed operand per tile
  bool a_in_regs;  // the warp's A fragments (Q; dO too in the dQ pass) stay in registers for the
                   // whole pass; else they are re-read from shared memory every tile
};

// (pass, head_dim, causal, deterministic) -> tile shape. Register budgets (ptxas, sm_90, no spills):
//   Fwd   D64: 4 warps x 2 m-tiles, 64-key tiles (232-234 registers);
//         D128: 32-key tiles, the only 2-m-tile shape that fits in registers (248-249).
//   Dkdv  8 warps x 1 m-tile (128 keys: half the Q/dO re-reads from L2 and the dQ atomics of a
//         64-key CTA); D64: 64-query tiles, D128: 32 to stay clear of spills (170-255).
//   Dq    4 warps x 2 m-tiles; D64: 32-key tiles, Q and dO in registers (244-250);
//         D128: 16-key tiles from shared memory, where 32 keys spill (242-244).
// Causal and deterministic select the same shapes today; they are inputs so that a shape can
// depend on them without another mechanism.
constexpr TileSize tile_size(Pass pass, int head_dim, bool causal, bool deterministic) {
  (void)causal;
  (void)deterministic;
  switch (pass) {
    case Pass::Fwd: return {4, 2, head_dim == 64 ? 64 : 32, false};
    case Pass::Dkdv: return {8, 1, head_dim == 64 ? 64 : 32, false};
    case Pass::Dq: return {4, 2, head_dim == 64 ? 32 : 16, head_dim == 64};
  }
  return {0, 0, 0, false};
}

template <Pass P, int D, bool CAUSAL, bool DETERMINISTIC = true>
struct Tile {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static constexpr TileSize kSize = tile_size(P, D, CAUSAL, DETERMINISTIC);
  static constexpr int kHeadDim = D;
  static constexpr bool kCausal = CAUSAL, kDeterministic = DETERMINISTIC;
  static constexpr int kWarps = kSize.warps, kThreads = 32 * kSize.warps, kMTiles = kSize.m_tiles;
  static constexpr int kBlockM = kSize.warps * kSize.m_tiles * 16, kBlockN = kSize.block_n;
  static constexpr bool kARegs = kSize.a_in_regs;
  static_assert(kBlockN % 16 == 0, "streamed tiles come in 16-row k-slices");
};

}  // namespace cutrain::kernels::attn
