// @brief Data parallelism of the CPU backend: ZeRO stages 0-3 over a host communicator
// (runtime/comm/host_communicator.h), on the plans of the GPU engine: parallel/zero_plan.h (the
// mode of a stage, the flat partition of stages 1-2) and parallel/zero_shard_layout.h (stage 3's
// per-unit shards). Only the arithmetic (the reference model, a host AdamW) and the transport
// differ from the engine; what each rank holds, reduces and gathers is the same:
//   stage 0  every rank keeps everything; the gradients are all-reduced (averaged);
//   1 and 2  the gradient buffer (padded to world x per_rank) is reduce-scattered (averaged); the
//            moments exist for this rank's partition only, which it updates; the updated params
//            are all-gathered (the engine runs stages 1 and 2 alike, and so does this);
//   stage 3  params, moments and reduced gradients exist as this rank's shard of every unit; the
//            units are all-gathered into the flat working copy the reference model computes on
//            before the forward (and freed after the step), the gradients reduce-scattered unit
//            by unit.
// The gradient norm is the fp64 sum of squares of each rank's reduced part, all-reduced: the same
// norm, clip coefficient and NaN/Inf skip on every rank. The reported loss is the mean over the
// ranks' micro-batches (the global batch's), so a W-rank run reports the single process's losses.
#pragma once

#include <memory>
#include <vector>

#include "model/transformer_params.h"
#include "parallel/zero_plan.h"
#include "parallel/zero_shard_layout.h"
#include "runtime/comm/communicator.h"
#include "train/config.h"

namespace cutrain::train {

// The parameters one CpuZero partitions: a model's flat buffer, or expert parallelism's packed
// non-expert / expert parameters (train/cpu_expert_parallel.h).
struct CpuZeroSpace {
  std::size_t numel = 0;
  std::vector<model::DecayRun> decay_runs;  // weight decay per run of the space's elements
  std::vector<parallel::Range> units;       // stage 3's units
  // 0: the gradients are averaged over the group; > 0: summed over the group and divided by this
  // (expert parameters: the data-parallel world, so the average is over every rank's tokens as
  // DeepSpeed's _reduce_expert_gradients divides by the data-parallel world size).
  int grad_divisor = 0;
};
CpuZeroSpace model_space(const model::TransformerParams& table);

class CpuZero {
 public:
  // `full_params`: the flat params every rank initialised alike (the same seed).
  CpuZero(std::shared_ptr<comm::Communicator> comm, const model::TransformerParams& table, const TrainConfig& config,
          const std::vector<float>& full_params)
      : CpuZero(std::move(comm), model_space(table), config, full_params) {}
  CpuZero(std::shared_ptr<comm::Communicator> comm, CpuZeroSpace space, const TrainConfig& config,
          const std::vector<float>& full_params);

  const parallel::ZeroPlan& plan() const { return plan_; }
  // Elements of the flat working buffers (params, grads) the reference model computes on.
  std::size_t work_elems() const { return work_elems_; }
  // Before a forward: the full params into `params` (work_elems), gathered at stage 3.
  void params_for_compute(std::vector<float>& params);
  // After the step (stage 3): the working copy is freed.
  void release_compute(std::vector<float>& params) const;
  // The gradients of this rank's micro-batches (work_elems, 0 in padding) reduced over the ranks;
  // returns the global gradient norm.
  double reduce_grads(std::vector<float>& grads);
  // The same, returning the sum of squares over the group (its elements counted once).
  double reduce_grads_sq(std::vector<float>& grads);
  // AdamW on this rank's part with the clip coefficient `scale`, then the params shared again.
  void adam(std::vector<float>& params, const std::vector<float>& grads, int step, float lr, double scale);
  // Tensor parallelism (train/cpu_tensor_parallel.h): the gradient norm counts only the elements
  // `counted` marks (flat, numel) and its sum of squares is also summed over `tp_group`; the
  // communicator is then the data-parallel group and `world_rank` labels the log line.
  void set_tensor_parallel(const std::vector<unsigned char>* counted, comm::Communicator* tp_group, int world_rank) {
    counted_ = counted;
    tp_group_ = tp_group;
    world_rank_ = world_rank;
  }
  // The mean of every rank's value.
  double mean_over_ranks(double v);

  // Collective: the state as full flat buffers (numel), the same on every rank.
  void gather_state(const std::vector<float>& params, std::vector<float>& full_params, std::vector<float>& exp_avg,
                    std::vector<float>& exp_avg_sq);
  // The inverse: every rank takes its part of a full state.
  void scatter_state(const std::vector<float>& full_params, const std::vector<float>& exp_avg,
                     const std::vector<float>& exp_avg_sq, std::vector<float>& params);
  // Bytes of training state this rank holds (fp32 params, grads, two moments).
  std::int64_t state_bytes() const;
  // "[Rank r] ZeRO stage S, world size W (host communicator): ..." for the start-up log.
  std::string describe() const;

 private:
  // A per-rank buffer of the Partitioned plan (per_rank) or of the shard (shard_elems) to full
  // flat (numel) on every rank.
  std::vector<float> gather_to_flat(const std::vector<float>& part);
  // This rank's part of a full flat buffer.
  std::vector<float> part_of_flat(const std::vector<float>& flat) const;

  std::shared_ptr<comm::Communicator> comm_;
  CpuZeroSpace space_;
  TrainConfig cfg_;
  parallel::ZeroPlan plan_;
  parallel::ShardLayout layout_;  // stage 3
  std::size_t numel_ = 0, work_elems_ = 0;
  std::vector<float> m_, v_;        // this rank's moments (the full flat ones at stage 0)
  std::vector<float> shard_, grad_shard_;  // stage 3: this rank's params and reduced gradients
  struct Segment {  // stage 3: a run of shard elements and its flat position, one decay flag
    std::size_t shard = 0, flat = 0, count = 0;
    bool decay = true;
  };
  std::vector<Segment> segments_;
  const std::vector<unsigned char>* counted_ = nullptr;
  comm::Communicator* tp_group_ = nullptr;
  int world_rank_ = -1;
};

}  // namespace cutrain::train
