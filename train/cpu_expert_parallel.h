// @brief Expert parallelism of the CPU backend (DeepSpeed's ep_size): the data-parallel world in
// expert-parallel groups (parallel/expert_parallel_plan.h), each MoE block's experts split over a
// group's members and its tokens exchanged by all-to-all (parallel/moe_all_to_all.h, the reference
// model's MoE layers). Every rank keeps the model's flat buffer for the reference model: the
// replicated tensors and its own experts hold values, the other members' experts stay zero. The
// training state is two ZeRO spaces (train/cpu_zero.h), as DeepSpeed's create_moe_param_groups:
//   dense    every non-expert parameter (gates, PR-MoE's MLP and coefficient, the rest of the model),
//            packed, partitioned and averaged over the whole data-parallel world;
//   experts  this rank's experts, packed, partitioned over its expert-data-parallel group (the
//            world/ep ranks holding them), their gradients summed there and divided by the world
//            (each expert's gradient is the mean over every rank's tokens, the single process's).
// The gradient norm counts each element once: the dense sum of squares plus the expert groups'
// (summed over an expert-parallel group, whose members hold disjoint experts). A checkpoint holds
// the whole model: the expert-parallel group all-gathers its members' experts into their flat
// places, so every ep_size (and the single process) saves and loads the same files.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/reference_model.h"
#include "parallel/expert_parallel_plan.h"
#include "parallel/moe_all_to_all.h"
#include "train/cpu_zero.h"

namespace cutrain::train {

class CpuExpertParallel {
 public:
  // `world`: the data-parallel communicator; `ep_group` / `expert_dp_group`: this rank's groups
  // (parallel/group_communicator.h). `full_params`: the model's flat init, the same on every rank.
  CpuExpertParallel(std::shared_ptr<comm::Communicator> world, std::shared_ptr<comm::Communicator> ep_group,
                    std::shared_ptr<comm::Communicator> expert_dp_group, const model::TransformerParams& table,
                    const TrainConfig& config, int ep_size, const std::vector<float>& full_params);

  void attach(model::ReferenceModel<float>& m) { m.set_moe_exchange(&exchange_); }
  // The flat params the model computes on (numel): replicated tensors and this rank's experts.
  void params_for_compute(std::vector<float>& flat) const;
  // The flat gradients of this rank's micro-batches reduced over the two groups; the global norm.
  double reduce_grads(const std::vector<float>& flat_grads);
  // AdamW on both spaces with the clip coefficient, the params shared again.
  void adam(int step, float lr, double scale);
  double mean_over_ranks(double v) { return dense_->mean_over_ranks(v); }
  // Collective: the whole model's state (numel each), the same on every rank.
  void gather_state(std::vector<float>& params, std::vector<float>& exp_avg, std::vector<float>& exp_avg_sq);
  // Every rank takes its part of a whole model's state.
  void scatter_state(const std::vector<float>& params, const std::vector<float>& exp_avg,
                     const std::vector<float>& exp_avg_sq);
  std::int64_t state_bytes() const;
  std::string describe() const;

 private:
  std::vector<float> pack_dense(const std::vector<float>& flat, std::size_t work) const;
  std::vector<float> pack_experts(const std::vector<float>& flat, std::size_t work) const;
  // The group's packed experts (one part per member) into a flat buffer's expert places.
  void gather_experts(const std::vector<float>& mine, std::vector<float>& flat);

  std::shared_ptr<comm::Communicator> world_, ep_group_, edp_group_;
  parallel::ExpertParallelGroups groups_;
  parallel::ExpertParallelLayout layout_;
  parallel::CommMoeExchange exchange_;
  int ep_rank_ = 0;
  std::size_t numel_ = 0;
  std::unique_ptr<CpuZero> dense_, experts_;
  std::vector<float> dense_p_, dense_g_, exp_p_, exp_g_;  // packed params and gradients (each plan's work_elems)
};

}  // namespace cutrain::train
