// @brief Expert parallelism's groups and ownership, DeepSpeed's layout
// (deepspeed.utils.groups._create_expert_and_data_parallel): the data-parallel world of W ranks in
// W/ep expert-parallel groups of ep consecutive ranks ({0..ep-1}, {ep..2ep-1}, ...), member r of a
// group holding experts [r·E/ep, (r+1)·E/ep) of every MoE block; the expert-data-parallel groups
// are the W/ep ranks holding the same experts ({r, r+ep, r+2ep, ...}): expert gradients reduce over
// them, every other parameter over the whole world. Pure: the groups, the ownership and the flat
// ranges of a model's expert tensors.
#pragma once

#include <string>
#include <vector>

#include "model/transformer_params.h"
#include "parallel/partition.h"

namespace cutrain::parallel {

struct ExpertParallelGroups {
  int world = 1, ep = 1;
  int ep_rank(int rank) const { return rank % ep; }
  int ep_groups() const { return world / ep; }
  std::vector<int> ep_group(int rank) const;         // the ep ranks exchanging tokens with `rank`
  std::vector<int> expert_dp_group(int rank) const;  // the world/ep ranks holding `rank`'s experts
};

// Checks ep >= 1 and that ep divides the world; errors name `flag`.
ExpertParallelGroups make_expert_parallel_groups(int world, int ep, const std::string& flag);

// Experts [begin, end) of a layer of `experts` held by member `ep_rank` of a group of `ep`
// (ep must divide experts; the error names `flag`).
struct ExpertSpan {
  int begin = 0, end = 0;
};
ExpertSpan owned_experts(int experts, int ep, int ep_rank, const std::string& flag);

// A model's flat parameters split for expert parallelism: `dense` every non-expert range (the
// gates, PR-MoE's residual MLP and coefficient, every dense tensor), replicated on every rank;
// `experts[r]` the ranges of the experts member r holds (each MoE block's fc1 and fc2 slices), in
// flat order. Every range set is sorted; together they cover [0, flat_size) once.
struct ExpertParallelLayout {
  std::vector<Range> dense;
  std::vector<std::vector<Range>> experts;  // [ep]
  std::size_t dense_elems() const;
  std::size_t expert_elems(int ep_rank) const;  // the same for every member
};
ExpertParallelLayout make_expert_parallel_layout(const model::TransformerParams& table, int ep, const std::string& flag);

// Copies of the elements of `ranges` between a flat buffer and its packed form (the ranges' elements
// one after another).
void pack_ranges(const std::vector<Range>& ranges, const float* flat, float* packed);
void unpack_ranges(const std::vector<Range>& ranges, const float* packed, float* flat);
// The weight-decay runs of `runs` (flat) restricted to `ranges`, in packed coordinates.
std::vector<model::DecayRun> packed_decay_runs(const std::vector<Range>& ranges, const std::vector<model::DecayRun>& runs);

}  // namespace cutrain::parallel
