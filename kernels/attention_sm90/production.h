// @brief The schedules the production entry points (kernels::attention_forward / attention_backward)
// run per (head_dim, causal): the fastest measured on an H100 by bench_attention_hopper in one
// device call (docs/perf-notes.md, "Attention: the production schedules", has the table and the
// command). Compile-time choices; every other schedule stays reachable through the sm90
// functions' arguments (tests, benchmarks).
#pragma once

#include "kernels/attention_sm90/attention_sm90.h"

namespace cutrain::kernels::sm90 {

// Forward: the ping-pong schedule at d128 (its 128-key tiles: 253 vs 308 us non-causal, 169 vs
// 187 causal at B4 H16 S2048); the overlap schedule at d64 (within 3% of ping-pong either way:
// ahead at S <= 512, where BERT runs, behind at S >= 2048 non-causal).
constexpr Schedule production_forward(int head_dim, bool causal) {
  (void)causal;
  return head_dim == 128 ? Schedule::PingPong : Schedule::Overlap;
}

// Backward: which algorithm and schedules. two_pass: the dK/dV pass without dQ atomics, then the
// dQ pass (the deterministic mode's algorithm: same bits every run); otherwise one pass with fp32
// dQ atomics. A caller that asks for determinism always gets two_pass. d128: two-pass even
// without that request, since it is faster there (1001 vs 1411 us non-causal, 755 vs 844 causal
// at B4 H16 S2048), with the lockstep dK/dV pass and the serial dQ loop (at d128 the other
// schedules run those kernels anyway). d64: the lockstep schedule, one pass unless determinism
// is asked for. The producer schedules led at d64 (two-pass ProducerOverlap + dQ Overlap 679 vs
// 762 us non-causal, one-pass Producer 447 vs 458 causal) but compute-sanitizer's racecheck
// reported a hazard in the build that ran there (one lane per warp releasing a stage); their
// release changed since and waits for a device run (racecheck and the timings) before they run
// here.
struct BackwardPlan {
  bool two_pass;
  BackwardSchedule schedule;
  DqSchedule dq;
};
constexpr BackwardPlan production_backward(int head_dim, bool causal, bool deterministic) {
  (void)causal;
  if (head_dim == 128) return {true, BackwardSchedule::Lockstep, DqSchedule::Serial};
  return {deterministic, BackwardSchedule::Lockstep, DqSchedule::Serial};
}

}  // namespace cutrain::kernels::sm90
