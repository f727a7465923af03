#include "parallel/expert_parallel_plan.h"

#include <algorithm>

#include "model/moe_exchange.h"
#include "runtime/error.h"

namespace cutrain::parallel {

std::vector<int> ExpertParallelGroups::ep_group(int rank) const {
  std::vector<int> g;
  for (int r = 0; r < ep; ++r) g.push_back(rank / ep * ep + r);
  return g;
}

std::vector<int> ExpertParallelGroups::expert_dp_group(int rank) const {
  std::vector<int> g;
  for (int i = 0; i < world / ep; ++i) g.push_back(i * ep + rank % ep);
  return g;
}

ExpertParallelGroups make_expert_parallel_groups(int world, int ep, const std::string& flag) {
  CUTRAIN_CHECK(world >= 1, "expert parallelism: world size ", world);
  CUTRAIN_CHECK(ep >= 1, flag, " must be >= 1, got ", ep);
  CUTRAIN_CHECK(world % ep == 0, flag, " ", ep, " does not divide the data-parallel world size ", world,
                ": expected world = ep_size x expert-data-parallel degree");
  return {world, ep};
}

ExpertSpan owned_experts(int experts, int ep, int ep_rank, const std::string& flag) {
  CUTRAIN_CHECK(ep >= 1 && ep_rank >= 0 && ep_rank < ep, "expert parallelism: member ", ep_rank, " of a group of ", ep);
  CUTRAIN_CHECK(experts >= 1 && experts % ep == 0, flag, " ", ep, " does not divide a MoE block's ", experts,
                " experts");
  const int first = model::moe_first_expert(experts, ep, ep_rank);
  return {first, first + experts / ep};
}

std::size_t ExpertParallelLayout::dense_elems() const {
  std::size_t n = 0;
  for (const Range& r : dense) n += r.size();
  return n;
}

std::size_t ExpertParallelLayout::expert_elems(int ep_rank) const {
  std::size_t n = 0;
  for (const Range& r : experts.at(std::size_t(ep_rank))) n += r.size();
  return n;
}

ExpertParallelLayout make_expert_parallel_layout(const model::TransformerParams& table, int ep, const std::string& flag) {
  const model::ModelDims& d = table.dims();
  ExpertParallelLayout out;
  out.experts.resize(std::size_t(ep));
  std::vector<Range> all;  // every expert range, flat order
  for (int l = 0; l < d.layers; ++l) {
    if (!d.moe.is_moe(l)) continue;
    const model::MoeConfig c = d.moe.layer_config(l, d.hidden, d.ffn());
    const model::MoeParamLayout m = model::moe_param_layout(c);
    const std::size_t off = table.tensor(table.layer(l).moe).offset, per = std::size_t(c.ffn) * c.hidden;
    for (std::size_t base : {off + m.w1, off + m.w2}) {  // fc1 [E, F, H], then fc2 [E, H, F]
      for (int r = 0; r < ep; ++r) {
        const ExpertSpan s = owned_experts(c.experts, ep, r, flag);
        out.experts[std::size_t(r)].push_back({base + std::size_t(s.begin) * per, base + std::size_t(s.end) * per});
      }
      all.push_back({base, base + std::size_t(c.experts) * per});
    }
  }
  std::size_t at = 0;
  for (const Range& r : all) {
    if (r.begin > at) out.dense.push_back({at, r.begin});
    at = r.end;
  }
  if (at < table.flat_size()) out.dense.push_back({at, table.flat_size()});
  return out;
}

void pack_ranges(const std::vector<Range>& ranges, const float* flat, float* packed) {
  for (const Range& r : ranges) packed = std::copy(flat + r.begin, flat + r.end, packed);
}

void unpack_ranges(const std::vector<Range>& ranges, const float* packed, float* flat) {
  for (const Range& r : ranges) {
    std::copy(packed, packed + r.size(), flat + r.begin);
    packed += r.size();
  }
}

std::vector<model::DecayRun> packed_decay_runs(const std::vector<Range>& ranges,
                                               const std::vector<model::DecayRun>& runs) {
  std::vector<model::DecayRun> out;
  std::size_t base = 0;
  for (const Range& r : ranges) {
    for (const model::DecayRun& d : runs) {
      const std::size_t a = std::max(r.begin, d.begin), b = std::min(r.end, d.end);
      if (a >= b) continue;
      const std::size_t pa = base + (a - r.begin), pb = base + (b - r.begin);
      if (!out.empty() && out.back().end == pa && out.back().decay == d.decay) out.back().end = pb;
      else out.push_back({pa, pb, d.decay});
    }
    base += r.size();
  }
  return out;
}

}  // namespace cutrain::parallel
