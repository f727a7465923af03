#include "parallel/zero_plan.h"

#include "runtime/error.h"

namespace cutrain::parallel {

std::size_t ZeroPlan::flat_elems() const {
  CUTRAIN_CHECK(!sharded(), "ZeroPlan::flat_elems: stage 3's buffer sizes come from its ShardLayout");
  return partitioned() ? part.padded_numel : part.numel;
}

Range ZeroPlan::state_range() const {
  CUTRAIN_CHECK(!sharded(), "ZeroPlan::state_range: stage 3's shard comes from its ShardLayout");
  if (partitioned()) return part.rank_range(rank);
  return {0, part.numel};
}

Range ZeroPlan::norm_range() const {
  CUTRAIN_CHECK(!sharded(), "ZeroPlan::norm_range: stage 3's norm runs over its whole gradient shard");
  if (partitioned()) return part.owned_real(rank);
  return {0, part.numel};
}

const char* ZeroPlan::mode_name() const {
  switch (mode) {
    case ZeroMode::None: return "none";
    case ZeroMode::AllReduce: return "all-reduce";
    case ZeroMode::Partitioned: return "partitioned";
    case ZeroMode::Sharded: return "sharded";
  }
  return "?";
}

ZeroPlan make_zero_plan(int stage, std::size_t numel, int world, int rank, bool has_comm) {
  CUTRAIN_CHECK(stage >= 0 && stage <= 3, "zero_optimization.stage must be 0, 1, 2 or 3, found ", stage);
  CUTRAIN_CHECK(world >= 1 && rank >= 0 && rank < world, "ZeRO: rank ", rank, " is outside world size ", world);
  CUTRAIN_CHECK(has_comm || world == 1, "ZeRO: world size ", world, " needs a communicator (NCCL), none was given");
  ZeroPlan z;
  z.stage = stage;
  z.world = world;
  z.rank = rank;
  z.has_comm = has_comm;
  // 2-byte elements with 16-byte alignment: per_rank is a multiple of 8 elements, so every
  // partition of the bf16 params/grads and of the fp32 master/moments/grads starts 16-byte aligned.
  z.part = partition_flat(numel, world, 2, 16);
  if (!has_comm) z.mode = ZeroMode::None;
  else if (stage == 3) z.mode = ZeroMode::Sharded;
  else if (stage == 0) z.mode = ZeroMode::AllReduce;
  else z.mode = ZeroMode::Partitioned;
  return z;
}

}  // namespace cutrain::parallel
