// @brief Expert parallelism's token exchange as the MoE layer's reference sees it: the
// expert-parallel group's all-to-all of equal chunks (DeepSpeed's _AllToAll over its ep_group) and
// the group's largest slot count. The layer sends each expert's [capacity, H] slots to the rank
// holding that expert and gets the outputs back (model/moe_reference.h); parallel/ implements it
// over a communicator (parallel/moe_all_to_all.h). Every member calls each one with the same count,
// in the same order.
#pragma once

#include <cstddef>

namespace cutrain::model {

// The first of the experts member `rank` of an expert-parallel group of `members` holds: it holds
// [rank·E/members, (rank+1)·E/members) (members divides E). The CPU reference, the GPU layer's
// exchange plan (model/moe_dispatch_plan.h) and parallel/expert_parallel_plan.h share this rule.
inline int moe_first_expert(int experts, int members, int rank) { return rank * (experts / members); }

class MoeExchange {
 public:
  virtual ~MoeExchange() = default;
  virtual int size() const = 0;  // ep_size
  virtual int rank() const = 0;  // this rank's index in the group: it holds experts [rank·E/ep, (rank+1)·E/ep)
  // send [size][count] -> recv [size][count]: chunk j goes to member j, chunk r came from member r.
  virtual void all_to_all(const double* send, double* recv, std::size_t count) = 0;
  // The largest of the members' values.
  virtual int max(int value) = 0;
};

}  // namespace cutrain::model
