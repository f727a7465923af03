#include "model/zero_plan.h"

#include <cstdio>
#include <sstream>

#include "runtime/error.h"

namespace cutrain::model {

std::size_t ZeroPlan::flat_elems() const {
  CUTRAIN_CHECK(!sharded(), "ZeroPlan::flat_elems: stage 3's buffer sizes come from its ShardLayout");
  return partitioned() ? part.padded_numel : part.numel;
}

comm::Range ZeroPlan::state_range() const {
  CUTRAIN_CHECK(!sharded(), "ZeroPlan::state_range: stage 3's shard comes from its ShardLayout");
  if (partitioned()) return part.rank_range(rank);
  return {0, part.numel};
}

comm::Range ZeroPlan::norm_range() const {
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
  z.part = comm::partition_flat(numel, world, 2, 16);
  if (!has_comm) z.mode = ZeroMode::None;
  else if (stage == 3) z.mode = ZeroMode::Sharded;
  else if (stage == 0) z.mode = ZeroMode::AllReduce;
  else z.mode = ZeroMode::Partitioned;
  return z;
}

ZeroBytes zero_bytes_per_param(const PrecisionPlan& p, const ZeroPlan& z) {
  ZeroBytes b;
  b.params = double(dtype_size(p.param));
  b.grads = double(dtype_size(p.grad));
  b.master = p.has_master ? 4.0 : 0.0;
  b.moments = 2.0 * double(dtype_size(p.moment));
  b.divisor = z.partitioned() || z.sharded() ? z.world : 1;
  if (z.sharded()) {
    b.param_divisor = z.world;
    b.grad_shard = b.grads / z.world;
  }
  return b;
}

std::string zero_memory_line(const PrecisionPlan& p, const ZeroPlan& z, std::size_t gather_elems,
                             std::size_t persistent_elems) {
  const ZeroBytes b = zero_bytes_per_param(p, z);
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  std::ostringstream o;
  o << "[Rank " << z.rank << "] ZeRO stage " << z.stage << ", world size " << z.world << ": params " << num(b.params);
  if (z.sharded()) o << "/" << b.param_divisor;
  o << " + grads " << num(b.grads) << " + ";
  if (z.sharded()) o << "grad shard " << num(b.grads) << "/" << z.world << " + ";
  const std::string state = b.master > 0 ? "master " + num(b.master) + " + moments " + num(b.moments)
                                         : "moments " + num(b.moments);
  if (b.divisor > 1 || z.partitioned() || z.sharded()) o << "(" << state << ")/" << b.divisor;
  else o << state;
  char total[32];
  std::snprintf(total, sizeof total, "%.2f", b.total());
  o << " bytes/param = " << total;
  if (z.sharded())
    o << ", plus 2 gather buffers of " << gather_elems << " elements and " << persistent_elems
      << " persistent elements (bf16)";
  o << " (";
  switch (z.mode) {
    case ZeroMode::None:
      o << (z.stage == 3 ? "stage 3 at world size 1 without a communicator: the single-process engine"
                         : "single process, no collectives");
      break;
    case ZeroMode::AllReduce: o << "gradients all-reduced, nothing partitioned"; break;
    case ZeroMode::Partitioned:
      o << "optimizer state partitioned, gradients reduce-scattered, params all-gathered";
      if (z.stage == 2) o << "; the full gradient buffer stays: backward writes one flat buffer";
      break;
    case ZeroMode::Sharded:
      o << "params, optimizer state and reduced gradients sharded; params gathered per unit before use, the next "
           "prefetched; the full gradient buffer stays: backward writes one flat buffer";
      break;
  }
  o << ")";
  return o.str();
}

}  // namespace cutrain::model
