// @brief Expert parallelism's token exchange on the GPU as row pieces: where each of this rank's
// routed rows goes and where every member's rows for this rank's experts land. Pure (CPU-tested).
//
// Ownership is DeepSpeed's (parallel/expert_parallel_plan.h, model/moe_exchange.h): member j of an
// expert-parallel group of P holds experts [j·E/P, (j+1)·E/P). The sender's rows are the layer's
// expert-contiguous permuted buffer (expert e's kept rows at offsets[e], kernels/moe_permute.h), so
// the rows for member j's experts are already one run per expert. The receiver keeps its experts'
// rows expert-major: local expert l's rows from member 0, then from member 1, ..., so the grouped
// expert GEMMs run on them as they arrived. The reverse exchange (outputs, input gradients) swaps
// the two piece lists. Counts cross with one small all-to-all of E/P ints per member first.
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/comm/communicator.h"

namespace cutrain::model {

struct MoeDispatchPlan {
  int members = 1, rank = 0, local_experts = 0, first_expert = 0;
  std::vector<comm::Piece> sends;  // in rows: this rank's permuted rows to each member, expert by expert
  std::vector<comm::Piece> recvs;  // in rows: every member's rows for this rank's experts, expert-major
  std::vector<int> local_rows;     // [local_experts]: the rows each local expert computes
  int send_rows = 0, recv_rows = 0;
  // The same pieces in elements of `width` per row (the exchanged activations' hidden size).
  static std::vector<comm::Piece> scaled(const std::vector<comm::Piece>& rows, std::size_t width);
};

// `kept`: this rank's kept rows per expert [E] (expert-contiguous in the permuted buffer);
// `received`: [P][E/P], member src's kept rows for this rank's local expert l at [src·E/P + l] (what
// the counts all-to-all delivered). Checks that P divides E, that rank < P and the sizes; the
// errors name `where`.
MoeDispatchPlan make_moe_dispatch_plan(int experts, int members, int rank, const std::vector<int>& kept,
                                       const std::vector<int>& received, const char* where = "MoE dispatch");

// The largest number of rows one member can send to another in a call of at most `max_tokens`
// tokens: k·max_tokens, or with dropping at most `capacity` rows for each of the receiver's E/P
// experts (capacity: the largest of the call's capacities). The receive buffers hold P times it.
int moe_dispatch_max_rows(int experts, int members, int k, int max_tokens, bool drop_tokens, int capacity);

}  // namespace cutrain::model
