#include "train/cpu_zero.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "model/reference_model.h"
#include "runtime/error.h"

namespace cutrain::train {

using parallel::Range;
using parallel::ZeroMode;

CpuZeroSpace model_space(const model::TransformerParams& table) {
  CpuZeroSpace s;
  s.numel = table.flat_size();
  s.decay_runs = table.decay_runs();
  for (const model::ParamUnit& u : table.units()) s.units.push_back({u.begin, u.end});
  return s;
}

CpuZero::CpuZero(std::shared_ptr<comm::Communicator> comm, CpuZeroSpace space, const TrainConfig& config,
                 const std::vector<float>& full_params)
    : comm_(std::move(comm)), space_(std::move(space)), cfg_(config), numel_(space_.numel) {
  plan_ = parallel::make_zero_plan(cfg_.zero_optimization.stage, numel_, comm_->world_size(), comm_->rank(),
                                   /*has_comm=*/true);
  if (plan_.sharded()) {
    layout_ = parallel::make_shard_layout(space_.units, numel_, plan_.world,
                                          std::size_t(std::max<std::int64_t>(
                                              0, cfg_.zero_optimization.stage3_param_persistence_threshold)));
    work_elems_ = numel_;
    shard_ = layout_.shard_from_flat(full_params.data(), plan_.rank);
    grad_shard_.assign(layout_.shard_elems, 0.f);
    m_.assign(layout_.shard_elems, 0.f);
    v_.assign(layout_.shard_elems, 0.f);
    // This rank's pieces in flat coordinates, cut where the weight-decay runs change (the GPU
    // engine's launches, parallel/zero_shard_layout.h).
    std::vector<Range> runs;
    for (const model::DecayRun& r : space_.decay_runs) runs.push_back({r.begin, r.end});
    for (const parallel::ShardSegment& g : parallel::shard_segments(layout_, plan_.rank, runs))
      segments_.push_back({g.shard, g.flat, g.count, space_.decay_runs[g.run].decay});
  } else {
    work_elems_ = plan_.flat_elems();
    m_.assign(plan_.state_elems(), 0.f);
    v_.assign(plan_.state_elems(), 0.f);
  }
}

void CpuZero::params_for_compute(std::vector<float>& params) {
  if (!plan_.sharded()) return;  // the full params are there between steps
  params.assign(numel_, 0.f);
  std::vector<float> unit;
  for (const parallel::ShardUnit& u : layout_.units) {
    unit.resize(u.padded_size(plan_.world));
    comm_->all_gather(shard_.data() + u.shard_offset, unit.data(), u.per_rank, DType::F32, nullptr);
    std::copy(unit.begin(), unit.begin() + std::ptrdiff_t(u.flat.size()), params.begin() + std::ptrdiff_t(u.flat.begin));
  }
}

void CpuZero::release_compute(std::vector<float>& params) const {
  if (plan_.sharded()) std::vector<float>().swap(params);
}

double CpuZero::reduce_grads(std::vector<float>& grads) { return std::sqrt(reduce_grads_sq(grads)); }

double CpuZero::reduce_grads_sq(std::vector<float>& grads) {
  CUTRAIN_CHECK(grads.size() == work_elems_, "cpu ZeRO: gradient buffer of ", grads.size(), " elements, expected ",
                work_elems_);
  double sq = 0;
  // g[0, n) are flat elements [flat, flat + n); with tensor parallelism only the counted ones.
  auto sum_sq = [&](const float* g, std::size_t n, std::size_t flat) {
    for (std::size_t i = 0; i < n; ++i)
      if (!counted_ || (flat + i < numel_ && (*counted_)[flat + i])) sq += double(g[i]) * g[i];
  };
  const comm::ReduceOp op = space_.grad_divisor > 0 ? comm::ReduceOp::Sum : comm::ReduceOp::Avg;
  const float inv = space_.grad_divisor > 0 ? float(1.0 / space_.grad_divisor) : 1.f;
  auto divide = [&](float* g, std::size_t n) {
    if (space_.grad_divisor > 0)
      for (std::size_t i = 0; i < n; ++i) g[i] *= inv;
  };
  switch (plan_.mode) {
    case ZeroMode::AllReduce:
      comm_->all_reduce(grads.data(), numel_, DType::F32, op, nullptr);
      divide(grads.data(), numel_);
      sum_sq(grads.data(), numel_, 0);
      // every rank has the same gradients: no second collective (but the tensor-parallel group's)
      if (tp_group_) tp_group_->all_reduce_sum_f64(&sq, 1, nullptr);
      return sq;
    case ZeroMode::Partitioned: {
      const std::size_t per = plan_.part.per_rank;
      float* mine = grads.data() + std::size_t(plan_.rank) * per;
      comm_->reduce_scatter(grads.data(), mine, per, DType::F32, op, nullptr);
      divide(mine, per);
      const Range nr = plan_.norm_range();
      sum_sq(grads.data() + nr.begin, nr.size(), nr.begin);
      break;
    }
    case ZeroMode::Sharded: {
      std::vector<float> unit;
      for (const parallel::ShardUnit& u : layout_.units) {
        unit.assign(u.padded_size(plan_.world), 0.f);
        std::copy(grads.begin() + std::ptrdiff_t(u.flat.begin), grads.begin() + std::ptrdiff_t(u.flat.end), unit.begin());
        comm_->reduce_scatter(unit.data(), grad_shard_.data() + u.shard_offset, u.per_rank, DType::F32, op, nullptr);
        divide(grad_shard_.data() + u.shard_offset, u.per_rank);
      }
      if (!counted_) sum_sq(grad_shard_.data(), grad_shard_.size(), 0);
      else
        for (const Segment& sg : segments_) sum_sq(grad_shard_.data() + sg.shard, sg.count, sg.flat);
      break;
    }
    case ZeroMode::None: CUTRAIN_FAIL("cpu ZeRO: no communicator");
  }
  comm_->all_reduce_sum_f64(&sq, 1, nullptr);
  if (tp_group_) tp_group_->all_reduce_sum_f64(&sq, 1, nullptr);
  return sq;
}

void CpuZero::adam(std::vector<float>& params, const std::vector<float>& grads, int step, float lr, double scale) {
  const auto& o = cfg_.optimizer;
  auto update = [&](float* p, const float* g, float* m, float* v, std::size_t n, bool decay) {
    model::reference_adam_step(p, g, m, v, n, lr, o.beta1, o.beta2, o.eps, decay ? o.weight_decay : 0.0, o.adam_w_mode,
                               step, scale);
  };
  switch (plan_.mode) {
    case ZeroMode::AllReduce:
      for (const model::DecayRun& r : space_.decay_runs)
        update(params.data() + r.begin, grads.data() + r.begin, m_.data() + r.begin, v_.data() + r.begin,
               r.end - r.begin, r.decay);
      return;
    case ZeroMode::Partitioned: {
      const Range own = plan_.part.owned_real(plan_.rank), st = plan_.state_range();
      for (const model::DecayRun& r : space_.decay_runs) {
        const std::size_t a = std::max(r.begin, own.begin), b = std::min(r.end, own.end);
        if (a < b)
          update(params.data() + a, grads.data() + a, m_.data() + (a - st.begin), v_.data() + (a - st.begin), b - a,
                 r.decay);
      }
      const std::size_t per = plan_.part.per_rank;
      comm_->all_gather(params.data() + std::size_t(plan_.rank) * per, params.data(), per, DType::F32, nullptr);
      return;
    }
    case ZeroMode::Sharded:
      for (const Segment& s : segments_)
        update(shard_.data() + s.shard, grad_shard_.data() + s.shard, m_.data() + s.shard, v_.data() + s.shard, s.count,
               s.decay);
      return;
    case ZeroMode::None: CUTRAIN_FAIL("cpu ZeRO: no communicator");
  }
}

double CpuZero::mean_over_ranks(double v) {
  comm_->all_reduce_sum_f64(&v, 1, nullptr);
  return v / plan_.world;
}

std::vector<float> CpuZero::gather_to_flat(const std::vector<float>& part) {
  if (plan_.partitioned()) {
    std::vector<float> full(plan_.part.padded_numel);
    comm_->all_gather(part.data(), full.data(), plan_.part.per_rank, DType::F32, nullptr);
    full.resize(numel_);
    return full;
  }
  std::vector<float> padded(layout_.padded_elems);
  for (const parallel::ShardUnit& u : layout_.units)
    comm_->all_gather(part.data() + u.shard_offset, padded.data() + u.padded_offset, u.per_rank, DType::F32, nullptr);
  return layout_.flat_from_padded(padded.data());
}

std::vector<float> CpuZero::part_of_flat(const std::vector<float>& flat) const {
  if (plan_.sharded()) return layout_.shard_from_flat(flat.data(), plan_.rank);
  const Range st = plan_.state_range();
  std::vector<float> part(st.size(), 0.f);
  for (std::size_t i = st.begin; i < std::min(st.end, numel_); ++i) part[i - st.begin] = flat[i];
  return part;
}

void CpuZero::gather_state(const std::vector<float>& params, std::vector<float>& full_params, std::vector<float>& m,
                           std::vector<float>& v) {
  if (plan_.mode == ZeroMode::AllReduce) {
    full_params.assign(params.begin(), params.begin() + std::ptrdiff_t(numel_));
    m = m_;
    v = v_;
    return;
  }
  if (plan_.sharded()) full_params = gather_to_flat(shard_);
  else full_params.assign(params.begin(), params.begin() + std::ptrdiff_t(numel_));
  m = gather_to_flat(m_);
  v = gather_to_flat(v_);
}

void CpuZero::scatter_state(const std::vector<float>& full_params, const std::vector<float>& m,
                            const std::vector<float>& v, std::vector<float>& params) {
  if (plan_.mode == ZeroMode::AllReduce) {
    params = full_params;
    m_ = m;
    v_ = v;
    return;
  }
  if (plan_.sharded()) {
    shard_ = part_of_flat(full_params);
    std::vector<float>().swap(params);
  } else {
    params.assign(work_elems_, 0.f);
    std::copy(full_params.begin(), full_params.end(), params.begin());
  }
  m_ = part_of_flat(m);
  v_ = part_of_flat(v);
}

std::int64_t CpuZero::state_bytes() const {
  const std::size_t held = plan_.sharded() ? 2 * layout_.shard_elems : 2 * work_elems_;  // params + grads
  return std::int64_t(4 * (held + m_.size() + v_.size()));
}

std::string CpuZero::describe() const {
  std::ostringstream os;
  if (tp_group_)
    os << "[Rank " << world_rank_ << "] ZeRO stage " << plan_.stage << ", data-parallel rank " << plan_.rank << " of "
       << plan_.world << " over the ";
  else
    os << "[Rank " << plan_.rank << "] ZeRO stage " << plan_.stage << ", world size " << plan_.world << " over the ";
  os << comm_->backend_name() << " communicator: " << plan_.mode_name() << "; this rank holds the moments of "
     << m_.size() << " of the " << numel_ << " flat elements";
  if (plan_.sharded())
    os << " and the params and reduced gradients of its shard (" << layout_.shard_elems << " elements of "
       << layout_.units.size() << " units), gathered before each forward";
  os << "; " << state_bytes() << " bytes of fp32 state";
  return os.str();
}

}  // namespace cutrain::train
