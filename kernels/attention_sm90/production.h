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
// dQ atomics. A caller that asks for determinism always gets two_pass. Without that request the
// one-pass algorithm runs only where it is faster: d64 causal (Producer 447 us vs two-pass 550 at
// B4 H16 S2048). Elsewhere two-pass is faster outright: d64 non-causal (ProducerOverlap + dQ
// Overlap 679 vs one-pass 764), d128 (1001 vs 1411 non-causal, 755 vs 844 causal; at d128 the
// producer schedules run lockstep's kernel and the dQ pass its serial loop, so those are named).
struct BackwardPlan {
  bool two_pass;
  BackwardSchedule schedule;
  DqSchedule dq;
};
constexpr BackwardPlan production_backward(int head_dim, bool causal, bool deterministic) {
  if (head_dim == 128) return {true, BackwardSchedule::Lockstep, DqSchedule::Serial};
  if (!causal) return {true, BackwardSchedule::ProducerOverlap, DqSchedule::Overlap};
  return {deterministic, BackwardSchedule::Producer, DqSchedule::Serial};  // d64 causal: 550 vs 574 / 597 us
}

}  // namespace cutrain::kernels::sm90
