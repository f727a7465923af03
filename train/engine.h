// @brief The GPU training engine: the flat training state in the config's precision layout,
// micro-batches with gradient accumulation, global-norm clipping, NaN/Inf skip, one fused Adam(W)
// launch over the flat buffers, allocator memory statistics, and CUDA-graph replay of the
// forward/backward/grad-norm part of the step after a warm-up step. Data parallel over NCCL
// ranks with ZeRO stages 0-3 (docs/distributed.md): gradient all-reduce (0), or optimizer state
// partitioned + gradient reduce-scatter + param all-gather (1, 2), or (3) params, optimizer
// state and reduced gradients in per-unit shards with each unit (embeddings, block, head)
// gathered just before use and the next one prefetched on the communication stream
// (parallel/zero_stage3.h). The collectives of the gradient reduction and norm, and stage 3's
// gathers, are part of the captured graph. On one GPU the micro-batches can run through the
// pipeline's 1F1B program (train/gpu_pipeline.h: one stage, or every stage in this process) and
// the blocks' tensor-parallel all-reduces over a one-rank NCCL group (degree 1). Tensor
// parallelism above one rank (data x tensor, ZeRO stages 0-2; train/engine_tp.cpp): the world split
// into the grid's NCCL groups, the model's slice (Megatron's sharded blocks, vocabulary-parallel
// embedding and loss), the norm over the group, checkpoints as the group's sum; not with a pipeline.
//
// Pipeline over ranks (--pipeline_parallel_size S > 1, BackendOptions::pipeline_over_ranks): the
// world as DeepSpeed's grid (parallel/rank_grid.h, rank = stage x dp + replica), its data-parallel
// and pipeline groups NCCL sub-communicators (ncclCommSplit). Each rank runs its stage's layers
// (train/gpu_pipeline.h: activations to and from the neighbour stages by grouped NCCL send / recv).
// The flat buffers stay whole on every rank, as on the CPU backend's pipeline; each stage writes
// only its layers' gradients, averages them over its data-parallel group (ZeRO stage 0's all-reduce,
// of its range only), the norm's sum of squares of its range is summed over the pipeline group, and
// the optimizer steps its range only. A checkpoint sums the stages' ranges over the pipeline group
// (the other ranges zero): the single process's state. ZeRO stages 1-3, LAMB, fp16 and tied heads
// (GPT-2, BERT: their partial stages are not built in the model) are refused with it.
//
// MoE expert parallelism (BackendOptions::expert_parallel, DeepSpeed's ep_size; docs/moe.md): the
// world in expert-parallel groups (parallel/expert_parallel_plan.h), each an NCCL sub-communicator
// over which the MoE layers exchange tokens (model/moe_layer.h). Every rank keeps the whole flat
// buffer; the experts it does not hold have zero gradients, so the world's gradient reduction
// (ZeRO 0's all-reduce, 1-2's reduce-scatter, averaged over the world) gives each expert the sum
// over its expert-data-parallel group divided by the world size (DeepSpeed's expert gradient), the
// other parameters the world's mean, and the norm sees every expert once. Stage 3 is refused.
//
// fp16 (fp16.enabled): the model computes in fp16 (params' copy, activations, 16-bit gradients)
// over the fp32 master; the loss scale lives in a device word staged like the tokens (a replay
// reads each step's), the loss gradient carries it, the norm kernel unscales and flags an
// overflow, the optimizer reads that flag and becomes a no-op; after the step's single sync the
// host LossScaler (DeepSpeed's semantics) updates the scale, logs an overflow and stops the run
// when one comes at fp16.min_loss_scale.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "model/transformer_gpu.h"
#include "parallel/tensor_parallel_plan.h"
#include "parallel/tp_device_group.h"
#include "parallel/zero_comm.h"
#include "parallel/zero_plan.h"
#include "parallel/zero_shard_layout.h"
#include "parallel/zero_stage3.h"
#include "runtime/device.h"
#include "runtime/offload.h"
#include "kernels/lamb.cuh"
#include "train/cpu_backend.h"
#include "train/gpu_pipeline.h"
#include "train/loss_scaler.h"
#include "train/optimizer_swap.h"
#include "train/precision.h"
#include "train/random_ltd_draw.h"
#include "train/step_graphs.h"
#include "train/train_backend.h"

namespace cutrain::train {

class GpuEngine final : public TrainBackend {
 public:
  GpuEngine(const BackendOptions& options, const TrainConfig& config);
  ~GpuEngine() override;

  const model::TransformerParams& table() const override { return table_; }
  StepStats step(const std::int32_t* tokens, const std::int32_t* labels, int step, float lr) override;
  double eval_loss(const std::int32_t* tokens, const std::int32_t* labels) override;
  MemoryStats memory() const override;
  void reset_peak() override;
  void release_workspace() override;
  HostState save_state() const override;
  void load_state(const HostState& state) override;
  void snapshot_state(StateSnapshot& out) const override;
  void restore_snapshot(const StateSnapshot& s) override;
  std::unique_ptr<DeviceRestore> device_restore(DType params, std::optional<DType> master, DType moments,
                                                std::optional<DType> compensation) override;
  bool has_compensation() const override { return plan_.compensation; }
  bool holds_teacher() const override { return teacher_model_ != nullptr; }
  const char* describe() const override { return describe_.c_str(); }

  // For tests: forward + backward of the micro-batches only (no optimizer step, no ZeRO
  // reduction: this rank's own gradients); returns the mean loss. Gradients stay in the flat
  // gradient buffer. After a ZeRO 1-2 step only this rank's partition of it is reduced; stage 3
  // keeps this rank's unreduced gradients there (the reduced ones are in its gradient shard).
  // `drop_step` > 0: with random-LTD's selection of that (1-based) step; 0: every token. BERT's
  // dropout draws the masks of step `drop_step` (0 included).
  double forward_backward(const std::int32_t* tokens, const std::int32_t* labels, int drop_step = 0);
  std::vector<float> download_grads() const;   // flat, as float (stage 3: from the padded layout)
  // The MoE blocks' routing of the last forward_backward() or step() (empty for a dense model).
  const std::vector<model::MoeBlockStats>& moe_stats() const { return model_->moe_stats(); }
  // fp16: the loss scale the next step runs with (0 in bf16 training), and the scaler.
  double loss_scale() const { return scaler_ ? scaler_->loss_scale() : 0.0; }
  const LossScaler* loss_scaler() const { return scaler_.get(); }
  std::optional<LossScalerState> loss_scaler_state() const override;
  bool restore_loss_scaler(const LossScalerState& state) override;
  // Fills every real gradient element with 0xFF (NaN) so a test sees which ones a step wrote.
  void poison_grads();
  // Flat 16-bit params (bf16, or fp16 in fp16 training), as float. Stage 3: gathered from every
  // rank's shard (collective).
  std::vector<float> download_params() const;
  const PrecisionPlan& plan() const { return plan_; }
  // Bytes the persistent training state took from the allocator (params, grads, master or
  // compensation, moments).
  // `state_requested_bytes` is what the engine asked for (exactly n x bytes/param); `state_bytes`
  // what the allocator handed out (rounding, unsplit remainders).
  std::size_t state_bytes() const { return state_bytes_; }
  std::size_t state_requested_bytes() const { return state_requested_bytes_; }
  // Whether the last step's shape has a captured graph (replayed from its next step on).
  bool graph_active() const { return graphs_.captured(last_shape_); }
  // A sequence-length curriculum's micro-batch shape (TrainBackend::set_seq_shape).
  void set_seq_shape(int rows, int seq) override;
  const parallel::ZeroPlan& zero_plan() const { return zero_; }
  // Stage 3 (ZeroMode::Sharded) only: the per-unit shard layout and its gathers; null otherwise.
  const parallel::ShardedParams* sharded() const { return sharded_.get(); }
  int graph_captures() const { return graphs_.captures(); }  // successful captures so far (all shapes)
  int graph_count() const { return graphs_.size(); }         // graphs held (one per shape seen twice)
  // The pipeline the step runs through (BackendOptions::pipeline_engine / stages_in_process);
  // null: the plain micro-batch loop.
  const GpuPipeline* pipeline() const { return pipeline_.get(); }
  // Pipeline over ranks: this rank's pipeline and data-parallel groups and its stage's flat range;
  // null / empty otherwise.
  const comm::Communicator* pipeline_group() const { return pp_comm_.get(); }
  const comm::Communicator* stage_dp_group() const { return dp_comm_.get(); }
  parallel::Range stage_range() const { return stage_range_; }
  // The tensor-parallel group (BackendOptions::tensor_parallel_engine, or a degree above 1); null: none.
  const parallel::CommTpDeviceGroup* tensor_parallel_group() const { return tp_group_.get(); }

  // DeepSpeed's engine.offload_states / reload_states. `include`: any of optim_states (moments, and
  // the bf16 master's compensation when the layout has one),
  // hp_params (fp32 master), lp_params (bf16 params), lp_grads (the bf16 gradient buffer) or
  // contiguous_grad_buffer (the fp32 accumulation buffer), as the layout has them; empty: all.
  // device nvme needs `nvme_path` (a folder). After a non-blocking reload (or none) the next use
  // of the state waits for (or does) the reload itself; the CUDA graph is rebuilt after a reload.
  // With zero_optimization.offload_optimizer the swap first hands its states back (they are then
  // resident until the next optimizer step swaps them out again).
  void offload_states(const std::vector<std::string>& include = {}, OffloadDevice device = OffloadDevice::Cpu,
                      bool pin_memory = true, bool non_blocking = false, const std::string& nvme_path = "");
  void reload_states(bool non_blocking = false);
  std::vector<std::string> offloadable_states() const;  // the include names this layout has
  StateOffloader& offloader() { return *offloader_; }
  // zero_optimization.offload_optimizer (device cpu or nvme): the optimizer state's swap; null
  // when the config offloads nothing.
  OptimizerSwap* optimizer_swap() { return swap_.get(); }

 private:
  void stage_batch(const std::int32_t* tokens, const std::int32_t* labels);
  void stage_drop(int step);
  // Static: capturable. `step`: a training step's pass (stage 3 with overlap_comm then reduces
  // the gradients during the backward); false for the forward_backward() test helper.
  void enqueue_forward_backward(bool step = true);
  void enqueue_reduce();  // the ZeRO gradient reduction (nothing without a communicator)
  void enqueue_norm();
  void read_flags();
  void update_loss_scale(StepStats& st);  // fp16, after the step's sync
  void ensure_state() const;  // offloaded states reloaded, the stream waits for reloads in flight
  // Stage 3: a shard-layout state gathered from every rank (collective) into the flat layout.
  std::vector<float> gather_sharded(const Buffer& shard, DType t) const;
  // Stage 3: this rank's shard of a flat host state uploaded into `shard` (padding 0).
  void put_sharded(const Buffer& shard, DType t, const float* flat);
  // The state buffers the layout holds (resident, unpartitioned), in DeviceRestore's part order,
  // with their dtypes: what a snapshot copies and a restore fills.
  struct StatePart {
    DeviceRestore::Part part;
    const Buffer* buffer;
    DType dtype;
  };
  std::vector<StatePart> state_parts() const;

  BackendOptions opt_;
  TrainConfig cfg_;
  model::TransformerParams table_;
  PrecisionPlan plan_;
  int accum_;
  std::size_t n_;
  std::vector<model::DecayRun> decay_runs_;  // one optimizer launch each (weight decay on or off)
  // Before stream_: resolving it selects the rank's device, where the stream is then created.
  std::shared_ptr<comm::Communicator> comm_;
  // Expert parallelism: this rank's expert-parallel group (the MoE layers' exchange); before
  // model_, which uses it.
  std::shared_ptr<comm::Communicator> ep_comm_;
  Stream stream_;
  parallel::ZeroPlan zero_;
  std::unique_ptr<parallel::ZeroComm> zero_comm_;  // null for ZeroMode::None
  // Stage 3: the units' shard layout, the use orders of a step and of an eval forward.
  parallel::ShardLayout layout_;
  std::vector<int> train_order_, eval_order_;
  // Stage 3: the optimizer's launches over this rank's shard, one per run of one weight-decay
  // rule (its flat run's index picks the rule and the stochastic-rounding seed).
  std::vector<parallel::ShardSegment> shard_launches_;
  std::string describe_;
  // Stage 3: params_, master_, comp_, m_, v_ and grad_shard_ hold this rank's shard
  // (layout_.shard_elems); grads_ is the full gradient buffer in the padded layout (backward writes
  // every unit). comp_: the bf16 master's compensation (plan_.compensation), sized like m_ in bf16.
  Buffer params_, grads_, master_, comp_, m_, v_, grad_shard_;
  Buffer tokens_d_, labels_d_, flags_d_, norm_scratch_;
  // BERT: the optimizer step its dropout masks are drawn for, staged like the tokens (pinned host
  // word copied to the device word inside the captured part, so a replay reads the new step).
  Buffer step_d_;
  std::uint32_t* step_h_ = nullptr;
  void stage_step(int step);
  // MoE: each micro-batch's gate-noise seed, staged like the tokens (pinned host words copied to
  // the device words inside the captured part), so a replay draws its step's noise.
  Buffer moe_seeds_d_;
  std::uint64_t* moe_seeds_h_ = nullptr;
  void stage_moe_seeds();
  // Lamb: the packed tensor table and the workspace (partials, ratios, counters) of lamb_step.
  Buffer lamb_table_, lamb_ws_;
  kernels::LambDeviceTable lamb_;
  std::size_t state_bytes_ = 0, state_requested_bytes_ = 0;
  // Tensor parallelism at degree 1: the one-rank group the blocks' all-reduces go over.
  std::shared_ptr<comm::Communicator> tp_comm_;
  std::unique_ptr<parallel::CommTpDeviceGroup> tp_group_;
  // Above one rank (train/engine_tp.cpp): the world (comm_ is then its data-parallel group, or
  // none), this rank's slice and flat layout, the norm's packed slices and fp64 sum.
  std::shared_ptr<comm::Communicator> world_;
  model::TpSlice tp_slice_;
  parallel::TpLayout tp_layout_;
  Buffer tp_norm_pack_, tp_sumsq_;
  std::size_t tp_norm_count_ = 0;
  void setup_tensor_grid();
  void setup_tp_norm();
  void tp_mask_held(std::vector<float>& v) const;   // the elements this rank does not hold zeroed
  void tp_group_sum(std::vector<float>& v) const;   // collective: the group's whole state
  void enqueue_tp_norm(float* norm, float* clip_scale, int* nonfinite);
  void load_flat_state(const HostState& s);
  std::unique_ptr<model::GpuModel> model_;  // on plan_.param (bf16 or fp16)
  // fp16: the dynamic or static scaler, the scale's device word and its pinned staging (copied to
  // the device inside the captured part, like step_d_).
  std::unique_ptr<LossScaler> scaler_;
  Buffer scale_d_;
  float* scale_h_ = nullptr;
  const float* loss_scale_d() const { return scaler_ ? scale_d_.as<float>() : nullptr; }
  // Knowledge distillation (Mixture-of-Students, BackendOptions::teacher): the teacher's table,
  // bf16 params, forward-only model, a word for its loss and two for its status, each
  // micro-batch's T^2 * mean KL; all freed at the stop step (release_teacher).
  std::unique_ptr<model::TransformerParams> teacher_table_;
  Buffer teacher_params_, teacher_words_, kd_d_;
  std::unique_ptr<model::GpuTransformer> teacher_model_;
  std::vector<float> kd_h_;
  bool distill_now_ = false;  // the step running distills
  bool graph_after_teacher_ = false;  // CUDA-graph steps once the teacher is freed (eager while distilling)
  void attach_teacher(const BackendOptions& o, CachingAllocator& A);
  void release_teacher();
  std::unique_ptr<GpuPipeline> pipeline_;  // after model_: a one-stage pipeline runs it
  // Pipeline over ranks: the groups (NCCL sub-communicators of comm_, or comm_ itself when a group
  // is the world), this stage's flat range, a device double for the norm's sum of squares.
  bool over_ranks_ = false;
  std::shared_ptr<comm::Communicator> pp_comm_, dp_comm_;
  parallel::Range stage_range_;
  Buffer sumsq_;
  // Pipeline over ranks: a whole-state buffer's stages gathered (each rank's range, zeros
  // elsewhere, summed over the pipeline group: collective), as float.
  std::vector<float> gather_stages(const Buffer& b, DType t) const;
  std::unique_ptr<model::GpuModel> make_model() const;
  std::vector<int> drop_layers_;  // random-LTD's blocks (the models' constructor argument)
  void setup_tensor_parallel();
  void setup_pipeline();
  std::unique_ptr<parallel::ShardedParams> sharded_;  // stage 3 only; after zero_comm_ (uses its stream)
  // Host pinned staging: tokens, labels [accum][cap_], and the flags read back after each step.
  std::int32_t* tokens_h_ = nullptr;
  std::int32_t* labels_h_ = nullptr;
  float* flags_h_ = nullptr;
  // flags layout (fp32 words): loss[accum], norm, clip_scale, then ints nonfinite, status[2*accum]
  std::size_t flag_words_ = 0;
  // random-LTD: the draw, the staged indices (device and pinned host, drop_stride_ per
  // micro-batch), this step's kept count (0: no drop) and layer tokens, and the kept count the
  // graph was captured for.
  std::unique_ptr<RandomLtdDraw> ltd_;
  // One step's draw on the host: every micro-batch's indices packed (per_micro each), at rows x seq.
  struct DropDraw {
    int step = -1, rows = 0, seq = 0, kept = 0;
    std::int64_t layer_tokens = 0;
    std::size_t per_micro = 0;
    std::vector<std::int32_t> indices;
  };
  DropDraw next_drop_;  // the next step's, drawn during this step's device work
  void draw_drop(int step, DropDraw& d);
  void prefetch_drop(int next_step);
  Buffer drop_idx_d_;
  std::int32_t* drop_idx_h_ = nullptr;
  std::size_t drop_stride_ = 0;
  int kept_ = 0;
  std::int64_t step_layer_tokens_ = 0;
  // The micro-batch's shape (a sequence-length curriculum's rows x seq; the run's B x S by
  // default) and each micro-batch's staging slot in tokens (>= B x S).
  int rows_ = 0, seq_ = 0;
  std::size_t cap_ = 0;
  // The step's graphs, one per shape (kept count, rows x seq), and the last step's shape.
  StepGraphs graphs_;
  StepShape last_shape_;
  // Last: destroyed first, while the state buffers it moves still exist.
  std::unique_ptr<StateOffloader> offloader_;
  std::uint64_t graph_generation_ = 0;  // offloader generation the graph was captured at
  // After offloader_: destroyed before it (both before the buffers they move).
  std::unique_ptr<OptimizerSwap> swap_;
};

std::unique_ptr<TrainBackend> make_gpu_backend(const BackendOptions& options, const TrainConfig& config);

}  // namespace cutrain::train
