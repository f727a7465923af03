#include "train/cpu_expert_parallel.h"

#include <cmath>
#include <sstream>

#include "runtime/error.h"

namespace cutrain::train {

namespace {
const char* kFlag = "--moe_expert_parallel_size";
}

CpuExpertParallel::CpuExpertParallel(std::shared_ptr<comm::Communicator> world,
                                     std::shared_ptr<comm::Communicator> ep_group,
                                     std::shared_ptr<comm::Communicator> expert_dp_group,
                                     const model::TransformerParams& table, const TrainConfig& config, int ep_size,
                                     const std::vector<float>& full_params)
    : world_(std::move(world)), ep_group_(ep_group), edp_group_(std::move(expert_dp_group)),
      groups_(parallel::make_expert_parallel_groups(world_->world_size(), ep_size, kFlag)),
      layout_(parallel::make_expert_parallel_layout(table, ep_size, kFlag)), exchange_(std::move(ep_group)),
      ep_rank_(groups_.ep_rank(world_->rank())), numel_(table.flat_size()) {
  CUTRAIN_CHECK(config.zero_optimization.stage <= 2, "cpu backend: zero_optimization.stage ",
                config.zero_optimization.stage, " with ", kFlag, " ", ep_size,
                ": expert parallelism partitions the expert and non-expert parameters with ZeRO stages 0-2; "
                "stage 3's parameter shards are not built for it");
  CUTRAIN_CHECK(ep_group_->world_size() == ep_size && ep_group_->rank() == ep_rank_ &&
                    edp_group_->world_size() == groups_.world / ep_size,
                "cpu backend: expert parallelism's groups do not match ep_size ", ep_size);
  CpuZeroSpace dense, experts;
  dense.numel = layout_.dense_elems();
  dense.decay_runs = parallel::packed_decay_runs(layout_.dense, table.decay_runs());
  const std::vector<parallel::Range>& mine = layout_.experts[std::size_t(ep_rank_)];
  experts.numel = layout_.expert_elems(ep_rank_);
  experts.decay_runs = parallel::packed_decay_runs(mine, table.decay_runs());
  experts.grad_divisor = groups_.world;
  std::vector<float> dp(dense.numel), xp(experts.numel);
  parallel::pack_ranges(layout_.dense, full_params.data(), dp.data());
  parallel::pack_ranges(mine, full_params.data(), xp.data());
  dense_ = std::make_unique<CpuZero>(world_, std::move(dense), config, dp);
  experts_ = std::make_unique<CpuZero>(edp_group_, std::move(experts), config, xp);
  dense_p_ = pack_dense(full_params, dense_->work_elems());
  exp_p_ = pack_experts(full_params, experts_->work_elems());
  dense_g_.assign(dense_->work_elems(), 0.f);
  exp_g_.assign(experts_->work_elems(), 0.f);
}

std::vector<float> CpuExpertParallel::pack_dense(const std::vector<float>& flat, std::size_t work) const {
  std::vector<float> p(std::max(work, layout_.dense_elems()), 0.f);
  parallel::pack_ranges(layout_.dense, flat.data(), p.data());
  return p;
}

std::vector<float> CpuExpertParallel::pack_experts(const std::vector<float>& flat, std::size_t work) const {
  std::vector<float> p(std::max(work, layout_.expert_elems(ep_rank_)), 0.f);
  parallel::pack_ranges(layout_.experts[std::size_t(ep_rank_)], flat.data(), p.data());
  return p;
}

void CpuExpertParallel::params_for_compute(std::vector<float>& flat) const {
  flat.assign(numel_, 0.f);
  parallel::unpack_ranges(layout_.dense, dense_p_.data(), flat.data());
  parallel::unpack_ranges(layout_.experts[std::size_t(ep_rank_)], exp_p_.data(), flat.data());
}

double CpuExpertParallel::reduce_grads(const std::vector<float>& flat_grads) {
  CUTRAIN_CHECK(flat_grads.size() == numel_, "cpu expert parallel: gradient buffer of ", flat_grads.size(),
                " elements, expected ", numel_);
  std::fill(dense_g_.begin(), dense_g_.end(), 0.f);
  std::fill(exp_g_.begin(), exp_g_.end(), 0.f);
  parallel::pack_ranges(layout_.dense, flat_grads.data(), dense_g_.data());
  parallel::pack_ranges(layout_.experts[std::size_t(ep_rank_)], flat_grads.data(), exp_g_.data());
  const double dense_sq = dense_->reduce_grads_sq(dense_g_);
  double expert_sq = experts_->reduce_grads_sq(exp_g_);  // this rank's expert-data-parallel group's experts
  ep_group_->all_reduce_sum_f64(&expert_sq, 1, nullptr);  // the members' disjoint experts
  return std::sqrt(dense_sq + expert_sq);
}

void CpuExpertParallel::adam(int step, float lr, double scale) {
  dense_->adam(dense_p_, dense_g_, step, lr, scale);
  experts_->adam(exp_p_, exp_g_, step, lr, scale);
}

void CpuExpertParallel::gather_experts(const std::vector<float>& mine, std::vector<float>& flat) {
  const std::size_t n = layout_.expert_elems(ep_rank_);
  std::vector<float> all(n * std::size_t(groups_.ep));
  ep_group_->all_gather(mine.data(), all.data(), n, DType::F32, nullptr);
  for (int r = 0; r < groups_.ep; ++r)
    parallel::unpack_ranges(layout_.experts[std::size_t(r)], all.data() + std::size_t(r) * n, flat.data());
}

void CpuExpertParallel::gather_state(std::vector<float>& params, std::vector<float>& m, std::vector<float>& v) {
  std::vector<float> dp, dm, dv, xp, xm, xv;
  dense_->gather_state(dense_p_, dp, dm, dv);
  experts_->gather_state(exp_p_, xp, xm, xv);
  auto whole = [&](std::vector<float>& flat, const std::vector<float>& dense, const std::vector<float>& experts) {
    flat.assign(numel_, 0.f);
    parallel::unpack_ranges(layout_.dense, dense.data(), flat.data());
    gather_experts(experts, flat);
  };
  whole(params, dp, xp);
  whole(m, dm, xm);
  whole(v, dv, xv);
}

void CpuExpertParallel::scatter_state(const std::vector<float>& params, const std::vector<float>& m,
                                      const std::vector<float>& v) {
  CUTRAIN_CHECK(params.size() == numel_ && m.size() == numel_ && v.size() == numel_, "cpu backend: state of ",
                params.size(), " params does not fit the model's ", numel_);
  const std::size_t nd = layout_.dense_elems(), nx = layout_.expert_elems(ep_rank_);
  auto dense_of = [&](const std::vector<float>& f) {
    std::vector<float> p(nd);
    parallel::pack_ranges(layout_.dense, f.data(), p.data());
    return p;
  };
  auto experts_of = [&](const std::vector<float>& f) {
    std::vector<float> p(nx);
    parallel::pack_ranges(layout_.experts[std::size_t(ep_rank_)], f.data(), p.data());
    return p;
  };
  dense_->scatter_state(dense_of(params), dense_of(m), dense_of(v), dense_p_);
  experts_->scatter_state(experts_of(params), experts_of(m), experts_of(v), exp_p_);
  dense_p_.resize(std::max(dense_p_.size(), dense_->work_elems()), 0.f);
  exp_p_.resize(std::max(exp_p_.size(), experts_->work_elems()), 0.f);
}

std::int64_t CpuExpertParallel::state_bytes() const { return dense_->state_bytes() + experts_->state_bytes(); }

std::string CpuExpertParallel::describe() const {
  std::ostringstream os;
  const int r = world_->rank();
  const auto eg = groups_.ep_group(r), dg = groups_.expert_dp_group(r);
  auto list = [](const std::vector<int>& g) {
    std::string s;
    for (int x : g) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
  };
  os << "[Rank " << r << "] expert parallel: ep_size " << groups_.ep << ", member " << ep_rank_
     << " of expert-parallel group {" << list(eg) << "} (all-to-all of the tokens), experts reduced over {" << list(dg)
     << "}; ZeRO stage " << dense_->plan().stage << " over " << dense_->plan().world << " ranks for "
     << layout_.dense_elems() << " non-expert elements and over " << experts_->plan().world << " for this rank's "
     << layout_.expert_elems(ep_rank_) << " expert elements; " << state_bytes() << " bytes of fp32 state";
  return os.str();
}

}  // namespace cutrain::train
