#include "train/zero_memory.h"

#include <cstdio>
#include <sstream>

namespace cutrain::train {

ZeroBytes zero_bytes_per_param(const PrecisionPlan& p, const parallel::ZeroPlan& z) {
  ZeroBytes b;
  b.params = double(dtype_size(p.param));
  b.grads = double(dtype_size(p.grad));
  b.master = p.has_master ? 4.0 : 0.0;
  b.moments = 2.0 * double(dtype_size(p.moment));
  b.compensation = p.compensation ? 2.0 : 0.0;
  b.divisor = z.partitioned() || z.sharded() ? z.world : 1;
  if (z.sharded()) {
    b.param_divisor = z.world;
    b.grad_shard = b.grads / z.world;
  }
  return b;
}

std::string zero_memory_line(const PrecisionPlan& p, const parallel::ZeroPlan& z, std::size_t gather_elems,
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
  std::string state = b.master > 0 ? "master " + num(b.master) + " + " : "";
  if (b.compensation > 0) state += "compensation " + num(b.compensation) + " + ";
  state += "moments " + num(b.moments);
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
    case parallel::ZeroMode::None:
      o << (z.stage == 3 ? "stage 3 at world size 1 without a communicator: the single-process engine"
                         : "single process, no collectives");
      break;
    case parallel::ZeroMode::AllReduce: o << "gradients all-reduced, nothing partitioned"; break;
    case parallel::ZeroMode::Partitioned:
      o << "optimizer state partitioned, gradients reduce-scattered, params all-gathered";
      if (z.stage == 2) o << "; the full gradient buffer stays: backward writes one flat buffer";
      break;
    case parallel::ZeroMode::Sharded:
      o << "params, optimizer state and reduced gradients sharded; params gathered per unit before use, the next "
           "prefetched; the full gradient buffer stays: backward writes one flat buffer";
      break;
  }
  o << ")";
  return o.str();
}

}  // namespace cutrain::train
