// @brief The bytes per parameter one rank keeps for a precision layout under a ZeRO plan, and the
// start-up memory line the engine prints from them.
#pragma once

#include <cstddef>
#include <string>

#include "parallel/zero_plan.h"
#include "train/precision.h"

namespace cutrain::train {

// Bytes per parameter one rank keeps for the persistent training state (what the engine
// allocates, padding aside). master is 0 when the layout has no fp32 master.
struct ZeroBytes {
  double params = 0, grads = 0, master = 0, moments = 0;
  double compensation = 0;  // the bf16 master's compensation (2 when on), partitioned like the moments
  int divisor = 1;        // master, compensation and moments are divided by it (world size when partitioned or sharded)
  int param_divisor = 1;  // params are divided by it (world size when sharded)
  double grad_shard = 0;  // Sharded: the reduced gradient shard, grads/W (the full buffer stays, see zero_shard_layout.h)
  double total() const {
    return params / param_divisor + grads + grad_shard + (master + compensation + moments) / divisor;
  }
};
ZeroBytes zero_bytes_per_param(const PrecisionPlan& precision, const parallel::ZeroPlan& zero);

// "[Rank r] ZeRO stage S, world size W: params 2 + grads 2 + (master 4 + moments 8)/W bytes/param
// (a compensated bf16 master: "(compensation 2 + moments 8)/W")
// = X (<mode note>)". Stage 3 (Sharded): "params 2/W + grads 2 + grad shard 2/W + (...)/W
// bytes/param = X, plus 2 gather buffers of G elements and P persistent elements (bf16) (...)",
// G and P from the ShardLayout.
std::string zero_memory_line(const PrecisionPlan& precision, const parallel::ZeroPlan& zero, std::size_t gather_elems = 0,
                             std::size_t persistent_elems = 0);

}  // namespace cutrain::train
