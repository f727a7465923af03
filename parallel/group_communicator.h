// @brief A communicator over a group of another communicator's ranks (a tensor-parallel, data-
// parallel or pipeline group of the rank grid, parallel/rank_grid.h), built on the parent's
// point-to-point send / recv, so groups of different sizes and schedules run at once without
// collectives of the whole world (a pipeline's stages reduce over their own tensor-parallel groups
// at different times). The group's first member gathers, reduces in fp64 visiting the members in
// order (every member gets bit-identical results, as the host communicator gives) and sends the
// result back. Reductions take float32 (and the fp64 sum); gathers, all-to-all, broadcast and
// point-to-point take any dtype. For the CPU backend's small groups; NCCL would use its own
// sub-communicators.
#pragma once

#include <memory>
#include <vector>

#include "runtime/comm/communicator.h"

namespace cutrain::parallel {

// `members`: the parent's ranks of the group, ascending, including the parent's rank. Every member
// creates its group with the same list; the group's rank is the parent's position in it.
std::unique_ptr<comm::Communicator> make_group_communicator(std::shared_ptr<comm::Communicator> parent,
                                                            const std::vector<int>& members);

// A group as a communicator of its own on the parent's transport: the parent itself when the group
// is all of it, else the parent's sub-communicator (NCCL's ncclCommSplit: collective, every rank of
// the parent calls it once with its own group; the groups must be disjoint), else (the host
// communicator has no split) the group communicator above. `members` as above.
std::shared_ptr<comm::Communicator> make_group(std::shared_ptr<comm::Communicator> parent,
                                               const std::vector<int>& members);

}  // namespace cutrain::parallel
