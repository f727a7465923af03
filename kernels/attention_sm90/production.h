// @brief The forward tile and the backward schedules the production entry points
// (kernels::attention_forward / attention_backward) run: the forward's tile per shape and SM count,
// the backward's per (head_dim, causal, seq, determinism), each the fastest bench_attention_hopper
// measured on an H100 in one device call (docs/perf-notes.md, "Attention: the production
// schedules", has the tables and the commands). Every other schedule stays reachable through the
// sm90 functions' arguments (tests, benchmarks).
#pragma once

#include "kernels/attention_sm90/attention_sm90.h"

namespace cutrain::kernels::sm90 {

// Forward: the query tile, per shape, from the measurements of device calls on one H100
// (2026-12-07; docs/perf-notes.md, "O staged through shared memory"). d128: Rows128 (the 192-row
// tile is d64's). d64 causal: Rows192 once the launch has at least four blocks of 192 rows per SM
// (6-14% faster from B16 H16 S1024 up; at B4 H16 S512, 192 blocks, 11% slower). d64 without causal
// (persistent CTAs): Rows192 where its rounds of work tiles over the SMs take less, counting a
// 192-row tile as 1.5 x 0.88 of a 128-row one: 8-10% faster at B16-B32 H16 S512 and B16 H16 S1024,
// 10-19% from S2048 up; Rows128 where the 192-row tiles' rounds take longer (a few (batch, head)
// pairs: at B4 H16 S512 two rounds either way, and Rows192 19% slower).
constexpr FwdTile production_forward(const AttentionShape& sh, int sms) {
  if (sh.head_dim != 64 || sms < 1) return FwdTile::Rows128;
  const long long pairs = static_cast<long long>(sh.batch) * sh.heads;
  const long long tiles128 = pairs * ((sh.seq + 127) / 128), tiles192 = pairs * ((sh.seq + 191) / 192);
  if (sh.causal) return tiles192 >= 4LL * sms ? FwdTile::Rows192 : FwdTile::Rows128;
  const long long rounds128 = (tiles128 + sms - 1) / sms, rounds192 = (tiles192 + sms - 1) / sms;
  return rounds192 * 192 * 88 < rounds128 * 128 * 100 ? FwdTile::Rows192 : FwdTile::Rows128;
}

// Backward: which algorithm and schedules. two_pass: the dK/dV pass without dQ, then the dQ pass
// (the deterministic mode's algorithm: same bits every run); otherwise one pass that adds dQ into
// an fp32 accumulator by TMA reduce-adds. A caller that asks for determinism always gets two_pass.
// d128: the lockstep dK/dV pass (at d128 the producer schedules run lockstep) and the serial dQ
// loop. In the fast mode one pass from S 1024 up (H100, f361b43, one call: 829 vs 857 us at B4 H16
// S2048, 5821 vs 6284 at B2 H16 S8192, 943 vs 957 at B16 H16 S1024; causal 508 vs 546, 3078 vs
// 3695, 681 vs 704), two passes at S512 (B32 H16: 597 vs 622, causal 508 vs 564).
// d64, fast mode: one pass, the producer dK/dV pass (H100, 009a1de, one call: 3932 vs 4721 us
// two-pass at B2 H16 S8192, 582 vs 672 at B4 H16 S2048, 68.5 vs 71.7 at B4 H16 S512; causal 2126
// at B2 H16 S8192; with dQ split by columns, 2d92481, one call: 3541 vs 3627 us one-pass lockstep
// at B2 H16 S8192, 511 vs 540 at B4 H16 S2048, a tie at B4 H16 S512, causal 1885 vs 1940). Deterministic: without causal the producer overlap dK/dV loop and the dQ
// pass's overlap loop (673 us at B4 H16 S2048 vs 758 two-pass lockstep), causal the producer
// dK/dV pass and the serial dQ loop (527 vs 538).
struct BackwardPlan {
  bool two_pass;
  BackwardSchedule schedule;
  DqSchedule dq;
};
constexpr BackwardPlan production_backward(const AttentionShape& sh, bool deterministic) {
  if (sh.head_dim == 128) return {deterministic || sh.seq < 1024, BackwardSchedule::Lockstep, DqSchedule::Serial};
  if (!deterministic) return {false, BackwardSchedule::Producer, DqSchedule::Serial};
  if (!sh.causal) return {true, BackwardSchedule::ProducerOverlap, DqSchedule::Overlap};
  return {true, BackwardSchedule::Producer, DqSchedule::Serial};
}

}  // namespace cutrain::kernels::sm90
