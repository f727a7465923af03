// @brief CPU checks of the sm90 attention pair (kernels/attention_sm90/, the production kernels): every wgmma
// operand slice the kernels describe reads exactly the element the TMA's 128-byte swizzle (or the
// backward's own dS^T store) put there (forward: Q, K K-major, V MN-major; backward: K, V, Q, dO
// K-major, Q, dO, dS^T, K MN-major; the deterministic mode's dQ pass: Q, dO, K, V K-major, K
// MN-major), the descriptor's bit fields, the tile schedules' coverage of
// every score (with a key mask: every valid key), the tensor-map geometry against the
// [B, S, 3, H, D] and [B, S, H, D] layouts, the host checks that refuse bad shapes, pointers and
// options before any device work (bf16 and fp16 instances, the sm90 entry points and
// kernels::attention_forward / attention_backward), and the production schedule table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/attention.cuh"
#include "kernels/attention_sm90/attention_sm90.h"
#include "kernels/attention_sm90/layout.h"
#include "kernels/attention_sm90/production.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using kernels::AttentionShape;
namespace hopper = cutrain::kernels::sm90;

namespace {

template <class Cfg>
void expect_operands_match_tma() {
  constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  // Q: warpgroup wg's A operand of k16 step kk, element (m, k) = Q row 64wg + m, column 16kk + k.
  std::set<std::uint32_t> seen;
  for (int wg = 0; wg < Cfg::kConsumers; ++wg)
    for (int kk = 0; kk < D / 16; ++kk)
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) {
          const std::uint32_t got = hopper::wgmma_kmajor_offset(Cfg::q_slice(wg, kk), Cfg::kSbo, m, k);
          const std::uint32_t want = hopper::tma_sw128_offset(BM, 64 * wg + m, 16 * kk + k);
          ASSERT_EQ(got, want) << "Q D" << D << " wg " << wg << " kk " << kk << " m " << m << " k " << k;
          seen.insert(got);
        }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(BM) * D) << "Q: every element read exactly once";
  EXPECT_LT(*seen.rbegin(), Cfg::kQBytes);
  // K: the B operand of S = Q K^T, element (n, k) = key n, column 16kk + k.
  seen.clear();
  for (int kk = 0; kk < D / 16; ++kk)
    for (int n = 0; n < BN; ++n)
      for (int k = 0; k < 16; ++k) {
        const std::uint32_t got = hopper::wgmma_kmajor_offset(Cfg::k_slice(kk), Cfg::kSbo, n, k);
        const std::uint32_t want = hopper::tma_sw128_offset(BN, n, 16 * kk + k);
        ASSERT_EQ(got, want) << "K D" << D << " kk " << kk << " n " << n << " k " << k;
        seen.insert(got);
      }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(BN) * D);
  EXPECT_LT(*seen.rbegin(), Cfg::kKVBytes);
  // V: the B operand of O = P V read transposed, element (k, n) = key 16ks + k, column n.
  seen.clear();
  for (int ks = 0; ks < BN / 16; ++ks)
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < D; ++n) {
        const std::uint32_t got = hopper::wgmma_mnmajor_offset(Cfg::v_slice(ks), Cfg::kVLbo, Cfg::kSbo, k, n);
        const std::uint32_t want = hopper::tma_sw128_offset(BN, 16 * ks + k, n);
        ASSERT_EQ(got, want) << "V D" << D << " ks " << ks << " k " << k << " n " << n;
        seen.insert(got);
      }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(BN) * D);
}

TEST(AttentionHopperLayout, WgmmaOperandsReadWhatTheTmaWrote) {
  expect_operands_match_tma<hopper::FwdConfig<64, false>>();
  expect_operands_match_tma<hopper::FwdConfig<128, false>>();
  expect_operands_match_tma<hopper::FwdConfig<64, true>>();
  expect_operands_match_tma<hopper::FwdConfig<128, true>>();
  expect_operands_match_tma<hopper::FwdConfig<64, false, 3>>();
  expect_operands_match_tma<hopper::FwdConfig<64, true, 3>>();
}

// The schedule covers every (query, key) score a row needs exactly once, in an active tile of its
// warpgroup, streams no tile wholly past the CTA's queries (causal) or past S, and keeps the
// producer's and consumers' tile counts equal (they are the same function).
template <class Cfg>
void expect_schedule_covers(int S) {
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  const int ctas = (S + BM - 1) / BM;
  for (int q = 0; q < ctas; ++q) {
    const int m0 = q * BM, n_tiles = Cfg::kv_tiles(S, m0);
    ASSERT_GE(n_tiles, 1) << "S " << S << " m0 " << m0;
    ASSERT_LT((n_tiles - 1) * BN, S) << "a tile wholly past S, S " << S << " m0 " << m0;
    if (Cfg::kCausal) {
      ASSERT_LE((n_tiles - 1) * BN, std::min(S, m0 + BM) - 1) << "a tile past the CTA's last query, m0 " << m0;
    }
    for (int wg = 0; wg < Cfg::kConsumers; ++wg) {
      const int wg_row0 = m0 + 64 * wg;
      // The active tiles are a prefix of length active_tiles (what the overlap schedule relies on).
      const int n_active = Cfg::active_tiles(n_tiles, wg_row0);
      ASSERT_GE(n_active, 1);
      for (int j = 0; j < n_tiles; ++j)
        ASSERT_EQ(Cfg::tile_active(j, wg_row0), j < n_active) << "S " << S << " m0 " << m0 << " wg " << wg << " j " << j;
      // The forward's live count: active_tiles for a warpgroup with a row before S, none past S.
      const int n_live = Cfg::live_tiles(n_tiles, wg_row0, S);
      ASSERT_EQ(n_live, wg_row0 < S ? n_active : 0) << "S " << S << " m0 " << m0 << " wg " << wg;
      for (int row = wg_row0; row < std::min(wg_row0 + 64, S); ++row) {
        const int keys = Cfg::kCausal ? row + 1 : S;  // keys 0..keys-1 are needed
        for (int key = 0; key < keys; ++key) {
          const int j = key / BN;
          ASSERT_LT(j, n_tiles) << "S " << S << " row " << row << " key " << key << ": its tile is never streamed";
          ASSERT_TRUE(Cfg::tile_active(j, wg_row0)) << "S " << S << " row " << row << " key " << key
                                                    << ": its tile is skipped by warpgroup " << wg;
          ASSERT_LT(j, n_live) << "S " << S << " row " << row << " key " << key << ": past the forward's live tiles";
        }
      }
    }
  }
}

// The forward and the dQ pass take their schedule and K-major slices from QueryTileSchedule: its
// tile sizes must be the config's own.
template <class Cfg>
constexpr bool schedule_matches = std::is_base_of_v<hopper::QueryTileSchedule<Cfg::kBlockM, Cfg::kBlockN, Cfg::kCausal>, Cfg>;
static_assert(schedule_matches<hopper::FwdConfig<64, false>> && schedule_matches<hopper::FwdConfig<64, true>> &&
              schedule_matches<hopper::FwdConfig<128, false>> && schedule_matches<hopper::FwdConfig<128, true>> &&
              schedule_matches<hopper::FwdConfig<64, false, 3>> && schedule_matches<hopper::FwdConfig<64, true, 3>> &&
              schedule_matches<hopper::DqConfig<64, false>> && schedule_matches<hopper::DqConfig<128, true>>,
              "a config's QueryTileSchedule has other tile sizes than the config");

TEST(AttentionHopperLayout, ScheduleCoversEveryScore) {
  for (int S : {1, 7, 63, 64, 65, 95, 96, 97, 127, 128, 129, 191, 192, 193, 200, 255, 256, 257, 385, 1000, 2049}) {
    expect_schedule_covers<hopper::FwdConfig<64, false>>(S);
    expect_schedule_covers<hopper::FwdConfig<64, true>>(S);
    expect_schedule_covers<hopper::FwdConfig<128, false>>(S);
    expect_schedule_covers<hopper::FwdConfig<128, true>>(S);
    expect_schedule_covers<hopper::FwdConfig<64, false, 3>>(S);
    expect_schedule_covers<hopper::FwdConfig<64, true, 3>>(S);
  }
}

// With a key mask, a CTA streams masked_kv_tiles(n_tiles, last) tiles, `last` being the last valid
// key below min(S, n_tiles * BN) (what the kernel's scan finds): every valid key a row of the CTA
// attends must lie in a streamed tile, none streamed wholly past `last`, and the warpgroups' active
// tiles stay a prefix of the streamed ones.
template <class Cfg>
void expect_masked_schedule_covers(int S, std::mt19937_64& rng) {
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  for (int kind = 0; kind < 4; ++kind) {
    // 0: no valid key; 1: a padded prefix; 2: random bits; 3: one valid key.
    std::vector<bool> valid(S);
    const int len = std::uniform_int_distribution<int>(1, S)(rng), one = std::uniform_int_distribution<int>(0, S - 1)(rng);
    for (int j = 0; j < S; ++j)
      valid[j] = kind == 1 ? j < len : kind == 2 ? (rng() % 10 < 3) : kind == 3 ? j == one : false;
    for (int m0 = 0; m0 < S; m0 += BM) {
      const int n_tiles = Cfg::kv_tiles(S, m0), limit = std::min(S, n_tiles * BN);
      int last = -1;
      for (int j = 0; j < limit; ++j)
        if (valid[j]) last = j;
      const int n = Cfg::masked_kv_tiles(n_tiles, last);
      ASSERT_LE(n, n_tiles);
      ASSERT_EQ(n == 0, last < 0) << "S " << S << " m0 " << m0 << " kind " << kind;
      if (n > 0) {
        ASSERT_LE((n - 1) * BN, last) << "a tile streamed wholly past the last valid key, S " << S << " m0 " << m0;
      }
      for (int wg = 0; wg < Cfg::kConsumers; ++wg) {
        const int wg_row0 = m0 + 64 * wg, n_active = Cfg::active_tiles(n, wg_row0);
        ASSERT_EQ(n_active >= 1, n >= 1);
        for (int j = 0; j < n; ++j) ASSERT_EQ(Cfg::tile_active(j, wg_row0), j < n_active);
        for (int row = wg_row0; row < std::min(wg_row0 + 64, S); ++row)
          for (int key = 0; key < (Cfg::kCausal ? row + 1 : S); ++key) {
            if (!valid[key]) continue;
            ASSERT_LT(key / BN, n_active) << "S " << S << " row " << row << " valid key " << key << " never reached";
          }
      }
    }
  }
}

TEST(AttentionHopperLayout, MaskedScheduleCoversEveryValidKey) {
  std::mt19937_64 rng(24);
  for (int S : {1, 7, 96, 97, 128, 129, 200, 257, 385, 1000}) {
    expect_masked_schedule_covers<hopper::FwdConfig<64, false>>(S, rng);
    expect_masked_schedule_covers<hopper::FwdConfig<64, true>>(S, rng);
    expect_masked_schedule_covers<hopper::FwdConfig<128, false>>(S, rng);
    expect_masked_schedule_covers<hopper::FwdConfig<128, true>>(S, rng);
    expect_masked_schedule_covers<hopper::FwdConfig<64, false, 3>>(S, rng);
    expect_masked_schedule_covers<hopper::FwdConfig<64, true, 3>>(S, rng);
  }
}

template <class Cfg>
void expect_carve_up() {
  // Tiles on 1024-byte swizzle atoms, barriers 8-byte aligned after them, all under the budget.
  EXPECT_EQ(Cfg::kKOff % 1024, 0u);
  EXPECT_EQ(Cfg::kVOff % 1024, 0u);
  EXPECT_EQ(Cfg::kKVBytes % 1024, 0u);
  EXPECT_EQ(Cfg::kBarOff % 8, 0u);
  EXPECT_EQ(Cfg::kOOff, Cfg::kQBuffers * Cfg::kQBytes + 2u * Cfg::kStages * Cfg::kKVBytes);
  EXPECT_EQ(Cfg::kOOff % 128, 0u);  // stmatrix rows and the 16-byte copy-out
  EXPECT_EQ(Cfg::kBarOff, Cfg::kOOff + (Cfg::kStageO ? Cfg::kBlockM * Cfg::kHeadDim * 2u : 0u));
  EXPECT_EQ(Cfg::kOWarpBytes * 4u * Cfg::kConsumers, Cfg::kOBytes);  // 16 rows per consumer warp
  EXPECT_EQ(Cfg::kBarriers, 2 * Cfg::kQBuffers + 3 * Cfg::kStages);
  EXPECT_LE(Cfg::kSmemBytes, 227u * 1024u);
  // Consumer warpgroups are warps 0..4*kConsumers-1 (wgmma wants warpgroups at warp indices
  // divisible by 4), the producer the warpgroup after them, whose first warp issues the copies.
  EXPECT_EQ(Cfg::kThreads, 128 * Cfg::kConsumers + 128);
  EXPECT_EQ(Cfg::kProducerWarp, 4 * Cfg::kConsumers);
}

TEST(AttentionHopperLayout, SharedMemoryCarveUp) {
  expect_carve_up<hopper::FwdConfig<64, false>>();
  expect_carve_up<hopper::FwdConfig<64, true>>();
  expect_carve_up<hopper::FwdConfig<128, false>>();
  expect_carve_up<hopper::FwdConfig<128, true>>();
  expect_carve_up<hopper::FwdConfig<64, false, 3>>();
  expect_carve_up<hopper::FwdConfig<64, true, 3>>();
  // d128's ring of 128-key tiles: Q 32 KiB + 3 x (K + V) 64 KiB + barriers + alignment, which
  // leaves no room for a second Q buffer; d64 has two.
  EXPECT_EQ((hopper::FwdConfig<128, false>::kSmemBytes), 1024u + 32768u + 6u * 32768u + 88u);
  EXPECT_EQ((hopper::FwdConfig<128, false>::kQBuffers), 1);
  EXPECT_EQ((hopper::FwdConfig<64, false>::kQBuffers), 2);
  EXPECT_EQ((hopper::FwdConfig<64, true>::kQBuffers), 2);
  EXPECT_EQ((hopper::FwdConfig<64, false, 3>::kQBuffers), 2);  // 2 x 24 KiB of Q beside 96 KiB of K/V
  // O's staging: beside d64's two Q buffers (16 / 24 KiB); none at d128.
  EXPECT_TRUE((hopper::FwdConfig<64, false>::kStageO));
  EXPECT_TRUE((hopper::FwdConfig<64, true, 3>::kStageO));
  EXPECT_FALSE((hopper::FwdConfig<128, false>::kStageO));
  EXPECT_EQ((hopper::FwdConfig<64, false>::kSmemBytes), 1024u + 2u * 16384u + 6u * 16384u + 16384u + 8u * 13u);
  EXPECT_EQ((hopper::FwdConfig<64, false, 3>::kBlockM), 192);
  EXPECT_EQ((hopper::FwdConfig<128, true>::kBlockN), 128);
}

// The forward's work tiles: the CTAs of grid_ctas, taking w = c, c + grid, ... (persistent) or
// their block's one, cover every (query tile, head, batch) exactly once. Without causal,
// neighbouring work tiles share a (batch, head) (its K/V in L2); causal goes in sections of
// `group` pairs, each handing out its query tiles heaviest first, so the launch ends on the
// lightest tiles.
template <class Cfg>
void expect_work_tiles_cover(int S, int H, int B, int sms, int group) {
  SCOPED_TRACE("S=" + std::to_string(S) + " H=" + std::to_string(H) + " B=" + std::to_string(B) +
               " group=" + std::to_string(group));
  const int nq = (S + Cfg::kBlockM - 1) / Cfg::kBlockM, total = nq * H * B;
  const int grid = Cfg::grid_ctas(total, sms);
  EXPECT_EQ(grid, Cfg::kPersistent ? std::min(total, sms) : total);
  std::vector<int> seen(static_cast<std::size_t>(total), 0);
  for (int c = 0; c < grid; ++c)
    for (int w = c; w < total; w += grid) {
      const auto t = Cfg::work_tile(w, nq, H, B, group);
      ASSERT_EQ(t.m0 % Cfg::kBlockM, 0);
      ASSERT_TRUE(t.m0 >= 0 && t.m0 < S && t.head >= 0 && t.head < H && t.b >= 0 && t.b < B);
      ++seen[static_cast<std::size_t>((t.b * H + t.head) * nq + t.m0 / Cfg::kBlockM)];
      if (!Cfg::kPersistent) break;  // one work tile per CTA
    }
  for (int k = 0; k < total; ++k) ASSERT_EQ(seen[static_cast<std::size_t>(k)], 1) << "work tile " << k;
  for (int w = 1; w < total; ++w) {
    const auto t = Cfg::work_tile(w, nq, H, B, group), prev = Cfg::work_tile(w - 1, nq, H, B, group);
    if (!Cfg::kCausal) {
      if (w % nq == 0) continue;
      EXPECT_TRUE(prev.head == t.head && prev.b == t.b);
      EXPECT_EQ(prev.m0 + Cfg::kBlockM, t.m0);
    } else if (w % (group * nq) != 0) {  // inside a section: never a heavier tile after a lighter one
      EXPECT_GE(prev.m0, t.m0) << "w=" << w;
      EXPECT_EQ((prev.b * H + prev.head) / group, (t.b * H + t.head) / group) << "w=" << w;
    }
  }
  if (Cfg::kCausal) {
    const auto last = Cfg::work_tile(total - 1, nq, H, B, group);
    EXPECT_EQ(last.m0, 0) << "the launch ends on a lightest tile";
  }
}

TEST(AttentionHopperLayout, ForwardWorkTilesCoverTheLaunch) {
  for (const int S : {1, 128, 129, 512, 2048, 3000})
    for (const int sms : {1, 7, 132}) {
      expect_work_tiles_cover<hopper::FwdConfig<64, false>>(S, 3, 2, sms, 1);
      expect_work_tiles_cover<hopper::FwdConfig<128, false>>(S, 16, 4, sms, 1);
      for (const int group : {1, 2, 4, 5, 15})
        expect_work_tiles_cover<hopper::FwdConfig<64, true>>(S, 5, 3, sms, group);
      expect_work_tiles_cover<hopper::FwdConfig<128, true>>(S, 2, 2, sms, 3);
      expect_work_tiles_cover<hopper::FwdConfig<64, false, 3>>(S, 3, 2, sms, 1);
      expect_work_tiles_cover<hopper::FwdConfig<64, true, 3>>(S, 5, 3, sms, 2);
    }
  // Persistent: without causal only.
  EXPECT_TRUE((hopper::FwdConfig<64, false>::kPersistent));
  EXPECT_TRUE((hopper::FwdConfig<128, false>::kPersistent));
  EXPECT_FALSE((hopper::FwdConfig<64, true>::kPersistent));
  EXPECT_FALSE((hopper::FwdConfig<128, true>::kPersistent));
  // Causal sections: 24 MiB of K/V, at least one pair, at most all.
  EXPECT_EQ(hopper::causal_group(2048, 128, 64), 24);   // 1 MiB a pair
  EXPECT_EQ(hopper::causal_group(8192, 64, 32), 12);    // 2 MiB a pair
  EXPECT_EQ(hopper::causal_group(2048, 64, 16), 16);    // all of them
  EXPECT_EQ(hopper::causal_group(1 << 20, 128, 8), 1);  // 512 MiB a pair
}

// The ping-pong's register reallocation: what the producer warpgroup frees covers what the
// consumer warpgroups take, within the CTA's launch allocation (168 a thread at 384 threads, 128
// at 512), or setmaxnreg.inc would wait forever.
template <class Cfg>
void expect_register_budget(int threads, int launch_regs) {
  EXPECT_EQ(Cfg::kThreads, threads);
  EXPECT_EQ(Cfg::kLaunchRegs, launch_regs);
  EXPECT_LE(Cfg::kProducerRegs * 128 + Cfg::kConsumerRegs * 128 * Cfg::kConsumers, Cfg::kLaunchRegs * Cfg::kThreads);
  EXPECT_GT(Cfg::kConsumerRegs, Cfg::kLaunchRegs);
  EXPECT_GE(Cfg::kProducerRegs, 24);
  EXPECT_EQ(Cfg::kConsumerRegs % 8, 0);
  EXPECT_EQ(Cfg::kProducerRegs % 8, 0);
}

TEST(AttentionHopperLayout, PingPongRegisterBudget) {
  expect_register_budget<hopper::FwdConfig<128, true>>(384, 168);
  expect_register_budget<hopper::FwdConfig<64, false>>(384, 168);
  expect_register_budget<hopper::FwdConfig<64, false, 3>>(512, 128);
}

// Plays the ping-pong's turn protocol out as the kernel runs it (per warpgroup: turn_opens' arrival,
// then per turn bar.sync on its barrier, the wgmma issue, turn_passes' bar.arrive on the next
// one's), with the hardware barriers' rule (a phase completes when kTurnThreads threads arrived,
// waiters included), over random interleavings: no deadlock, every phase completed has its waiter,
// no phase is left half-arrived at the end (the barriers are clean at exit), and the issues go
// round warpgroup 0, 1, ..., N-1, 0, ... turn by turn.
template <class Cfg>
void expect_turns_go_round() {
  constexpr int N = Cfg::kConsumers;
  SCOPED_TRACE(std::to_string(N) + " consumer warpgroups");
  EXPECT_EQ(Cfg::kTurnThreads, 2 * 128);
  for (int wg = 0; wg < N; ++wg) {
    EXPECT_GE(Cfg::turn_barrier(wg), 1) << "0 is __syncthreads' barrier";
    EXPECT_LE(Cfg::turn_barrier(wg), 15);
    for (int other = 0; other < wg; ++other) EXPECT_NE(Cfg::turn_barrier(wg), Cfg::turn_barrier(other));
    EXPECT_EQ(Cfg::turn_next(wg), Cfg::turn_barrier((wg + 1) % N));
  }
  enum Kind { Arrive, Sync, Issue };
  struct Op {
    Kind kind;
    int arg;
  };
  std::mt19937_64 rng(2424);
  for (int turns = 0; turns <= 9; ++turns)
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<Op> prog[N];
      for (int wg = 0; wg < N; ++wg) {
        if (Cfg::turn_opens(wg, turns)) prog[wg].push_back({Arrive, Cfg::turn_next(wg)});
        for (int t = 0; t < turns; ++t) {
          prog[wg].push_back({Sync, Cfg::turn_barrier(wg)});
          prog[wg].push_back({Issue, t});
          if (Cfg::turn_passes(wg, t, turns)) prog[wg].push_back({Arrive, Cfg::turn_next(wg)});
        }
      }
      int arrived[16] = {}, phase[16] = {};
      bool waiter[16] = {};
      std::size_t pc[N] = {};
      int blocked_on[N], blocked_phase[N] = {};
      for (int wg = 0; wg < N; ++wg) blocked_on[wg] = -1;
      std::vector<std::pair<int, int>> issues;
      auto arrive = [&](int b, bool waits) {
        arrived[b] += 128;
        waiter[b] = waiter[b] || waits;
        ASSERT_LE(arrived[b], Cfg::kTurnThreads);
        if (arrived[b] == Cfg::kTurnThreads) {
          ASSERT_TRUE(waiter[b]) << "barrier " << b << " completed a phase with nobody waiting, turns " << turns;
          arrived[b] = 0;
          waiter[b] = false;
          ++phase[b];
        }
      };
      for (;;) {
        int ready[N], n_ready = 0;
        for (int wg = 0; wg < N; ++wg) {
          if (blocked_on[wg] >= 0 && phase[blocked_on[wg]] != blocked_phase[wg]) blocked_on[wg] = -1;
          if (blocked_on[wg] < 0 && pc[wg] < prog[wg].size()) ready[n_ready++] = wg;
        }
        if (n_ready == 0) break;
        const int wg = ready[rng() % n_ready];
        const Op op = prog[wg][pc[wg]++];
        if (op.kind == Issue) {
          issues.push_back({wg, op.arg});
        } else {
          const int ph = phase[op.arg];
          arrive(op.arg, op.kind == Sync);
          if (op.kind == Sync && phase[op.arg] == ph) blocked_on[wg] = op.arg, blocked_phase[wg] = ph;
        }
      }
      for (int wg = 0; wg < N; ++wg) {
        ASSERT_EQ(pc[wg], prog[wg].size()) << "warpgroup " << wg << " deadlocked, turns " << turns;
        ASSERT_EQ(blocked_on[wg], -1) << "warpgroup " << wg << " still waits at the end, turns " << turns;
      }
      for (int b = 0; b < 16; ++b) ASSERT_EQ(arrived[b], 0) << "barrier " << b << " left half-arrived, turns " << turns;
      ASSERT_EQ(issues.size(), static_cast<std::size_t>(N * turns));
      for (int i = 0; i < N * turns; ++i)
        ASSERT_EQ(issues[i], std::make_pair(i % N, i / N)) << "issue " << i << " out of turn, turns " << turns;
    }
}

TEST(AttentionHopperLayout, PingPongTurnsGoRoundAndBalance) {
  expect_turns_go_round<hopper::FwdConfig<64, false>>();
  expect_turns_go_round<hopper::FwdConfig<64, true, 3>>();
}

TEST(AttentionHopperLayout, DescriptorFields) {
  const std::uint64_t d = hopper::smem_desc(0x12340u, 16u * 96u * 8u, 1024u);
  EXPECT_EQ(d & 0x3FFFu, 0x12340u >> 4) << "start address >> 4 in bits 0-13";
  EXPECT_EQ((d >> 16) & 0x3FFFu, 96u * 8u) << "LBO >> 4 in bits 16-29";
  EXPECT_EQ((d >> 32) & 0x3FFFu, 64u) << "SBO >> 4 in bits 32-45";
  EXPECT_EQ((d >> 49) & 7u, 0u) << "base offset 0";
  EXPECT_EQ(d >> 62, 1u) << "128-byte swizzle";
  EXPECT_EQ((d >> 14) & 3u, 0u);
  EXPECT_EQ((d >> 30) & 3u, 0u);
  EXPECT_EQ((d >> 46) & 7u, 0u);
}

// Every k16-step offset a kernel advances a tile's descriptor by (fwd.cu, bwd.cu, dq.cu:
// desc_advance), with the LBO that operand uses.
template <class Cfg>
void collect_forward_advances(std::set<std::pair<std::uint32_t, std::uint32_t>>& out) {
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
    for (int wg = 0; wg < Cfg::kConsumers; ++wg) out.insert({Cfg::q_slice(wg, kk) - Cfg::q_slice(wg, 0), hopper::kUnusedLbo});
    out.insert({Cfg::k_slice(kk), hopper::kUnusedLbo});
  }
  for (int ks = 0; ks < Cfg::kBlockN / 16; ++ks) out.insert({Cfg::v_slice(ks), Cfg::kVLbo});
}
template <class Cfg>
void collect_backward_advances(std::set<std::pair<std::uint32_t, std::uint32_t>>& out) {
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk)
    for (int wg = 0; wg < 2; ++wg) {
      out.insert({Cfg::kv_a_slice(wg, kk) - Cfg::kv_a_slice(wg, 0), hopper::kUnusedLbo});
      out.insert({Cfg::q_b_slice(kk), hopper::kUnusedLbo});
    }
  for (int ks = 0; ks < Cfg::kBlockM / 16; ++ks) out.insert({Cfg::q_mn_slice(ks), Cfg::kQLbo});
  for (int ks = 0; ks < 4; ++ks)
    for (int wg = 0; wg < 2; ++wg) {
      out.insert({Cfg::ds_mn_slice(ks), hopper::kUnusedLbo});
      out.insert({Cfg::k_mn_slice(wg, ks) - Cfg::k_mn_slice(wg, 0), Cfg::kKLbo});
    }
}
template <class Cfg>
void collect_dq_advances(std::set<std::pair<std::uint32_t, std::uint32_t>>& out) {
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
    for (int wg = 0; wg < 2; ++wg) out.insert({Cfg::q_slice(wg, kk) - Cfg::q_slice(wg, 0), hopper::kUnusedLbo});
    out.insert({Cfg::k_slice(kk), hopper::kUnusedLbo});
  }
  for (int ks = 0; ks < Cfg::kBlockN / 16; ++ks) out.insert({Cfg::k_mn_slice(ks), Cfg::kKLbo});
}

// desc_advance(smem_desc(a), off) is smem_desc(a + off): at every offset the kernels use, from
// every 1024-aligned base whose slice stays in the shared window, and at random 16-byte aligned
// addresses and offsets in it, so the descriptors the kernels hand to wgmma are the same bits as a
// full encoding of each step's address.
TEST(AttentionHopperLayout, DescriptorAdvanceMatchesEncoding) {
  std::set<std::pair<std::uint32_t, std::uint32_t>> adv;
  collect_forward_advances<hopper::FwdConfig<64, false>>(adv);
  collect_forward_advances<hopper::FwdConfig<64, true, 3>>(adv);
  collect_forward_advances<hopper::FwdConfig<128, true>>(adv);
  collect_backward_advances<hopper::BwdConfig<64, false>>(adv);
  collect_backward_advances<hopper::BwdConfig<128, true>>(adv);
  collect_dq_advances<hopper::DqConfig<64, false>>(adv);
  collect_dq_advances<hopper::DqConfig<128, true>>(adv);
  ASSERT_GT(adv.size(), 20u);
  constexpr std::uint32_t kWindow = 1u << 18;
  for (const auto& [off, lbo] : adv) {
    ASSERT_EQ(off % 16, 0u) << "offset " << off;
    for (std::uint32_t a = 0; a + off < kWindow; a += 1024)
      ASSERT_EQ(hopper::desc_advance(hopper::smem_desc(a, lbo, 1024), off), hopper::smem_desc(a + off, lbo, 1024))
          << "base " << a << " + " << off << ", LBO " << lbo;
  }
  std::mt19937 rng(24);
  for (int i = 0; i < 100000; ++i) {
    const std::uint32_t a = (rng() % kWindow) & ~15u, off = (rng() % (kWindow - a)) & ~15u;
    const std::uint32_t lbo = (rng() % (1u << 14)) << 4;
    ASSERT_EQ(hopper::desc_advance(hopper::smem_desc(a, lbo, 1024), off), hopper::smem_desc(a + off, lbo, 1024))
        << a << " + " << off;
  }
}

// O's staging (the forward's epilogue, store_rows_staged): o_stage_offset places every 16-byte chunk
// of a warp's 16 x D tile once, inside the tile; the stmatrix lanes (lane L: row (L & 7) + 8 *
// ((L >> 3) & 1) of chunk 2k + (L >> 4)) and the copy-out lanes (chunk 32i + L, row-major) write
// and read every chunk once, and each 8-lane phase of either touches eight distinct 16-byte bank
// groups (shared memory's 128 bytes per cycle): no bank conflict.
TEST(AttentionHopperLayout, OutputStagingCoversTheTileWithoutBankConflicts) {
  for (const int D : {64, 128}) {
    const int chunks = D / 8, tile = 16 * D * 2;
    std::set<std::uint32_t> placed;
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < chunks; ++c) {
        const std::uint32_t a = hopper::o_stage_offset(r, c, D);
        EXPECT_EQ(a % 16, 0u);
        EXPECT_LT(a, std::uint32_t(tile));
        EXPECT_EQ(a / (2 * D), std::uint32_t(r)) << "a chunk stays in its row";
        placed.insert(a);
      }
    EXPECT_EQ(placed.size(), std::size_t(16 * chunks)) << "D " << D;
    auto phase_conflict_free = [](const std::vector<std::uint32_t>& lane_addr) {
      for (int p = 0; p < 32; p += 8) {
        std::set<std::uint32_t> groups;
        for (int l = p; l < p + 8; ++l) groups.insert((lane_addr[l] >> 4) & 7u);
        if (groups.size() != 8) return false;
      }
      return true;
    };
    std::set<std::uint32_t> written, read;
    for (int k = 0; k < D / 16; ++k) {
      std::vector<std::uint32_t> addr(32);
      for (int L = 0; L < 32; ++L) {
        const int mi = L >> 3, r = (L & 7) + 8 * (mi & 1);
        addr[L] = hopper::o_stage_offset(r, 2 * k + (mi >> 1), D);
        written.insert(addr[L]);
      }
      EXPECT_TRUE(phase_conflict_free(addr)) << "stmatrix k " << k << " D " << D;
    }
    for (int i = 0; i < D / 16; ++i) {
      std::vector<std::uint32_t> addr(32);
      for (int L = 0; L < 32; ++L) {
        const int idx = 32 * i + L;
        addr[L] = hopper::o_stage_offset(idx / chunks, idx % chunks, D);
        read.insert(addr[L]);
      }
      EXPECT_TRUE(phase_conflict_free(addr)) << "copy-out i " << i << " D " << D;
    }
    EXPECT_EQ(written, placed);
    EXPECT_EQ(read, placed);
  }
  // Without the XOR, an stmatrix matrix's eight rows would share one bank group: the check above fails.
  std::set<std::uint32_t> plain;
  for (int r = 0; r < 8; ++r) plain.insert(((r * 128u) >> 4) & 7u);
  EXPECT_EQ(plain.size(), 1u);
}

TEST(AttentionHopperLayout, TensorMapGeometryAddressesQkv) {
  for (const AttentionShape sh : {AttentionShape{2, 7, 3, 64, false}, AttentionShape{3, 129, 5, 128, true}}) {
    const int D = sh.head_dim, H = sh.heads, S = sh.seq;
    const auto g = hopper::qkv_tma_geometry(sh, 96);
    EXPECT_EQ(g.dims[0], std::uint64_t(D));
    EXPECT_EQ(g.dims[1], std::uint64_t(H));
    EXPECT_EQ(g.dims[2], 3u);
    EXPECT_EQ(g.dims[3], std::uint64_t(S)) << "tokens bounded per sequence: the tail reads zeros";
    EXPECT_EQ(g.dims[4], std::uint64_t(sh.batch));
    EXPECT_EQ(g.box[0] * 2u, 128u) << "one box row is one 128-byte swizzle span";
    EXPECT_EQ(g.box[1], 1u);
    EXPECT_EQ(g.box[2], 1u);
    EXPECT_EQ(g.box[3], 96u);
    EXPECT_EQ(g.box[4], 1u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(g.strides[i] % 16, 0u) << "TMA strides are multiples of 16 bytes";
    // Coordinate (d, h, w, s, b) must land on qkv[b][s][w][h][d].
    for (int b = 0; b < sh.batch; ++b)
      for (int s : {0, S / 2, S - 1})
        for (int w = 0; w < 3; ++w)
          for (int h : {0, H - 1})
            for (int d2 : {0, D - 1}) {
              const std::uint64_t bytes = 2ull * d2 + g.strides[0] * h + g.strides[1] * w + g.strides[2] * s +
                                          g.strides[3] * b;
              const std::uint64_t want = ((static_cast<std::uint64_t>(b) * S + s) * 3 + w) * H * D + h * D + d2;
              ASSERT_EQ(bytes, 2 * want) << "b " << b << " s " << s << " w " << w << " h " << h << " d " << d2;
            }
  }
  EXPECT_NE(test::error_of([] { hopper::qkv_tma_geometry({1, 8, 1, 64, false}, 257); }).find("box_rows"),
            std::string::npos);
}

TEST(AttentionHopperLayout, HostChecksRefuseBadArguments) {
  // Fake, well-aligned addresses: the checks never dereference them and fail before any CUDA call.
  const auto* qkv = reinterpret_cast<const bf16*>(std::uintptr_t{1} << 20);
  auto* out = reinterpret_cast<bf16*>(std::uintptr_t{2} << 20);
  auto* lse = reinterpret_cast<float*>(std::uintptr_t{3} << 20);
  const AttentionShape ok{2, 100, 4, 128, true};
  EXPECT_EQ(test::error_of([&] { hopper::check_forward_args(qkv, out, lse, ok); }), "");
  auto err = [&](const AttentionShape& sh, const bf16* q, bf16* o, float* l) {
    return test::error_of([&] { hopper::attention_forward(nullptr, q, o, l, sh); });
  };
  EXPECT_NE(err({2, 100, 4, 96, false}, qkv, out, lse).find("head_dim must be 64 or 128, got 96"), std::string::npos);
  EXPECT_NE(err({2, 0, 4, 64, false}, qkv, out, lse).find("seq=0"), std::string::npos);
  EXPECT_NE(err({0, 10, 4, 64, false}, qkv, out, lse).find("batch=0"), std::string::npos);
  EXPECT_NE(err({1, 10, 70000, 64, false}, qkv, out, lse).find("heads=70000"), std::string::npos);
  EXPECT_NE(err(ok, nullptr, out, lse).find("non-null"), std::string::npos);
  EXPECT_NE(err(ok, qkv + 4, out, lse).find("qkv must be 16-byte aligned"), std::string::npos);
  EXPECT_NE(err(ok, qkv, reinterpret_cast<bf16*>(reinterpret_cast<std::uintptr_t>(out) + 8), lse)
                .find("out must be 16-byte aligned"),
            std::string::npos);
  EXPECT_NE(err(ok, qkv, out, reinterpret_cast<float*>(reinterpret_cast<std::uintptr_t>(lse) + 2))
                .find("lse must be 4-byte aligned"),
            std::string::npos);
  // Options: dropout_p outside [0, 1) is refused before any device work.
  for (const float p : {1.f, -0.1f, std::nanf("")}) {
    kernels::AttentionOptions opt;
    opt.dropout_p = p;
    EXPECT_NE(test::error_of([&] {
                hopper::attention_forward(nullptr, qkv, out, lse, ok, opt);
              }).find("dropout_p must lie in [0, 1)"),
              std::string::npos)
        << "p " << p;
  }
}

// ---- backward (BwdConfig) ----

template <class Cfg>
void expect_bwd_operands_match() {
  constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  std::set<std::uint32_t> seen;
  // K_w / V_w: the K-major A of S^T = K_w Q^T (dP^T = V_w dO^T), element (m, k) = key 64wg + m, column 16kk + k.
  for (int wg = 0; wg < Cfg::kWarpgroups; ++wg)
    for (int kk = 0; kk < D / 16; ++kk)
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) {
          const std::uint32_t got = hopper::wgmma_kmajor_offset(Cfg::kv_a_slice(wg, kk), Cfg::kSbo, m, k);
          ASSERT_EQ(got, hopper::tma_sw128_offset(BN, 64 * wg + m, 16 * kk + k))
              << "K/V as A, D" << D << " wg " << wg << " kk " << kk << " m " << m << " k " << k;
          seen.insert(got);
        }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(BN) * D);
  EXPECT_LT(*seen.rbegin(), Cfg::kKVBytes);
  // Q / dO: the K-major B of S^T / dP^T, element (n, k) = query row n, column 16kk + k.
  seen.clear();
  for (int kk = 0; kk < D / 16; ++kk)
    for (int n = 0; n < BM; ++n)
      for (int k = 0; k < 16; ++k) {
        const std::uint32_t got = hopper::wgmma_kmajor_offset(Cfg::q_b_slice(kk), Cfg::kSbo, n, k);
        ASSERT_EQ(got, hopper::tma_sw128_offset(BM, n, 16 * kk + k)) << "Q/dO as B, D" << D << " kk " << kk;
        seen.insert(got);
      }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(BM) * D);
  EXPECT_LT(*seen.rbegin(), Cfg::kQBytes);
  // Q / dO: the MN-major B of dK / dV, element (k, n) = query row 16ks + k, column n.
  seen.clear();
  for (int ks = 0; ks < BM / 16; ++ks)
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < D; ++n) {
        const std::uint32_t got = hopper::wgmma_mnmajor_offset(Cfg::q_mn_slice(ks), Cfg::kQLbo, Cfg::kSbo, k, n);
        ASSERT_EQ(got, hopper::tma_sw128_offset(BM, 16 * ks + k, n)) << "Q/dO MN-major, D" << D << " ks " << ks;
        seen.insert(got);
      }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(BM) * D);
  // dS^T_w: the MN-major A of dQ, element (m, k) = query m, key row 16ks + k of the warpgroup's 64,
  // read where the kernel stored it (ds_offset). The LBO is never used: M = 64 is one 128-byte row.
  seen.clear();
  for (int ks = 0; ks < 4; ++ks)
    for (int k = 0; k < 16; ++k)
      for (int m = 0; m < 64; ++m) {
        const std::uint32_t got = hopper::wgmma_mnmajor_offset(Cfg::ds_mn_slice(ks), 1u << 20, Cfg::kSbo, k, m);
        ASSERT_EQ(got, Cfg::ds_offset(16 * ks + k, m)) << "dS^T as A, ks " << ks << " k " << k << " m " << m;
        seen.insert(got);
      }
  EXPECT_EQ(seen.size(), 64u * 64u);
  EXPECT_LT(*seen.rbegin(), Cfg::kDsBytes);
  // K_w: the MN-major B of dQ, element (k, n) = key 64wg + 16ks + k, column n.
  for (int wg = 0; wg < Cfg::kWarpgroups; ++wg) {
    seen.clear();
    for (int ks = 0; ks < 4; ++ks)
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < D; ++n) {
          const std::uint32_t got = hopper::wgmma_mnmajor_offset(Cfg::k_mn_slice(wg, ks), Cfg::kKLbo, Cfg::kSbo, k, n);
          ASSERT_EQ(got, hopper::tma_sw128_offset(BN, 64 * wg + 16 * ks + k, n))
              << "K MN-major, D" << D << " wg " << wg << " ks " << ks << " k " << k << " n " << n;
          seen.insert(got);
        }
    EXPECT_EQ(seen.size(), 64u * D);
  }
  // The kernel's dS^T stores: 4 warps x 32 lanes, word e of k-slice j holds (row 16w + gi + 8(e & 1),
  // queries 16j + 8(e >> 1) + 2t, +1) as one 4-byte word: the pair must be adjacent and the words
  // must cover the 64 x 64 tile once.
  seen.clear();
  for (int w = 0; w < 4; ++w)
    for (int lane = 0; lane < 32; ++lane)
      for (int j = 0; j < BM / 16; ++j)
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * w + lane / 4 + 8 * (e & 1), c = 16 * j + 8 * (e >> 1) + 2 * (lane % 4);
          const std::uint32_t off = Cfg::ds_offset(r, c);
          ASSERT_EQ(off % 4, 0u);
          ASSERT_EQ(Cfg::ds_offset(r, c + 1), off + 2) << "r " << r << " c " << c;
          ASSERT_TRUE(seen.insert(off).second) << "two stores to one word, r " << r << " c " << c;
        }
  EXPECT_EQ(seen.size(), 64u * 64u / 2);
}

TEST(AttentionHopperLayout, BackwardOperandsReadWhatWasWritten) {
  expect_bwd_operands_match<hopper::BwdConfig<64, false>>();
  expect_bwd_operands_match<hopper::BwdConfig<128, false>>();
  expect_bwd_operands_match<hopper::BwdConfig<64, true>>();
  expect_bwd_operands_match<hopper::BwdConfig<128, true>>();
}

// Every (query, key) score the gradient needs lies in a query tile the key's CTA walks and its
// warpgroup does not skip; a tile a warpgroup skips holds no live score; a tile the kernel treats
// as interior (no element mask) holds only live scores.
template <class Cfg>
void expect_bwd_schedule_covers(int S) {
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  auto live = [&](int q, int key) { return q < S && key < S && (!Cfg::kCausal || q >= key); };
  for (int n0 = 0; n0 < S; n0 += BN) {
    const int first = Cfg::q_first(n0), tiles = Cfg::q_tiles(S);
    ASSERT_LT(first, tiles) << "S " << S << " n0 " << n0 << ": a key block with no query tile";
    ASSERT_LT((tiles - 1) * BM, S);
    for (int wg = 0; wg < Cfg::kWarpgroups; ++wg)
      for (int qt = 0; qt < tiles; ++qt) {
        const int m0 = qt * BM;
        const bool walked = qt >= first && Cfg::wg_active(m0, n0, wg), edge = Cfg::wg_edge(m0, n0, wg, S);
        int n_live = 0;
        for (int q = m0; q < m0 + BM; ++q)
          for (int key = n0 + 64 * wg; key < n0 + 64 * wg + 64; ++key) {
            const bool l = live(q, key);
            n_live += l;
            if (!edge && walked) {
              ASSERT_TRUE(l) << "S " << S << " n0 " << n0 << " wg " << wg << " q " << q << " key " << key;
            }
          }
        if (!walked) {
          ASSERT_EQ(n_live, 0) << "S " << S << " n0 " << n0 << " wg " << wg << " m0 " << m0 << ": skipped live scores";
        }
      }
  }
}

TEST(AttentionHopperLayout, BackwardScheduleCoversEveryScore) {
  for (int S : {1, 7, 63, 64, 65, 127, 128, 129, 191, 192, 193, 200, 255, 256, 257, 385, 1000, 2049}) {
    expect_bwd_schedule_covers<hopper::BwdConfig<64, false>>(S);
    expect_bwd_schedule_covers<hopper::BwdConfig<64, true>>(S);
    expect_bwd_schedule_covers<hopper::BwdConfig<128, false>>(S);
    expect_bwd_schedule_covers<hopper::BwdConfig<128, true>>(S);
  }
}

template <class Cfg>
void expect_bwd_carve_up() {
  EXPECT_EQ(Cfg::kVOff % 1024, 0u);
  EXPECT_EQ(Cfg::kQOff % 1024, 0u);
  EXPECT_EQ(Cfg::kdOOff % 1024, 0u);
  EXPECT_EQ(Cfg::kDsOff % 1024, 0u);
  EXPECT_EQ(Cfg::kLseOff % 8, 0u) << "lse is read as float2";
  EXPECT_EQ(Cfg::kDvecOff % 8, 0u) << "Dvec is read as float2";
  EXPECT_EQ(Cfg::kBarOff % 8, 0u);
  EXPECT_EQ(Cfg::kBarOff, Cfg::kDvecOff + Cfg::kStages * Cfg::kBlockM * 4u);
  EXPECT_LE(Cfg::kSmemBytes, 227u * 1024u);
  EXPECT_EQ(Cfg::kThreads, 128 * Cfg::kWarpgroups);
  EXPECT_GE(Cfg::kThreads, 2 * Cfg::kBlockM) << "lse and Dvec take one thread per query each";
  EXPECT_EQ(Cfg::kBlockN, 64 * Cfg::kWarpgroups);
  // The fast mode's dQ staging: after the barriers, 1024-aligned (the reduce-add's 128-byte
  // swizzle), one 64 x kDqCols fp32 tile per warpgroup (half of D);
  // the deterministic mode's carve-up is the one above.
  EXPECT_EQ(Cfg::smem_bytes(true), Cfg::kSmemBytes);
  EXPECT_EQ(Cfg::kDqCols, Cfg::kHeadDim / 2);
  EXPECT_EQ(Cfg::kDqStageOff % 1024, 0u);
  EXPECT_GE(Cfg::kDqStageOff, Cfg::kBarOff + 8u * Cfg::kBarriers);
  EXPECT_EQ(Cfg::smem_bytes(false), 1024u + Cfg::kDqStageOff + Cfg::kWarpgroups * Cfg::kBlockM * Cfg::kDqCols * 4u);
  EXPECT_LE(Cfg::smem_bytes(false), 227u * 1024u);
}

// The fast mode's dQ shares: the warpgroups' column ranges (D/2 each) cover D once; each share's
// product reads its own columns of K, key 64w + 16ks + k and column c0 + n where the TMA put them
// (d64's second share starts 64 bytes into K's swizzled rows); and the schedule never walks a
// tile without warpgroup 0's keys (a causal tile on the diagonal may leave warpgroup 1 without
// any: it stores a zero dS^T).
template <class Cfg>
void expect_dq_shares() {
  constexpr int D = Cfg::kHeadDim, BN = Cfg::kBlockN;
  EXPECT_EQ(Cfg::kDqCols * Cfg::kWarpgroups, D);
  std::vector<int> owner(D, -1);
  for (int wg = 0; wg < Cfg::kWarpgroups; ++wg) {
    const int c0 = Cfg::dq_col0(wg);
    for (int c = c0; c < c0 + Cfg::kDqCols; ++c) {
      ASSERT_LT(c, D);
      EXPECT_EQ(owner[c], -1) << "column " << c << " in two shares";
      owner[c] = wg;
    }
    for (int w = 0; w < Cfg::kWarpgroups; ++w)
      for (int ks = 0; ks < 4; ++ks)
        for (int k = 0; k < 16; ++k)
          for (int n = 0; n < Cfg::kDqCols; ++n) {
            const std::uint32_t got = hopper::wgmma_mnmajor_offset(Cfg::k_col_offset(c0) + Cfg::k_mn_slice(w, ks),
                                                                   Cfg::kKLbo, Cfg::kSbo, k, n);
            ASSERT_EQ(got, hopper::tma_sw128_offset(BN, 64 * w + 16 * ks + k, c0 + n))
                << "D" << D << " share " << wg << " keys of " << w << " ks " << ks << " k " << k << " n " << n;
          }
  }
  for (int c = 0; c < D; ++c) EXPECT_NE(owner[c], -1) << "column " << c << " in no share";
  const int S = 1000;
  for (int n0 = 0; n0 < S; n0 += BN)
    for (int qt = Cfg::q_first(n0); qt < Cfg::q_tiles(S); ++qt) {
      const int m0 = qt * Cfg::kBlockM;
      ASSERT_TRUE(Cfg::wg_active(m0, n0, 0)) << "the schedule walks a tile without warpgroup 0's keys";
    }
}

TEST(AttentionHopperLayout, BackwardDqSharesCoverTheColumnsAndLiveKeys) {
  expect_dq_shares<hopper::BwdConfig<64, false>>();
  expect_dq_shares<hopper::BwdConfig<64, true>>();
  expect_dq_shares<hopper::BwdConfig<128, false>>();
  expect_dq_shares<hopper::BwdConfig<128, true>>();
}

// The fast mode's dQ share's stores into a warpgroup's staging tile: lane (gi, t) of warp w
// stores rows 16w + gi (+8), columns 8j + 2t, +1 as one float2. They must cover the 64 x kDqCols tile
// once, put each element where the TMA's reduce-add of its 32-column box (source: the tile + box
// x 64 rows x 128 bytes, 128-byte swizzle) reads it, and hit every bank exactly twice per warp store
// (two wavefronts, the least a 256-byte store takes).
template <class Cfg>
void expect_dq_staging() {
  constexpr int BM = Cfg::kBlockM, D = Cfg::kDqCols;
  std::set<std::uint32_t> seen;
  for (int w = 0; w < 4; ++w)
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < D / 8; ++j) {
        int bank_hits[32] = {};
        for (int lane = 0; lane < 32; ++lane) {
          const int r = 16 * w + lane / 4 + 8 * h, c = 8 * j + 2 * (lane % 4);
          const std::uint32_t off = Cfg::dq_stage_offset(r, c);
          ASSERT_EQ(off % 8, 0u) << "float2 store, r " << r << " c " << c;
          ASSERT_EQ(Cfg::dq_stage_offset(r, c + 1), off + 4) << "r " << r << " c " << c;
          for (const int cc : {c, c + 1}) {
            const std::uint32_t want = (cc / 32) * BM * 128u + hopper::sw128(r * 128u + (cc % 32) * 4u);
            ASSERT_EQ(Cfg::dq_stage_offset(r, cc), want) << "r " << r << " c " << cc;
            ASSERT_TRUE(seen.insert(Cfg::dq_stage_offset(r, cc)).second) << "two stores to one word, r " << r;
          }
          ++bank_hits[(off / 4) % 32];
          ++bank_hits[(off / 4 + 1) % 32];
        }
        for (int bank = 0; bank < 32; ++bank) ASSERT_EQ(bank_hits[bank], 2) << "w " << w << " h " << h << " j " << j;
      }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(BM) * D);
  EXPECT_LT(*seen.rbegin(), Cfg::kDqStageBytes);
}

TEST(AttentionHopperLayout, BackwardDqStagingMatchesTheReduceBoxes) {
  expect_dq_staging<hopper::BwdConfig<64, false>>();
  expect_dq_staging<hopper::BwdConfig<128, true>>();
}

TEST(AttentionHopperLayout, BackwardSharedMemoryCarveUp) {
  expect_bwd_carve_up<hopper::BwdConfig<64, false>>();
  expect_bwd_carve_up<hopper::BwdConfig<128, true>>();
  expect_bwd_carve_up<hopper::BwdConfig<64, true>>();
}

// The producer schedules: the consumers' tiles and carve-up are lockstep's (the same slices, the
// same shared memory), plus a producer warpgroup whose register hand-back covers the consumers'
// raise within the 384-thread CTA's pool (168 a thread at launch), and 32 lanes for a tile's 64
// lse and 64 Dvec values (two of each a lane).
template <class Cfg, class Base>
void expect_producer_geometry() {
  static_assert(Cfg::kProducer && !Base::kProducer);
  EXPECT_EQ(Cfg::kThreads, 3 * 128);
  EXPECT_EQ(Cfg::kConsumerWarps, 8);
  EXPECT_EQ(Cfg::kProducerWarp, 8) << "the producer warpgroup follows the consumers";
  EXPECT_EQ(Cfg::kSmemBytes, Base::kSmemBytes);
  EXPECT_EQ(Cfg::kBarOff, Base::kBarOff);
  EXPECT_EQ(Cfg::kBlockN, Base::kBlockN);
  EXPECT_EQ(Cfg::kBlockM, 2 * 32) << "a producer lane copies two rows of lse and Dvec";
  EXPECT_EQ(Cfg::kProducerRegs % 8, 0);
  EXPECT_EQ(Cfg::kConsumerRegs % 8, 0);
  EXPECT_GE(Cfg::kProducerRegs, 24);
  EXPECT_LE(Cfg::kConsumerRegs, 256);
  // 65536 registers over 12 warps, 3 to a sub-partition: 168 a thread at launch.
  const int launch_regs = (65536 / 4 / (3 * 32)) / 8 * 8;
  EXPECT_EQ(launch_regs, 168);
  EXPECT_LE(128 * Cfg::kProducerRegs + 256 * Cfg::kConsumerRegs, Cfg::kThreads * launch_regs)
      << "setmaxnreg.inc would wait forever for registers the pool never gets";
  for (int wg = 0; wg < 2; ++wg)
    for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) EXPECT_EQ(Cfg::kv_a_slice(wg, kk), Base::kv_a_slice(wg, kk));
  // The fast mode's dS^T: one set in lockstep (its CTA barrier ends every tile); two by tile parity
  // in the producer schedules, the odd tiles' after the staging tiles, 1024-aligned for wgmma.
  EXPECT_EQ(Base::kDsSets, 1);
  EXPECT_EQ(Cfg::kDsSets, 2);
  EXPECT_EQ(Cfg::kDsOddOff % 1024, 0u);
  EXPECT_EQ(Cfg::kDsOddOff, Cfg::kDqStageOff + Cfg::kWarpgroups * Cfg::kDqStageBytes);
  EXPECT_EQ(Cfg::smem_bytes(false), Base::smem_bytes(false) + Cfg::kWarpgroups * Cfg::kDsBytes);
  EXPECT_EQ(Cfg::smem_bytes(true), Base::smem_bytes(true));
  for (int qt = 0; qt < 6; ++qt)
    for (int w = 0; w < Cfg::kWarpgroups; ++w) {
      EXPECT_EQ(Base::ds_off(qt, w), Base::kDsOff + w * Base::kDsBytes);
      EXPECT_EQ(Cfg::ds_off(qt, w), (qt % 2 ? Cfg::kDsOddOff : Cfg::kDsOff) + w * Cfg::kDsBytes);
    }
  for (const int S : {1, 64, 129, 2049})
    for (int n0 = 0; n0 < S; n0 += Cfg::kBlockN) {
      EXPECT_EQ(Cfg::q_first(n0), Base::q_first(n0));
      EXPECT_EQ(Cfg::q_tiles(S), Base::q_tiles(S));
    }
}

TEST(AttentionHopperLayout, BackwardProducerGeometry) {
  expect_producer_geometry<hopper::BwdConfig<64, false, true>, hopper::BwdConfig<64, false>>();
  expect_producer_geometry<hopper::BwdConfig<64, true, true, true>, hopper::BwdConfig<64, true>>();
  expect_producer_geometry<hopper::BwdConfig<128, false, true, true>, hopper::BwdConfig<128, false>>();
  expect_producer_geometry<hopper::BwdConfig<128, true, true>, hopper::BwdConfig<128, true>>();
}

// The overlap loops' premise (bwd.cu's consume_overlap, dq.cu's): a warpgroup's inactive tiles
// (causal) are a prefix of the dK/dV pass's query tiles and a suffix of the dQ pass's K/V tiles,
// so each loop peels them off and runs its active tiles straight through.
TEST(AttentionHopperLayout, OverlapLoopsSeeContiguousActiveTiles) {
  using B = hopper::BwdConfig<64, true, true, true>;
  for (const int S : {1, 63, 64, 65, 128, 129, 200, 385, 1000, 2049})
    for (int n0 = 0; n0 < S; n0 += B::kBlockN)
      for (int wg = 0; wg < 2; ++wg) {
        const int first = B::q_first(n0), n = B::q_tiles(S) - first;
        bool seen_active = false;
        for (int i = 0; i < n; ++i) {
          const bool active = B::wg_active((first + i) * B::kBlockM, n0, wg);
          EXPECT_FALSE(seen_active && !active) << "S " << S << " n0 " << n0 << " wg " << wg << " tile " << i;
          seen_active = seen_active || active;
        }
        EXPECT_TRUE(seen_active || n0 + 64 * wg >= S) << "S " << S << " n0 " << n0 << " wg " << wg;
      }
  using Q = hopper::DqConfig<64, true, true>;
  for (const int S : {1, 63, 64, 65, 128, 129, 200, 385, 1000, 2049})
    for (int m0 = 0; m0 < S; m0 += Q::kBlockM)
      for (int wg = 0; wg < 2; ++wg) {
        const int n = Q::kv_tiles(S, m0), n_active = Q::active_tiles(n, m0 + 64 * wg);
        for (int j = 0; j < n; ++j)
          EXPECT_EQ(Q::tile_active(j, m0 + 64 * wg), j < n_active) << "S " << S << " m0 " << m0 << " wg " << wg;
      }
}

TEST(AttentionHopperLayout, RowsTensorMapAddressesDout) {
  const AttentionShape sh{3, 129, 5, 128, true};
  const auto g = hopper::rows_tma_geometry(sh, 1, 64);
  EXPECT_EQ(g.dims[2], 1u);
  EXPECT_EQ(g.box[3], 64u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g.strides[i] % 16, 0u);
  // Coordinate (d, h, 0, s, b) must land on dout[b][s][h][d].
  for (int b = 0; b < sh.batch; ++b)
    for (int s : {0, 64, sh.seq - 1})
      for (int h : {0, sh.heads - 1})
        for (int d : {0, sh.head_dim - 1}) {
          const std::uint64_t bytes = 2ull * d + g.strides[0] * h + g.strides[2] * s + g.strides[3] * b;
          const std::uint64_t want = ((static_cast<std::uint64_t>(b) * sh.seq + s) * sh.heads + h) * sh.head_dim + d;
          ASSERT_EQ(bytes, 2 * want) << "b " << b << " s " << s << " h " << h << " d " << d;
        }
  EXPECT_NE(test::error_of([&] { hopper::rows_tma_geometry(sh, 2, 64); }).find("slots must be 1"), std::string::npos);
}

TEST(AttentionHopperLayout, BackwardHostChecksRefuseBadArguments) {
  const auto* qkv = reinterpret_cast<const bf16*>(std::uintptr_t{1} << 20);
  const auto* out = reinterpret_cast<const bf16*>(std::uintptr_t{2} << 20);
  const auto* dout = reinterpret_cast<const bf16*>(std::uintptr_t{3} << 20);
  const auto* lse = reinterpret_cast<const float*>(std::uintptr_t{4} << 20);
  auto* dqkv = reinterpret_cast<bf16*>(std::uintptr_t{5} << 20);
  auto* scratch = reinterpret_cast<void*>(std::uintptr_t{6} << 20);
  const AttentionShape ok{2, 100, 4, 64, false};
  EXPECT_EQ(test::error_of([&] { hopper::check_backward_args(qkv, out, dout, lse, dqkv, scratch, ok); }), "");
  auto err = [&](const AttentionShape& sh, const bf16* q, const bf16* o, const bf16* dO, const float* l, bf16* dq,
                 void* sc) {
    return test::error_of([&] { hopper::attention_backward(nullptr, q, o, dO, l, dq, sc, sh); });
  };
  EXPECT_NE(err({2, 100, 4, 80, false}, qkv, out, dout, lse, dqkv, scratch).find("head_dim must be 64 or 128, got 80"),
            std::string::npos);
  EXPECT_NE(err({2, 0, 4, 64, false}, qkv, out, dout, lse, dqkv, scratch).find("seq=0"), std::string::npos);
  EXPECT_NE(err({1, 10, 70000, 64, false}, qkv, out, dout, lse, dqkv, scratch).find("heads=70000"), std::string::npos);
  EXPECT_NE(err(ok, qkv, out, nullptr, lse, dqkv, scratch).find("non-null"), std::string::npos);
  EXPECT_NE(err(ok, qkv, out, dout, lse, dqkv, nullptr).find("non-null"), std::string::npos);
  EXPECT_NE(err(ok, qkv, out, dout + 4, lse, dqkv, scratch).find("qkv and dout must be 16-byte aligned"),
            std::string::npos);
  EXPECT_NE(err(ok, qkv, out, dout, lse, dqkv, static_cast<char*>(scratch) + 8).find("scratch must be 16-byte aligned"),
            std::string::npos);
  EXPECT_NE(err(ok, qkv, out, dout, lse, dqkv + 4, scratch).find("dqkv must be 16-byte aligned"), std::string::npos);
  EXPECT_NE(err(ok, qkv, out + 4, dout, lse, dqkv, scratch).find("out must be 16-byte aligned"), std::string::npos);
  const auto* lse_odd = reinterpret_cast<const float*>(reinterpret_cast<const char*>(lse) + 2);
  EXPECT_NE(err(ok, qkv, out, dout, lse_odd, dqkv, scratch).find("lse must be 4-byte aligned"), std::string::npos);
  EXPECT_NE(test::error_of([&] {
              hopper::attention_backward(nullptr, qkv, out, dout, lse, dqkv, scratch, ok,
                                         static_cast<hopper::BackwardSchedule>(5));
            }).find("schedule must be Lockstep, Producer or ProducerOverlap, got 5"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              hopper::attention_backward(nullptr, qkv, out, dout, lse, dqkv, scratch, ok,
                                         hopper::BackwardSchedule::Producer, {}, true,
                                         static_cast<hopper::DqSchedule>(3));
            }).find("dq_schedule must be Serial or Overlap, got 3"),
            std::string::npos);
  kernels::AttentionOptions opt;
  opt.dropout_p = 1.5f;
  EXPECT_NE(test::error_of([&] {
              hopper::attention_backward(nullptr, qkv, out, dout, lse, dqkv, scratch, ok,
                                         hopper::BackwardSchedule::Lockstep, opt);
            }).find("dropout_p must lie in [0, 1), got 1.5"),
            std::string::npos);
}

// ---- the deterministic mode's dQ pass (DqConfig) ----

// Q and dO (the same [kBlockM][D] layout) as the K-major A of S / dP, K and V as their K-major B,
// and K as dQ's MN-major B (read transposed, as the forward reads V): each slice reads exactly the
// element the TMA put there.
template <class Cfg>
void expect_dq_operands_match_tma() {
  constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  std::set<std::uint32_t> seen;
  for (int wg = 0; wg < Cfg::kConsumers; ++wg)
    for (int kk = 0; kk < D / 16; ++kk)
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) {
          const std::uint32_t got = hopper::wgmma_kmajor_offset(Cfg::q_slice(wg, kk), Cfg::kSbo, m, k);
          ASSERT_EQ(got, hopper::tma_sw128_offset(BM, 64 * wg + m, 16 * kk + k))
              << "Q/dO D" << D << " wg " << wg << " kk " << kk << " m " << m << " k " << k;
          seen.insert(got);
        }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(BM) * D) << "Q/dO: every element read exactly once";
  EXPECT_LT(*seen.rbegin(), Cfg::kQBytes);
  seen.clear();
  for (int kk = 0; kk < D / 16; ++kk)
    for (int n = 0; n < BN; ++n)
      for (int k = 0; k < 16; ++k) {
        const std::uint32_t got = hopper::wgmma_kmajor_offset(Cfg::k_slice(kk), Cfg::kSbo, n, k);
        ASSERT_EQ(got, hopper::tma_sw128_offset(BN, n, 16 * kk + k)) << "K/V D" << D << " kk " << kk << " n " << n;
        seen.insert(got);
      }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(BN) * D);
  EXPECT_LT(*seen.rbegin(), Cfg::kKVBytes);
  // dQ += dS K: element (k, n) of step ks = key 16ks + k, column n.
  seen.clear();
  for (int ks = 0; ks < BN / 16; ++ks)
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < D; ++n) {
        const std::uint32_t got = hopper::wgmma_mnmajor_offset(Cfg::k_mn_slice(ks), Cfg::kKLbo, Cfg::kSbo, k, n);
        ASSERT_EQ(got, hopper::tma_sw128_offset(BN, 16 * ks + k, n)) << "K^T D" << D << " ks " << ks << " k " << k
                                                                     << " n " << n;
        seen.insert(got);
      }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(BN) * D);
}

TEST(AttentionHopperLayout, DqOperandsReadWhatTheTmaWrote) {
  expect_dq_operands_match_tma<hopper::DqConfig<64, false>>();
  expect_dq_operands_match_tma<hopper::DqConfig<128, false>>();
  expect_dq_operands_match_tma<hopper::DqConfig<64, true>>();
  expect_dq_operands_match_tma<hopper::DqConfig<128, true>>();
}

// The dQ pass streams K/V with the forward's schedule functions over its own tile sizes: every
// score a query row needs lies in a streamed tile its warpgroup works on (with a key mask: every
// valid key).
TEST(AttentionHopperLayout, DqScheduleCoversEveryScore) {
  for (int S : {1, 7, 63, 64, 65, 127, 128, 129, 191, 192, 193, 200, 255, 256, 257, 385, 512, 1000, 1024, 2049}) {
    expect_schedule_covers<hopper::DqConfig<64, false>>(S);
    expect_schedule_covers<hopper::DqConfig<64, true>>(S);
    expect_schedule_covers<hopper::DqConfig<128, false>>(S);
    expect_schedule_covers<hopper::DqConfig<128, true>>(S);
  }
  std::mt19937_64 rng(25);
  for (int S : {1, 7, 64, 65, 128, 129, 200, 257, 385, 512, 1000}) {
    expect_masked_schedule_covers<hopper::DqConfig<64, false>>(S, rng);
    expect_masked_schedule_covers<hopper::DqConfig<64, true>>(S, rng);
    expect_masked_schedule_covers<hopper::DqConfig<128, false>>(S, rng);
    expect_masked_schedule_covers<hopper::DqConfig<128, true>>(S, rng);
  }
}

template <class Cfg>
void expect_dq_carve_up() {
  EXPECT_EQ(Cfg::kdOOff % 1024, 0u);
  EXPECT_EQ(Cfg::kKOff % 1024, 0u);
  EXPECT_EQ(Cfg::kVOff % 1024, 0u);
  EXPECT_EQ(Cfg::kKVBytes % 1024, 0u);
  EXPECT_EQ(Cfg::kdOOff, Cfg::kQBytes);
  EXPECT_EQ(Cfg::kBarOff, 2u * Cfg::kQBytes + 2u * Cfg::kStages * Cfg::kKVBytes);
  EXPECT_EQ(Cfg::kBarOff % 8, 0u);
  EXPECT_EQ(Cfg::kSmemBytes, 1024u + Cfg::kBarOff + 8u * (2 + 3 * Cfg::kStages));  // q_full, q_empty, the ring
  EXPECT_LE(Cfg::kSmemBytes, 227u * 1024u);
  EXPECT_EQ(Cfg::kThreads, 128 * Cfg::kConsumers + 32);
  EXPECT_EQ(Cfg::kProducerWarp, 4 * Cfg::kConsumers);
  EXPECT_EQ(Cfg::kBlockM, 64 * Cfg::kConsumers) << "one warpgroup per 64 queries (wgmma's M)";
  EXPECT_EQ(Cfg::kBlockN / 8, 8) << "one row_keep_bits call covers a row half's 8 n-tiles";
}

TEST(AttentionHopperLayout, DqSharedMemoryCarveUp) {
  expect_dq_carve_up<hopper::DqConfig<64, false>>();
  expect_dq_carve_up<hopper::DqConfig<128, true>>();
  EXPECT_EQ(hopper::dq_smem_bytes(64), (hopper::DqConfig<64, false>::kSmemBytes));
  EXPECT_EQ(hopper::dq_smem_bytes(128), (hopper::DqConfig<128, true>::kSmemBytes));
}

// The fp16 instances and the production entry points check what the bf16 sm90 entry points check,
// before any device work (fake, aligned addresses; nothing is dereferenced).
TEST(AttentionHopperLayout, Fp16AndProductionEntryPointsCheckFirst) {
  const auto* qkv = reinterpret_cast<const f16*>(std::uintptr_t{1} << 20);
  auto* out = reinterpret_cast<f16*>(std::uintptr_t{2} << 20);
  auto* lse = reinterpret_cast<float*>(std::uintptr_t{3} << 20);
  const auto* dout = reinterpret_cast<const f16*>(std::uintptr_t{4} << 20);
  auto* dqkv = reinterpret_cast<f16*>(std::uintptr_t{5} << 20);
  auto* scratch = reinterpret_cast<void*>(std::uintptr_t{6} << 20);
  EXPECT_NE(test::error_of([&] { hopper::attention_forward(nullptr, qkv, out, lse, {2, 100, 4, 96, false}); })
                .find("attention_forward: head_dim must be 64 or 128, got 96"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { kernels::attention_forward(nullptr, qkv + 4, out, lse, {2, 100, 4, 64, true}); })
                .find("qkv must be 16-byte aligned"),
            std::string::npos);
  for (const bool det : {false, true}) {
    EXPECT_NE(test::error_of([&] {
                kernels::attention_backward(nullptr, qkv, out, dout, lse, dqkv, scratch, {2, 100, 4, 80, false}, det,
                                            {});
              }).find("attention_backward: head_dim must be 64 or 128, got 80"),
              std::string::npos);
    EXPECT_NE(test::error_of([&] {
                kernels::attention_backward(nullptr, qkv, out, dout, lse, dqkv + 1, scratch, {2, 100, 4, 64, false},
                                            det, {});
              }).find("dqkv must be 16-byte aligned"),
              std::string::npos);
    kernels::AttentionOptions opt;
    opt.dropout_p = -0.5f;
    EXPECT_NE(test::error_of([&] {
                hopper::attention_backward(nullptr, qkv, out, dout, lse, dqkv, scratch, {2, 100, 4, 64, false},
                                           hopper::BackwardSchedule::Producer, opt, det);
              }).find("dropout_p must lie in [0, 1), got -0.5"),
              std::string::npos);
  }
}

// The schedules the production entry points run (the measured leaders, docs/perf-notes.md).
TEST(AttentionHopperLayout, ProductionSchedules) {
  for (const bool det : {false, true}) {
    for (const bool c : {false, true})
      for (const int s : {512, 1000, 1024, 2048, 8192}) {
        const hopper::BackwardPlan p = hopper::production_backward({4, s, 16, 128, c}, det);
        EXPECT_EQ(p.two_pass, det || s < 1024) << "d128 fast mode: one pass from S1024 up, S " << s;
        EXPECT_EQ(p.schedule, hopper::BackwardSchedule::Lockstep);
        EXPECT_EQ(p.dq, hopper::DqSchedule::Serial);
        // What `cutrain train` tells a fast-mode user: the public query follows the plan.
        EXPECT_EQ(cutrain::kernels::attention_backward_adds_dq({4, s, 16, 128, c}), s >= 1024) << "S " << s;
        EXPECT_TRUE(cutrain::kernels::attention_backward_adds_dq({4, s, 16, 64, c})) << "S " << s;
      }
    const hopper::BackwardPlan full = hopper::production_backward({4, 2048, 16, 64, false}, det);
    const hopper::BackwardPlan causal = hopper::production_backward({4, 2048, 16, 64, true}, det);
    EXPECT_EQ(full.two_pass, det);  // one pass (dQ by reduce-adds) unless determinism is asked for
    EXPECT_EQ(causal.two_pass, det);
    EXPECT_EQ(full.schedule, det ? hopper::BackwardSchedule::ProducerOverlap : hopper::BackwardSchedule::Producer);
    EXPECT_EQ(full.dq, det ? hopper::DqSchedule::Overlap : hopper::DqSchedule::Serial);
    EXPECT_EQ(causal.schedule, hopper::BackwardSchedule::Producer);
    EXPECT_EQ(causal.dq, hopper::DqSchedule::Serial);
  }
  // The forward's tile at the measured shapes on an H100's 132 SMs: Rows192 where it was faster.
  using hopper::FwdTile;
  struct Case {
    AttentionShape sh;
    FwdTile want;
  };
  const Case cases[] = {
      {{4, 512, 16, 64, true}, FwdTile::Rows128},    {{32, 512, 16, 64, true}, FwdTile::Rows192},
      {{16, 1024, 16, 64, true}, FwdTile::Rows192},  {{4, 2048, 16, 64, true}, FwdTile::Rows192},
      {{8, 2048, 16, 64, true}, FwdTile::Rows192},   {{2, 8192, 16, 64, true}, FwdTile::Rows192},
      {{16, 1024, 12, 64, true}, FwdTile::Rows192},  // GPT-2 small's step
      {{4, 512, 16, 64, false}, FwdTile::Rows128},   {{32, 512, 16, 64, false}, FwdTile::Rows192},
      {{16, 1024, 16, 64, false}, FwdTile::Rows192}, {{4, 2048, 16, 64, false}, FwdTile::Rows192},
      {{8, 2048, 16, 64, false}, FwdTile::Rows192},  {{4, 4096, 16, 64, false}, FwdTile::Rows192},
      {{2, 8192, 16, 64, false}, FwdTile::Rows192},  {{64, 128, 16, 64, false}, FwdTile::Rows128},
      {{16, 512, 16, 64, false}, FwdTile::Rows192},  {{4, 2048, 16, 128, false}, FwdTile::Rows128},
      {{4, 2048, 16, 128, true}, FwdTile::Rows128},
      {{1, 2048, 16, 64, false}, FwdTile::Rows128},  // two rounds either way: the 128-row ones are shorter
  };
  for (const Case& k : cases)
    EXPECT_EQ(hopper::production_forward(k.sh, 132), k.want)
        << "B" << k.sh.batch << " S" << k.sh.seq << " H" << k.sh.heads << " D" << k.sh.head_dim
        << (k.sh.causal ? " causal" : "");
  EXPECT_EQ(hopper::production_forward({8, 2048, 16, 64, false}, 0), FwdTile::Rows128) << "no SM count: the default";
}

}  // namespace
