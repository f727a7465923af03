// @brief The forward tile and the backward schedules the production entry points
// (kernels::attention_forward / attention_backward) run per (head_dim, causal, determinism): the fastest measured on an H100 by bench_attention_hopper in one
// device call (docs/perf-notes.md, "Attention: the production schedules", has the table and the
// command). Compile-time choices; every other schedule stays reachable through the sm90
// functions' arguments (tests, benchmarks).
#pragma once

#include "kernels/attention_sm90/attention_sm90.h"

namespace cutrain::kernels::sm90 {

// Forward: the query tile. Rows128 at every (head_dim, causal) until the per-shape choice that
// the 192-row tile's measurements support has passed its own GPU run (docs/perf-notes.md,
// "Experiment: the forward's 192-row query tile").
constexpr FwdTile production_forward(int /*head_dim*/, bool /*causal*/) { return FwdTile::Rows128; }

// Backward: which algorithm and schedules. two_pass: the dK/dV pass without dQ, then the dQ pass
// (the deterministic mode's algorithm: same bits every run); otherwise one pass that adds dQ into
// an fp32 accumulator (TMA reduce-adds at d64, float2 atomics at d128). A caller that asks for
// determinism always gets two_pass.
// d128: two-pass in either mode (1002 vs 1414 us non-causal, 695 vs 786 causal at B4 H16 S2048),
// the lockstep dK/dV pass and the serial dQ loop (at d128 the producer schedules run lockstep).
// d64 (the producer schedules: a producer warpgroup issues every load): without causal two-pass
// in either mode, the producer overlap dK/dV loop and the dQ pass's overlap loop (673 vs 779 us
// one-pass with atomics, 758 two-pass lockstep, at B4 H16 S2048; the one pass with reduce-adds
// has since measured 582 us, the switch waiting for its GPU run as the forward's); causal, the producer dK/dV pass, one pass
// unless determinism is asked for (418 vs 432 us lockstep one-pass; two-pass with the serial dQ
// loop 527 vs 538).
struct BackwardPlan {
  bool two_pass;
  BackwardSchedule schedule;
  DqSchedule dq;
};
constexpr BackwardPlan production_backward(int head_dim, bool causal, bool deterministic) {
  if (head_dim == 128) return {true, BackwardSchedule::Lockstep, DqSchedule::Serial};
  if (!causal) return {true, BackwardSchedule::ProducerOverlap, DqSchedule::Overlap};
  return {deterministic, BackwardSchedule::Producer, DqSchedule::Serial};
}

}  // namespace cutrain::kernels::sm90
