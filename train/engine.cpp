#include "train/engine.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <iostream>

#include "kernels/adamw.cuh"
#include "kernels/lamb.cuh"
#include "kernels/reduce.cuh"
#include "model/kernel_costs.h"
#include "parallel/expert_parallel_plan.h"
#include "parallel/group_communicator.h"
#include "parallel/rank_grid.h"
#include "parallel/tensor_parallel_plan.h"
#include "runtime/check.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/launch_env.h"
#include "runtime/nvtx.h"
#include "runtime/profiler.h"
#include "runtime/timing.h"
#include "train/lamb_optimizer.h"
#include "train/random_ltd_draw.h"
#include "train/zero_memory.h"

namespace cutrain::train {

namespace {
void upload(const Buffer& b, DType t, const float* v, std::size_t n, cudaStream_t s);
void upload(const Buffer& b, DType t, const std::vector<float>& v, cudaStream_t s) { upload(b, t, v.data(), v.size(), s); }
std::vector<float> download(const Buffer& b, DType t, std::size_t n);
float* as_f32(const Buffer& b) { return b.as<float>(); }

// MoE's expert-parallel path (the token exchange over NCCL), at any ep_size when asked for.
bool expert_parallel_path(const BackendOptions& o) {
  return o.dims.moe.any() && (o.expert_parallel > 1 || o.moe_exchange);
}

// The communicator of this process: the one the caller gave, else one from the launch
// environment when it names more than one rank (collective over all ranks), else none (a single
// process with MoE's expert-parallel path: a world-1 NCCL communicator, the exchange's transport).
std::shared_ptr<comm::Communicator> resolve_communicator(const BackendOptions& o, const TrainConfig& c) {
  if (o.comm) {
    CUTRAIN_CUDA_CHECK(cudaSetDevice(o.comm->device()));
    return o.comm;
  }
  const comm::LaunchEnv env = comm::read_launch_env();
  if (env.world_size <= 1 && expert_parallel_path(o)) {
    parallel::make_zero_plan(c.zero_optimization.stage, 1, 1, 0, /*has_comm=*/true);
    return std::shared_ptr<comm::Communicator>(comm::Communicator::create(env));
  }
  if (env.world_size <= 1) return nullptr;  // a single process never needs NCCL otherwise
  // An invalid stage fails here, before the rendezvous and NCCL set-up.
  parallel::make_zero_plan(c.zero_optimization.stage, 1, env.world_size, env.rank, /*has_comm=*/true);
  std::cout << "[Rank " << env.rank << "] data parallel: rank " << env.rank << " of " << env.world_size << " (from "
            << env.source << "), local rank " << env.local_rank << " -> cuda:" << env.local_rank
            << ", rendezvous " << env.master_addr << ":" << env.port() << std::endl;
  return std::shared_ptr<comm::Communicator>(comm::Communicator::create(env));
}
}  // namespace

GpuEngine::GpuEngine(const BackendOptions& o, const TrainConfig& c)
    : opt_(o),
      cfg_(c),
      table_(o.dims),
      plan_(plan_from_config(c)),
      accum_(c.accumulation()),
      n_(table_.flat_size()),
      decay_runs_(table_.decay_runs()),
      comm_(resolve_communicator(o, c)) {
  std::string why;
  CUTRAIN_CHECK(gpu_available(&why), "train: --device cuda needs a CUDA device (", why, "); use --device cpu");
  describe_ = "cuda (" + device_info().name + ")";
  if (expert_parallel_path(o)) {
    // DeepSpeed's groups (parallel/expert_parallel_plan.h), every bad value named before any
    // allocation; the expert-parallel group as an NCCL sub-communicator (collective).
    const char* flag = "--moe_expert_parallel_size";
    const int ep = o.expert_parallel;
    CUTRAIN_CHECK(comm_ && comm_->device() >= 0, "train: ", flag, " ", ep,
                  " on the GPU needs an NCCL communicator, found ", comm_ ? comm_->backend_name() : "none");
    CUTRAIN_CHECK(c.zero_optimization.stage >= 0 && c.zero_optimization.stage <= 2, "train: zero_optimization.stage ",
                  c.zero_optimization.stage, " with ", flag, " ", ep, ": the GPU engine's expert parallelism "
                  "reduces with ZeRO stages 0-2; stage 3's parameter shards are not built for it");
    parallel::make_expert_parallel_layout(table_, ep, flag);  // ep divides each MoE block's experts
    const parallel::ExpertParallelGroups g = parallel::make_expert_parallel_groups(comm_->world_size(), ep, flag);
    ep_comm_ = parallel::make_group(comm_, g.ep_group(comm_->rank()));
    describe_ += ", expert parallel: ep_size " + std::to_string(ep) + " of world " +
                 std::to_string(comm_->world_size()) + " (token all-to-all over " + ep_comm_->backend_name() + ")";
  }
  if (o.tensor_parallel > 1) setup_tensor_grid();  // comm_ becomes the data-parallel group
  over_ranks_ = o.pipeline_over_ranks || o.pipeline_stages > 1;
  if (over_ranks_) {
    // The pipeline over ranks: every bad value named before any allocation, then the grid's groups
    // (collective: every rank splits the same way).
    const std::string pp_flag = "--pipeline_parallel_size " + std::to_string(o.pipeline_stages);
    CUTRAIN_CHECK(comm_ && comm_->device() >= 0, "train: ", pp_flag, " on the GPU engine sends activations between "
                  "stage ranks over NCCL: expected an NCCL communicator (cutrain launch --num_gpus N), found ",
                  comm_ ? comm_->backend_name() : "none (one process)");
    CUTRAIN_CHECK(c.zero_optimization.stage == 0, "train: zero_optimization.stage ", c.zero_optimization.stage, " with ",
                  pp_flag, " on the GPU engine: each stage's gradients are averaged over its data-parallel group "
                  "(stage 0's all-reduce); ZeRO stages 1-3 inside a GPU pipeline are not built (the CPU backend's "
                  "pipeline takes stage 1); expected stage 0");
    CUTRAIN_CHECK(c.optimizer.type != OptimizerType::Lamb, "train: optimizer type Lamb with ", pp_flag,
                  ": its trust ratios need whole tensors on one rank; the pipeline's stages update with AdamW");
    CUTRAIN_CHECK(o.stages_in_process <= 1, "train: --pipeline_stages_in_process ", o.stages_in_process, " with ",
                  pp_flag, ": expected one of them");
    CUTRAIN_CHECK(!table_.tied_head() || o.pipeline_stages == 1, "train: ", pp_flag, " with --model ",
                  o.dims.arch == model::Arch::Gpt2 ? "gpt2" : "bert", ": the GPU model's stages of part of a tied-head "
                  "model (its head reads the token embedding on the last stage) are not built; the CPU backend's "
                  "pipeline runs it (--device cpu)");
    const parallel::RankGrid grid =
        parallel::make_rank_grid(comm_->world_size(), o.pipeline_stages, 1, "--pipeline_parallel_size", "tensor parallel");
    dp_comm_ = parallel::make_group(comm_, grid.dp_group(comm_->rank()));
    pp_comm_ = parallel::make_group(comm_, grid.pp_group(comm_->rank()));
    CUTRAIN_CHECK(pp_comm_->rank() == grid.coord(comm_->rank()).stage, "train: the pipeline group gave rank ",
                  pp_comm_->rank(), ", expected the stage ", grid.coord(comm_->rank()).stage);
  }
  // Pipeline over ranks: no ZeRO plan over the world (the stage's data-parallel reduction is the
  // pipeline's own, enqueue_reduce).
  zero_ = over_ranks_ ? parallel::make_zero_plan(0, n_, 1, 0, /*has_comm=*/false)
                      : parallel::make_zero_plan(c.zero_optimization.stage, n_, comm_ ? comm_->world_size() : 1,
                                                 comm_ ? comm_->rank() : 0, comm_ != nullptr);
  // fp16: stage 3's shard gathers and persistent units move bf16 params (parallel/zero_stage3.h).
  CUTRAIN_CHECK(plan_.param != DType::F16 || !zero_.sharded(),
                "train: fp16.enabled with zero_optimization.stage 3 is not supported by the GPU engine (its parameter "
                "shards are gathered as bf16); use stage 0, 1 or 2, or bf16.enabled");
  // fp16: the features whose kernels or hand-overs are bf16 only, or not threaded with the loss scale.
  if (plan_.param == DType::F16) {
    CUTRAIN_CHECK(!o.teacher, "train: fp16.enabled with Mixture-of-Students distillation (--mos) is not supported by "
                  "the GPU engine (its kd_loss kernel and the teacher's logits are bf16); use bf16.enabled");
    CUTRAIN_CHECK(!o.tensor_parallel_engine && o.tensor_parallel <= 1,
                  "train: fp16.enabled with tensor parallelism (", o.tensor_parallel_flag,
                  ") is not supported by the GPU engine (its block all-reduces are bf16); use bf16.enabled");
    CUTRAIN_CHECK(!o.pipeline_engine && o.stages_in_process <= 1 && o.pipeline_stages <= 1,
                  "train: fp16.enabled with the pipeline's program (--pipeline_parallel_size / "
                  "--pipeline_stages_in_process) is not supported by the GPU engine (the loss scale is not threaded "
                  "through its stages); use bf16.enabled");
    CUTRAIN_CHECK(o.max_tokens <= std::size_t(o.batch) * o.seq,
                  "train: fp16.enabled with a sequence-length curriculum is not supported by the GPU engine (its "
                  "per-shape graphs are not verified with the loss scale); use bf16.enabled");
  }
  check_offload_paths(c);  // before any allocation: a missing swap folder fails fast
  CachingAllocator& A = device_allocator();
  const AllocatorStats before = A.stats();

  // Persistent state in the layout's dtypes; grads zeroed once so the flat buffer's padding stays 0.
  // Partitioned (ZeRO 1-2): params and grads padded to world x per_rank elements; master and
  // moments only for this rank's partition. Sharded (3): params, master, moments and the reduced
  // gradients in this rank's shard; the full gradient buffer in the padded layout. Otherwise
  // flat == state == n_.
  if (zero_.sharded()) {
    // The shards live on the device; moving them to the host or NVMe is not implemented.
    CUTRAIN_CHECK(c.zero_optimization.offload_param.device == OffloadTarget::None,
                  "zero_optimization.offload_param.device \"", name(c.zero_optimization.offload_param.device),
                  "\" is not supported by the GPU engine's stage 3 (the parameter shards stay on the device); set it "
                  "to \"none\" (offload_optimizer is supported)");
    std::vector<parallel::Range> units;
    for (const model::ParamUnit& u : table_.units()) units.push_back({u.begin, u.end});
    layout_ = parallel::make_shard_layout(units, n_, zero_.world,
                                std::size_t(c.zero_optimization.stage3_param_persistence_threshold));
    // GPT-2's and BERT's tied head acquires the embedding unit a second time, with the head;
    // BERT's embedding backward reads its LayerNorm (model/transformer_gpu.h).
    const parallel::Stage3Uses uses{table_.tied_head(), model::GpuTransformer::embedding_backward_reads_params(o.dims)};
    train_order_ = parallel::stage3_use_order(table_.dims().layers, accum_, /*eval=*/false, uses);
    eval_order_ = parallel::stage3_use_order(table_.dims().layers, 1, /*eval=*/true, uses);
    // The optimizer's launches: this rank's pieces cut by the weight-decay runs, pieces of one run
    // that follow each other in the shard in one launch (at world size 1: the flat runs).
    std::vector<parallel::Range> runs;
    for (const model::DecayRun& r : decay_runs_) runs.push_back({r.begin, r.end});
    for (const parallel::ShardSegment& g : parallel::shard_segments(layout_, zero_.rank, runs)) {
      if (!shard_launches_.empty() && shard_launches_.back().run == g.run &&
          shard_launches_.back().shard + shard_launches_.back().count == g.shard)
        shard_launches_.back().count += g.count;
      else
        shard_launches_.push_back(g);
    }
  }
  const std::size_t flat = zero_.sharded() ? layout_.padded_elems : zero_.flat_elems();
  const std::size_t ns = zero_.sharded() ? layout_.shard_elems : zero_.state_elems();
  params_ = Buffer(A, (zero_.sharded() ? ns : flat) * dtype_size(plan_.param), stream_);
  grads_ = Buffer(A, flat * dtype_size(plan_.grad), stream_);
  if (zero_.sharded()) grad_shard_ = Buffer(A, ns * dtype_size(plan_.grad), stream_);
  if (plan_.has_master) master_ = Buffer(A, ns * 4, stream_);
  if (plan_.compensation) comp_ = Buffer(A, ns * 2, stream_);  // partitioned and sharded like the master
  m_ = Buffer(A, ns * dtype_size(plan_.moment), stream_);
  v_ = Buffer(A, ns * dtype_size(plan_.moment), stream_);
  const AllocatorStats after = A.stats();
  state_bytes_ = std::size_t(after.allocated_bytes.current - before.allocated_bytes.current);
  state_requested_bytes_ = std::size_t(after.requested_bytes.current - before.requested_bytes.current);

  {
    // Fresh state: the initial weights (16-bit params, fp32 master from the same values) and zero
    // moments set on the device, so a 6.86B model does not stage four fp32 copies in host memory.
    std::vector<float> init(n_);
    table_.init(init.data(), o.seed);
    if (tp_slice_.size > 1) tp_mask_held(init);  // the flat layout: the other ranks' slices zero
    if (zero_.sharded()) {
      const std::vector<float> shard = layout_.shard_from_flat(init.data(), zero_.rank);
      upload(params_, plan_.param, shard, stream_);
      if (plan_.has_master) upload(master_, DType::F32, shard, stream_);
    } else {
      if (flat > n_) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(params_.get(), 0, params_.bytes(), stream_));
      upload(params_, plan_.param, init, stream_);
      if (plan_.has_master) {
        // This rank's partition of the initial weights (all of them when not partitioned).
        const parallel::Range r = zero_.state_range();
        const std::size_t real = r.begin < n_ ? std::min(r.end, n_) - r.begin : 0;
        if (real < ns) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(master_.get(), 0, master_.bytes(), stream_));
        upload(master_, DType::F32, init.data() + std::min(r.begin, n_), real, stream_);
      }
    }
  }
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(m_.get(), 0, m_.bytes(), stream_));
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(v_.get(), 0, v_.bytes(), stream_));
  if (plan_.compensation) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(comp_.get(), 0, comp_.bytes(), stream_));  // the weights start exact
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), stream_));
  if (grad_shard_) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(grad_shard_.get(), 0, grad_shard_.bytes(), stream_));

  if (c.optimizer.type == OptimizerType::Lamb) {
    // The per-tensor trust ratios need whole tensors on this rank (the config refuses ZeRO too).
    CUTRAIN_CHECK(!zero_.partitioned() && !zero_.sharded(), "train: optimizer type Lamb needs zero_optimization.stage 0 ",
                  "(its trust ratios are per whole tensor), found stage ", c.zero_optimization.stage);
    const kernels::LambPlan lp = kernels::LambPlan::make(lamb_tensors(table_));
    std::vector<unsigned char> packed(lp.table_bytes());
    lp.pack(packed.data());
    lamb_table_ = Buffer(A, packed.size(), stream_);
    lamb_ws_ = Buffer(A, lp.workspace_bytes(), stream_);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(lamb_table_.get(), packed.data(), packed.size(), cudaMemcpyHostToDevice, stream_));
    CUTRAIN_CUDA_CHECK(cudaMemsetAsync(lamb_ws_.get(), 0, lamb_ws_.bytes(), stream_));  // the counters start at 0
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `packed` is freed at the end of this block
    lamb_ = kernels::lamb_device_table(lp, lamb_table_.get(), lamb_ws_.get());
  }
  // Each micro-batch's slot holds cap_ tokens: the run's B x S, or a sequence-length curriculum's
  // largest micro-batch (BackendOptions::max_tokens); the curriculum's shapes use its first rows x seq.
  cap_ = std::max(std::size_t(o.batch) * o.seq, o.max_tokens);
  rows_ = o.batch;
  seq_ = o.seq;
  const std::size_t per_step = std::size_t(accum_) * cap_;
  tokens_d_ = Buffer(A, per_step * 4, stream_);
  labels_d_ = Buffer(A, per_step * 4, stream_);
  flag_words_ = std::size_t(accum_) + 2 + 1 + 2 * std::size_t(accum_);
  flags_d_ = Buffer(A, flag_words_ * 4, stream_);
  norm_scratch_ = Buffer(A, kernels::grad_norm_scratch_bytes(std::max(n_, layout_.shard_elems)), stream_);
  CUTRAIN_CUDA_CHECK(cudaMallocHost(&tokens_h_, per_step * 4));
  CUTRAIN_CUDA_CHECK(cudaMallocHost(&labels_h_, per_step * 4));
  CUTRAIN_CUDA_CHECK(cudaMallocHost(&flags_h_, flag_words_ * 4));
  nvtx_name_stream(stream_.get(), "cutrain.compute");
  std::cout << zero_memory_line(plan_, zero_, layout_.gather_elems, layout_.persistent_elems) << std::endl;
  if (zero_.mode != parallel::ZeroMode::None)
    zero_comm_ = std::make_unique<parallel::ZeroComm>(comm_, zero_, parallel::ZeroCommOptions{c.zero_optimization.overlap_comm, c.zero_optimization.reduce_bucket_size}, table_, plan_.grad, A, stream_.get());
  if (zero_.sharded()) {
    sharded_ = std::make_unique<parallel::ShardedParams>(comm_, zero_comm_->stream(), layout_, table_, A, stream_.get());
    sharded_->refresh_persistent(stream_, params_.as<bf16>());
  }
  // random-LTD: the token selection per micro-batch (the CPU backend's draw), staged beside the
  // tokens: [accum][drop blocks][rows][kept] at a fixed stride per micro-batch (a curriculum's
  // rows x kept stays below its rows x L <= cap_).
  ltd_ = std::make_unique<RandomLtdDraw>(c, o.batch, o.seq, o.dims.layers, comm_ ? comm_->rank() : 0);
  std::vector<int> drop_layers;
  if (ltd_->active()) {
    if (opt_.cuda_graph) describe_ += ", random-LTD: the CUDA graph captured again per kept count";
    drop_layers = c.data_efficiency.random_ltd.layer_ids;
    drop_stride_ = drop_layers.size() * cap_;
    drop_idx_d_ = Buffer(A, accum_ * drop_stride_ * 4, stream_);
    CUTRAIN_CUDA_CHECK(cudaMallocHost(&drop_idx_h_, accum_ * drop_stride_ * 4));
    std::fill(drop_idx_h_, drop_idx_h_ + accum_ * drop_stride_, 0);
  }
  drop_layers_ = std::move(drop_layers);
  model_ = make_model();
  if (plan_.param == DType::F16) {  // the loss scale: a device word the captured part copies in
    scaler_ = std::make_unique<LossScaler>(LossScalerOptions::from_config(c.fp16));
    scale_d_ = Buffer(A, sizeof(float), stream_);
    CUTRAIN_CUDA_CHECK(cudaMallocHost(&scale_h_, sizeof(float)));
    *scale_h_ = static_cast<float>(scaler_->loss_scale());
    describe_ += scaler_->dynamic() ? ", fp16 (dynamic loss scale)" : ", fp16 (static loss scale)";
  }
  if (o.dims.moe.any()) {  // the gate noise's seeds read on the device (staged per step)
    moe_seeds_d_ = Buffer(A, accum_ * sizeof(std::uint64_t), stream_);
    CUTRAIN_CUDA_CHECK(cudaMallocHost(&moe_seeds_h_, accum_ * sizeof(std::uint64_t)));
    std::fill(moe_seeds_h_, moe_seeds_h_ + accum_, std::uint64_t(0));
    model_->set_moe_seed_words(moe_seeds_d_.as<std::uint64_t>());
  }
  if (o.dims.moe.any() && opt_.cuda_graph) {
    // Token dropping: the MoE layers' slot layout keeps the counts on the device and the gate
    // noise's seeds come from moe_seeds_d_, so the step is captured like a dense one; without
    // dropping or with expert parallelism they read counts on the host.
    const std::string why = model_->moe_eager_reason();
    if (why.empty()) {
      describe_ += ", MoE layers in the CUDA graph (fixed [experts, capacity] slots)";
    } else {
      opt_.cuda_graph = false;
      describe_ += ", eager steps: the MoE layers are not CUDA-graph capturable (" + why + ")";
    }
  }
  if (o.tensor_parallel_engine || o.tensor_parallel > 1) setup_tensor_parallel();
  if (o.pipeline_engine || o.stages_in_process > 1 || o.pipeline_stages > 1 || over_ranks_) setup_pipeline();
  if (o.dims.arch == model::Arch::Bert) {  // dropout: the kernels read the step from step_d_
    step_d_ = Buffer(A, sizeof(std::uint32_t), stream_);
    CUTRAIN_CUDA_CHECK(cudaMallocHost(&step_h_, sizeof(std::uint32_t)));
    stage_step(0);
  }
  if (o.teacher) attach_teacher(o, A);
  offloader_ = std::make_unique<StateOffloader>(A, stream_.get());
  offloader_->add("lp_params", &params_);
  offloader_->add(plan_.grad != DType::F32 ? "lp_grads" : "contiguous_grad_buffer", &grads_);
  if (plan_.has_master) offloader_->add("hp_params", &master_);
  offloader_->add("optim_states.exp_avg", &m_);
  offloader_->add("optim_states.exp_avg_sq", &v_);
  if (plan_.compensation) offloader_->add("optim_states.compensation", &comp_);
  if (c.zero_optimization.offload_optimizer.device != OffloadTarget::None) {
    // DeepSpeed's NVMe optimizer offload swaps the optimizer's partitions: the moments and the
    // fp32 master weights (when the layout has them), or the bf16 master's compensation. The bf16
    // params and the gradients stay.
    std::vector<std::pair<std::string, Buffer*>> swapped{{"optim_states.exp_avg", &m_}, {"optim_states.exp_avg_sq", &v_}};
    if (plan_.has_master) swapped.emplace_back("hp_params", &master_);
    if (plan_.compensation) swapped.emplace_back("optim_states.compensation", &comp_);
    swap_ = std::make_unique<OptimizerSwap>(c, A, stream_.get(), std::move(swapped));
    swap_->swap_out(/*non_blocking=*/false);  // off the device from the start
    std::cout << "[Rank 0] " << swap_->describe() << std::endl;
  }
  stream_.synchronize();
}

// Mixture-of-Students: the teacher's weights uploaded as bf16 (the host copy stays the caller's and
// goes when its last pointer does), its forward-only model at the student's micro-batch shape.
void GpuEngine::attach_teacher(const BackendOptions& o, CachingAllocator& A) {
  const Teacher& t = *o.teacher;
  CUTRAIN_CHECK(o.dims.arch != model::Arch::Bert && t.dims.arch != model::Arch::Bert,
                "gpu engine: distillation of BERT's masked-LM head is not built");
  CUTRAIN_CHECK(t.dims.vocab == o.dims.vocab, "gpu engine: the teacher's vocab_size ", t.dims.vocab,
                " is not the student's ", o.dims.vocab);
  teacher_table_ = std::make_unique<model::TransformerParams>(t.dims);
  CUTRAIN_CHECK(t.params.size() == teacher_table_->flat_size(), "gpu engine: the teacher's ", t.params.size(),
                " parameters do not fit its shape's ", teacher_table_->flat_size());
  teacher_params_ = Buffer(A, t.params.size() * 2, stream_);
  upload(teacher_params_, DType::BF16, t.params, stream_);
  teacher_words_ = Buffer(A, 4 * sizeof(float), stream_);
  kd_d_ = Buffer(A, std::size_t(accum_) * sizeof(float), stream_);
  kd_h_.assign(std::size_t(accum_), 0.f);
  teacher_model_ = std::make_unique<model::GpuTransformer>(*teacher_table_, o.batch, o.seq, false, t.causal, A);
  opt_.teacher.reset();
  graph_after_teacher_ = opt_.cuda_graph;
  if (opt_.cuda_graph) {  // the teacher's forward (a MoE teacher syncs) and the stop step change the sequence
    opt_.cuda_graph = false;
    describe_ += ", eager steps while distilling (the teacher's forward beside each micro-batch)";
  }
  stream_.synchronize();  // the upload read the host copy
}

void GpuEngine::release_teacher() {
  stream_.synchronize();
  model_->set_distillation(nullptr);
  teacher_model_.reset();
  teacher_table_.reset();
  teacher_params_.reset();
  teacher_words_.reset();
  kd_d_.reset();
  device_allocator().empty_cache();  // the teacher's segments back to the device
  opt_.cuda_graph = graph_after_teacher_;  // the LM-only steps replay a graph again where they can
}

GpuEngine::~GpuEngine() {
  graphs_.clear();
  cudaStreamSynchronize(stream_);
  cudaFreeHost(tokens_h_);
  cudaFreeHost(labels_h_);
  cudaFreeHost(flags_h_);
  if (step_h_) cudaFreeHost(step_h_);
  if (scale_h_) cudaFreeHost(scale_h_);
  if (moe_seeds_h_) cudaFreeHost(moe_seeds_h_);
  if (drop_idx_h_) cudaFreeHost(drop_idx_h_);
}

std::unique_ptr<model::GpuModel> GpuEngine::make_model() const {
  return model::make_gpu_transformer(plan_.param, table_, opt_.batch, opt_.seq, opt_.activation_checkpointing,
                                     opt_.causal, device_allocator(), opt_.recompute_gelu, drop_layers_,
                                     opt_.max_predictions, ep_comm_.get(), cap_, opt_.deterministic_attention);
}

// Above one rank: the grid's group (setup_tensor_grid) attached to the model. Degree 1: the slice's
// checks, then the blocks' all-reduces over a one-rank group.
void GpuEngine::setup_tensor_parallel() {
  const std::string& flag = opt_.tensor_parallel_flag;
  if (tp_slice_.size > 1) {
    setup_tp_norm();
    tp_group_ = std::make_unique<parallel::CommTpDeviceGroup>(tp_comm_);
    model_->set_tensor_parallel(tp_group_.get(), tp_slice_);
    std::cout << "[Rank " << world_->rank() << "] " << parallel::describe_tp_slice(tp_slice_) << " over an "
              << tp_comm_->backend_name() << " group of " << tp_comm_->world_size() << ": per micro-batch "
              << model_->tp_forward_all_reduces() << " forward and " << model_->tp_backward_all_reduces()
              << " backward all-reduces (the blocks', the vocabulary-parallel embedding's, loss's and head's)"
              << std::endl;
    return;
  }
  const model::TpSlice slice = parallel::make_tp_slice(table_.dims(), 1, 0, flag);
  tp_comm_ = opt_.tp_comm;
  if (!tp_comm_) {
    CUTRAIN_CHECK(comm::nccl_available(), "train: ", flag, " 1 on the GPU engine reduces over a one-rank NCCL ",
                  "communicator: expected a build with NCCL, found one without");
    int device = 0;
    CUTRAIN_CUDA_CHECK(cudaGetDevice(&device));
    tp_comm_ = std::shared_ptr<comm::Communicator>(comm::Communicator::create(comm::LaunchEnv{}, device));
  }
  CUTRAIN_CHECK(tp_comm_->world_size() == 1, "train: ", flag, " 1: expected a tensor-parallel group of one rank, found ",
                tp_comm_->world_size());
  tp_group_ = std::make_unique<parallel::CommTpDeviceGroup>(tp_comm_);
  tp_slice_ = slice;
  model_->set_tensor_parallel(tp_group_.get(), tp_slice_);
  describe_ += ", tensor parallel degree 1 over " + std::string(tp_comm_->backend_name());
  std::cout << "[Rank " << (comm_ ? comm_->rank() : 0) << "] " << parallel::describe_tp_slice(slice) << " over the "
            << tp_comm_->backend_name() << " communicator (world 1): per micro-batch " << model_->tp_forward_all_reduces()
            << " forward and " << model_->tp_backward_all_reduces()
            << " backward block all-reduces (bf16, in place); the vocabulary-parallel embedding's and loss's reductions "
               "are identities at degree 1 and not issued"
            << std::endl;
}

// The step through the pipeline's program: one stage (the engine's model), every stage in this
// process, or this rank's stage of a pipeline over ranks.
void GpuEngine::setup_pipeline() {
  CUTRAIN_CHECK(opt_.pipeline_stages <= 1 || over_ranks_, "train: --pipeline_parallel_size ", opt_.pipeline_stages,
                " on the GPU engine: expected the pipeline over ranks");
  const int P = over_ranks_ ? opt_.pipeline_stages : std::max(1, opt_.stages_in_process);
  CUTRAIN_CHECK(!opt_.teacher, "train: the pipeline's program on the GPU engine with --mos: the teacher's forward "
                "runs in the plain micro-batch loop; expected one of them");
  CUTRAIN_CHECK(cap_ == std::size_t(opt_.batch) * opt_.seq, "train: the pipeline's program on the GPU engine with a "
                "sequence-length curriculum: the stages' models keep the run's B x S; expected one of them");
  CUTRAIN_CHECK(!ep_comm_, "train: the pipeline's program on the GPU engine with --moe_expert_parallel_size: "
                "expected one of them");
  CUTRAIN_CHECK(P == 1 || !sharded_, "train: --pipeline_stages_in_process ", P,
                " with zero_optimization.stage 3 over a communicator: stage 3's gathers follow the whole model's unit "
                "order; expected stage 0, 1 or 2 (DeepSpeed's pipeline takes ZeRO-1)");
  const std::vector<parallel::PipelineLayer> layers = parallel::pipeline_layers(table_);
  const parallel::PipelinePlan plan = parallel::make_pipeline_plan(
      layers, parallel::parse_partition_method(opt_.partition_method, "--partition_method"), P, accum_);
  if (over_ranks_) {
    pipeline_ = std::make_unique<GpuPipeline>(table_, plan, pp_comm_, model_.get(), [this] { return make_model(); });
    // Layer i of the sequence is parameter unit i: the stage's units are one flat range.
    const auto& units = table_.units();
    stage_range_ = {units.at(std::size_t(pipeline_->first_layer())).begin,
                    units.at(std::size_t(pipeline_->end_layer() - 1)).end};
    sumsq_ = Buffer(device_allocator(), sizeof(double), stream_);
  } else {
    pipeline_ = std::make_unique<GpuPipeline>(table_, plan, model_.get(), [this] { return make_model(); });
  }
  for (model::GpuModel* m : pipeline_->models())
    if (m != model_.get() && tp_group_) m->set_tensor_parallel(tp_group_.get(), tp_slice_);
  const int rank = world_ ? world_->rank() : comm_ ? comm_->rank() : 0;  // world_: tensor parallelism's world
  if (over_ranks_) {
    describe_ += ", pipeline stage " + std::to_string(pp_comm_->rank()) + " of " + std::to_string(P) + " over NCCL";
    if (dp_comm_->world_size() > 1)
      describe_ += " (" + std::to_string(dp_comm_->world_size()) + " data-parallel replicas per stage)";
    std::cout << "[Rank " << rank << "] " << pipeline_->describe(layers) << "; replica " << dp_comm_->rank() << " of "
              << dp_comm_->world_size() << "; flat [" << stage_range_.begin << ", " << stage_range_.end
              << ") its parameters (the flat buffers stay whole on every rank)" << std::endl;
    return;
  }
  describe_ += P == 1 ? ", pipeline degree 1" : ", " + std::to_string(P) + " pipeline stages in this process";
  std::cout << "[Rank " << rank << "] " << pipeline_->describe(layers) << std::endl;
}

void GpuEngine::stage_batch(const std::int32_t* tokens, const std::int32_t* labels) {
  // The previous step's copies finished (each step ends with a sync), so the staging is free.
  // Micro-batch a (rows_ x seq_ tokens) at the start of its slot a x cap_.
  const std::size_t micro = std::size_t(rows_) * seq_;
  for (int a = 0; a < accum_; ++a) {
    std::memcpy(tokens_h_ + a * cap_, tokens + a * micro, micro * 4);
    std::memcpy(labels_h_ + a * cap_, labels + a * micro, micro * 4);
  }
}

void GpuEngine::set_seq_shape(int rows, int seq) {
  CUTRAIN_CHECK(rows > 0 && seq > 0 && seq <= opt_.seq && std::size_t(rows) * seq <= cap_, "gpu engine: micro-batch ",
                rows, " x ", seq, " outside the run's sequence length ", opt_.seq, " and its ", cap_,
                " tokens per micro-batch (BackendOptions::max_tokens)");
  CUTRAIN_CHECK(plan_.param != DType::F16 || (rows == opt_.batch && seq == opt_.seq), "gpu engine: micro-batch ",
                rows, " x ", seq, " with fp16.enabled: a sequence-length curriculum (or BERT's padding to the longest "
                "sequence) is not supported in fp16 by the GPU engine; use bf16.enabled");
  model_->set_shape(rows, seq);  // the model's own checks (architecture, scratch) now, before a step
  rows_ = rows;
  seq_ = seq;
}

// BERT's dropout step (1-based optimizer steps; the previous step's copy finished with its sync).
void GpuEngine::stage_step(int step) {
  if (!step_h_) return;
  *step_h_ = std::uint32_t(step);
  model_->set_dropout(opt_.seed, std::uint32_t(step), step_d_.as<std::uint32_t>());
}

// random-LTD's selection of every micro-batch of `step` (1-based) at the current rows x seq into
// `d` (host memory, packed per micro-batch), with the kept count and the layer tokens.
void GpuEngine::draw_drop(int step, DropDraw& d) {
  d.step = step;
  d.rows = rows_;
  d.seq = seq_;
  d.kept = 0;
  d.layer_tokens = 0;
  d.per_micro = 0;
  for (int a = 0; a < accum_; ++a) {
    const model::TokenDropPlan& plan = ltd_->draw(step, a, rows_, seq_);
    if (a == 0) {
      d.kept = plan.active() ? plan.kept : 0;
      d.per_micro = plan.indices.size();
      d.indices.resize(std::size_t(accum_) * d.per_micro);
    }
    std::copy(plan.indices.begin(), plan.indices.end(), d.indices.begin() + std::ptrdiff_t(a * d.per_micro));
    d.layer_tokens += plan.layer_tokens(table_.dims().layers);
  }
}

// The MoE gates' noise seeds of the step the model was set to (set_moe_step), one per micro-batch
// (the previous step's copy finished with its sync). Numbered in the global batch (the rank's
// micro-batches after the lower ranks'; MoE runs data-parallel only), as the CPU backend's, so a
// world of W ranks draws the single process's noise and random token selection keys.
void GpuEngine::stage_moe_seeds() {
  if (!moe_seeds_h_) return;
  const int first = (comm_ ? comm_->rank() : 0) * accum_;
  for (int a = 0; a < accum_; ++a) moe_seeds_h_[a] = model_->moe_forward_seed_of(first + a);
}

// random-LTD's selection of every micro-batch of `step` (1-based; 0: no drop) into the pinned
// staging, and the layer tokens it makes the step process. The draw was made during the previous
// step's device work (prefetch_drop) when that step had this shape; otherwise it is made here.
void GpuEngine::stage_drop(int step) {
  kept_ = 0;
  step_layer_tokens_ = std::int64_t(accum_) * rows_ * seq_ * table_.dims().layers;
  if (step <= 0 || !ltd_->active()) return;
  if (next_drop_.step != step || next_drop_.rows != rows_ || next_drop_.seq != seq_) draw_drop(step, next_drop_);
  kept_ = next_drop_.kept;
  step_layer_tokens_ = next_drop_.layer_tokens;
  for (int a = 0; kept_ > 0 && a < accum_; ++a)
    std::copy_n(next_drop_.indices.begin() + std::ptrdiff_t(a * next_drop_.per_micro), next_drop_.per_micro,
                drop_idx_h_ + a * drop_stride_);
  next_drop_.step = -1;
}

// The next step's draw at this step's shape, made on the host while the device runs this step
// (a curriculum that changes the length at the next step draws again in stage_drop).
void GpuEngine::prefetch_drop(int next_step) {
  if (ltd_->active() && next_step > 0) draw_drop(next_step, next_drop_);
}

// H2D copies from the pinned staging, every micro-batch's forward/backward: the same pointers
// and shapes every step, so it can be captured once and replayed (random-LTD: the shapes follow
// the kept count, so a graph holds for one kept count; the indices are staged data).
void GpuEngine::enqueue_forward_backward(bool step) {
  const std::size_t per_micro = cap_;  // each micro-batch's slot (its first rows_ x seq_ tokens used)
  model_->set_shape(rows_, seq_);
  {
    TimedRegion r("h2d", stream_, 0, 2.0 * accum_ * per_micro * 4);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(tokens_d_.get(), tokens_h_, accum_ * per_micro * 4, cudaMemcpyHostToDevice, stream_));
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(labels_d_.get(), labels_h_, accum_ * per_micro * 4, cudaMemcpyHostToDevice, stream_));
    if (drop_idx_h_ && kept_ > 0) {  // up to the last micro-batch's rows x kept per dropping block
      const std::size_t last = drop_layers_.size() * std::size_t(rows_) * std::size_t(kept_);
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(drop_idx_d_.get(), drop_idx_h_, ((accum_ - 1) * drop_stride_ + last) * 4,
                                         cudaMemcpyHostToDevice, stream_));
    }
    if (step_h_)
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(step_d_.get(), step_h_, sizeof(std::uint32_t), cudaMemcpyHostToDevice, stream_));
    if (scale_h_)
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(scale_d_.get(), scale_h_, sizeof(float), cudaMemcpyHostToDevice, stream_));
    if (moe_seeds_h_)
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(moe_seeds_d_.get(), moe_seeds_h_, accum_ * sizeof(std::uint64_t),
                                         cudaMemcpyHostToDevice, stream_));
  }
  float* flags = as_f32(flags_d_);
  int* status = reinterpret_cast<int*>(flags + accum_ + 3);
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(status, 0, 2 * accum_ * sizeof(int), stream_));
  // Stage 3: one pass over every micro-batch, so the prefetch runs across micro-batch boundaries.
  // With overlap_comm each unit's gradients are reduce-scattered during the backward of the last
  // micro-batch, as soon as they are final (else enqueue_reduce does it after backward).
  model::FlatParams flat(table_, params_.get(), plan_.param);
  parallel::ShardedParams::OverlapReduce overlap{grads_.get(), grad_shard_.get(), plan_.grad, accum_};
  if (sharded_)
    sharded_->begin_pass(params_.as<bf16>(), train_order_,
                         step && cfg_.zero_optimization.overlap_comm ? &overlap : nullptr);
  model::ParamAccess& P = sharded_ ? static_cast<model::ParamAccess&>(*sharded_) : flat;
  auto drop_of = [&](int a) { return drop_idx_h_ ? drop_idx_d_.as<std::int32_t>() + a * drop_stride_ : nullptr; };
  if (pipeline_) {
    // The pipeline's program (1F1B per stage over the micro-batches); at one stage the loop below's calls.
    pipeline_->enqueue(stream_, P, grads_.get(), plan_.grad, tokens_d_.as<std::int32_t>(),
                       labels_d_.as<std::int32_t>(), per_micro, 1.f / float(accum_), flags, status,
                       [&](model::GpuModel& m, int a) { m.set_token_drop(kept_, drop_of(a)); });
  }
  for (int a = 0; !pipeline_ && a < accum_; ++a) {
    const std::int32_t* tok = tokens_d_.as<std::int32_t>() + a * per_micro;
    const std::int32_t* lab = labels_d_.as<std::int32_t>() + a * per_micro;
    if (distill_now_) {
      // The teacher's forward on the micro-batch (evaluation mode: its eval capacity factor, no
      // noise), its logits handed to the student's loss, which writes its gradient over them.
      TimedRegion rt("teacher", stream_);
      float* words = as_f32(teacher_words_);
      model::FlatParams tp(*teacher_table_, teacher_params_.as<bf16>());
      teacher_model_->forward_loss(stream_, tp, tok, lab, words, reinterpret_cast<int*>(words + 1));
      model::GpuTransformer::Distillation d;
      d.teacher_logits = teacher_model_->logits();
      d.ld_t = teacher_table_->dims().vocab_rows();
      d.temperature = float(opt_.distill.kd_temp);
      d.beta = float(opt_.distill.kd_beta_ce);
      d.alpha = float(opt_.distill.kd_alpha_ce);
      d.d_kd_loss = as_f32(kd_d_) + a;
      model_->set_distillation(&d);
    }
    model_->set_token_drop(kept_, drop_of(a));
    model_->forward_backward(stream_, P, grads_.get(), plan_.grad, a > 0, tok, lab, 1.f / float(accum_), flags + a,
                             status + 2 * a, loss_scale_d());
    model_->set_distillation(nullptr);
  }
  if (sharded_) sharded_->end_pass(stream_);
}

void GpuEngine::enqueue_reduce() {
  if (over_ranks_) {
    // The stage's gradients averaged over its replicas (ZeRO stage 0's all-reduce, its range only;
    // at one replica the identity, still issued).
    TimedRegion rc("comm", stream_);
    TimedRegion r("grad_reduce", stream_);
    const std::size_t es = dtype_size(plan_.grad);
    dp_comm_->all_reduce(static_cast<char*>(grads_.get()) + stage_range_.begin * es, stage_range_.size(), plan_.grad,
                         comm::ReduceOp::Avg, stream_);
    return;
  }
  if (!zero_comm_) return;
  TimedRegion rc("comm", stream_);  // the communication phase: step/comm/...
  TimedRegion r("grad_reduce", stream_);
  if (sharded_) {
    // overlap_comm: already reduced during the backward (enqueue_forward_backward).
    if (!cfg_.zero_optimization.overlap_comm)
      sharded_->reduce_grads(stream_, grads_.get(), grad_shard_.get(), plan_.grad);
  } else {
    zero_comm_->reduce_grads(stream_, grads_.get());
  }
}

void GpuEngine::enqueue_norm() {
  float* flags = as_f32(flags_d_);
  const std::size_t count =
      over_ranks_ ? stage_range_.size() : zero_.sharded() ? layout_.shard_elems : zero_.norm_range().size();
  const model::cost::Cost c = model::cost::grad_norm(count, dtype_size(plan_.grad));
  TimedRegion r("grad_norm", stream_, c.flops, c.bytes);
  if (over_ranks_) {
    // The stages' sums of squares summed over the pipeline group (every replica holds the same
    // reduced gradients): the same norm, clip coefficient and skip flag on every rank.
    const std::size_t es = dtype_size(plan_.grad);
    kernels::grad_sumsq(stream_, static_cast<const char*>(grads_.get()) + stage_range_.begin * es, plan_.grad,
                        stage_range_.size(), sumsq_.as<double>(), norm_scratch_.get());
    pp_comm_->all_reduce_sum_f64(sumsq_.as<double>(), 1, stream_);
    kernels::grad_norm_from_sumsq(stream_, sumsq_.as<double>(), cfg_.gradient_clipping, flags + accum_,
                                  flags + accum_ + 1, reinterpret_cast<int*>(flags + accum_ + 2), loss_scale_d());
    return;
  }
  if (tp_slice_.size > 1) {  // over the tensor-parallel group, each element once (train/engine_tp.cpp)
    enqueue_tp_norm(flags + accum_, flags + accum_ + 1, reinterpret_cast<int*>(flags + accum_ + 2));
    return;
  }
  if (sharded_) {
    // The shard's padding is 0 (never written, reduced from zeros): it adds nothing to the sum.
    zero_comm_->global_norm_of_shard(stream_, grad_shard_.get(), count, cfg_.gradient_clipping, flags + accum_,
                                     flags + accum_ + 1, reinterpret_cast<int*>(flags + accum_ + 2),
                                     norm_scratch_.get(), loss_scale_d());
    return;
  }
  if (zero_comm_) {
    // Global over the ranks: the same norm, clip coefficient and skip flag on every rank.
    zero_comm_->global_norm(stream_, grads_.get(), cfg_.gradient_clipping, flags + accum_, flags + accum_ + 1,
                            reinterpret_cast<int*>(flags + accum_ + 2), norm_scratch_.get(), loss_scale_d());
    return;
  }
  // fp16: the gradients carry the loss scale; the norm is unscaled, the clip coefficient the
  // optimizer reads carries 1 / scale, and an overflow (inf/NaN) raises the skip flag.
  kernels::grad_norm_clip(stream_, grads_.get(), plan_.grad, n_, cfg_.gradient_clipping, flags + accum_,
                          flags + accum_ + 1, reinterpret_cast<int*>(flags + accum_ + 2), norm_scratch_.get(),
                          loss_scale_d());
}

void GpuEngine::read_flags() {
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(flags_h_, flags_d_.get(), flag_words_ * 4, cudaMemcpyDeviceToHost, stream_));
  stream_.synchronize();
  const int* status = reinterpret_cast<const int*>(flags_h_ + accum_ + 3);
  const std::size_t per_micro = std::size_t(model_->rows()) * model_->seq();
  for (int a = 0; a < accum_; ++a) {
    CUTRAIN_CHECK(status[2 * a] == 0, "train: token id at micro-batch ", a, " position ", status[2 * a] - 1,
                  " is outside [0, vocab_size=", table_.dims().vocab, ") (", per_micro, " tokens per micro-batch)");
    CUTRAIN_CHECK(status[2 * a + 1] >= 0, "train: sequence ", -status[2 * a + 1] - 1, " of micro-batch ", a,
                  " has more labelled positions (labels != -100) than max_predictions_per_seq=", model_->mlm_slots(),
                  ", the masked-LM head's slots per sequence; raise --max_predictions_per_seq or mask fewer");
    CUTRAIN_CHECK(status[2 * a + 1] == 0, "train: label at micro-batch ", a, " row ", status[2 * a + 1] - 1,
                  " is outside [0, vocab_size=", table_.dims().vocab, ")");
  }
}

std::vector<std::string> GpuEngine::offloadable_states() const {
  std::vector<std::string> out{"optim_states"};
  if (plan_.has_master) out.push_back("hp_params");
  out.push_back("lp_params");
  out.push_back(plan_.grad != DType::F32 ? "lp_grads" : "contiguous_grad_buffer");
  return out;
}

void GpuEngine::offload_states(const std::vector<std::string>& include, OffloadDevice device, bool pin_memory,
                               bool non_blocking, const std::string& nvme_path) {
  const std::vector<std::string> valid = offloadable_states();
  if (swap_) swap_->make_resident();  // the optimizer swap gives its states back first
  std::vector<std::string> names;
  for (const auto& g : include.empty() ? valid : include) {
    if (std::find(valid.begin(), valid.end(), g) == valid.end()) {
      std::string list;
      for (const auto& v : valid) list += (list.empty() ? "" : ", ") + v;
      CUTRAIN_FAIL("offload_states: '", g, "' is not a state of the ", plan_.name(), " layout; valid: ", list);
    }
    if (g == "optim_states") {
      names.push_back("optim_states.exp_avg");
      names.push_back("optim_states.exp_avg_sq");
      if (plan_.compensation) names.push_back("optim_states.compensation");
    } else {
      names.push_back(g);
    }
  }
  OffloadOptions o;
  o.device = device;
  o.pin_memory = pin_memory;
  o.non_blocking = non_blocking;
  o.nvme_path = nvme_path;
  offloader_->offload(names, o);
}

void GpuEngine::reload_states(bool non_blocking) { offloader_->reload(non_blocking); }

void GpuEngine::ensure_state() const {
  if (offloader_) offloader_->ensure_resident(stream_.get());  // null only during construction
}

double GpuEngine::forward_backward(const std::int32_t* tokens, const std::int32_t* labels, int drop_step) {
  ensure_state();
  distill_now_ = teacher_model_ != nullptr;  // the helper distills while a teacher is held
  stage_batch(tokens, labels);
  stage_drop(drop_step);
  stage_step(drop_step);
  stage_moe_seeds();
  enqueue_forward_backward(/*step=*/false);
  if (table_.dims().moe.any()) model_->stage_moe_stats(stream_);  // read with the flags' sync
  read_flags();
  if (table_.dims().moe.any()) model_->collect_moe_stats();
  double loss = 0;
  for (int a = 0; a < accum_; ++a) loss += flags_h_[a] / accum_;
  return loss;
}

StepStats GpuEngine::step(const std::int32_t* tokens, const std::int32_t* labels, int step, float lr) {
  TimedRegion r("step", stream_);
  // Staged distillation: the teacher's steps are [0, stop_kd_step); at the first step past them
  // it is freed for good.
  const std::optional<int>& stop = opt_.distill.stop_kd_step;
  distill_now_ = teacher_model_ && (!stop || step - 1 < *stop);
  if (teacher_model_ && !distill_now_) release_teacher();
  {
    TimedRegion ro("offload", stream_);  // a pending reload of offloaded states lands here
    ensure_state();
  }
  if (swap_) swap_->begin_step();  // pipeline_read: the reload runs during forward/backward
  if (offloader_->generation() != graph_generation_) {
    // A reload reallocated the states: the captured graphs hold their old addresses.
    graphs_.clear();  // each shape: one eager step, then a new capture (as after release_workspace)
    graph_generation_ = offloader_->generation();
  }
  stage_batch(tokens, labels);
  stage_drop(step);
  stage_step(step);
  model_->set_moe_step(opt_.seed, step);  // the MoE gates' noise: a function of the step
  stage_moe_seeds();
  // One graph per step shape (random-LTD's kept count, the curriculum's rows x seq): a shape's
  // first step runs eagerly (cuBLASLt plans, first allocation of activations), its second is
  // captured and every later one replays the graph (train/step_graphs.h).
  // --timing_report and --profile_steps switch replay off for the steps they measure.
  last_shape_ = StepShape{kept_, rows_, seq_};
  model_->set_shape(rows_, seq_);  // the host's view too (a replay launches no model code; eval_loss sets B x S)
  graphs_.run(stream_, last_shape_, opt_.cuda_graph, graph_replay_allowed(), [this] {
    enqueue_forward_backward();
    enqueue_reduce();
    enqueue_norm();
  });
  // The optimizer launch stays outside the graph: lr and the bias-correction step change every step.
  kernels::AdamParams p;
  p.lr = lr;
  p.beta1 = cfg_.optimizer.beta1;
  p.beta2 = cfg_.optimizer.beta2;
  p.eps = cfg_.optimizer.eps;
  p.weight_decay = cfg_.optimizer.weight_decay;
  p.decoupled = cfg_.optimizer.adam_w_mode;
  p.step = step;
  p.grad_scale = 1.f;
  p.stochastic_rounding = cfg_.bf16.stochastic_rounding;
  p.seed = opt_.seed;
  float* flags = as_f32(flags_d_);
  if (swap_) {
    TimedRegion ro("offload", stream_);
    swap_->before_optimizer();  // the optimizer launch waits for the reload (or does it, blocking)
  }
  {
    // The flat range this rank updates: all of it, or its ZeRO partition (master and moments are
    // then partition-sized buffers, indexed from 0). Stage 3: the whole shard, every buffer
    // shard-sized (the reduced gradients in grad_shard_).
    // Pipeline over ranks: the stage's range of the whole buffers (state indexed from 0).
    const parallel::Range sr = over_ranks_      ? stage_range_
                               : zero_.sharded() ? parallel::Range{0, layout_.shard_elems}
                                                 : zero_.state_range();
    const std::size_t base = over_ranks_ ? 0 : sr.begin;  // the state buffers' first flat element
    const std::size_t gs = dtype_size(plan_.grad);
    const void* g = zero_.sharded() ? grad_shard_.get() : static_cast<const char*>(grads_.get()) + base * gs;
    const bool lamb = cfg_.optimizer.type == OptimizerType::Lamb;
    const model::cost::Cost c =
        lamb ? model::cost::lamb_step(sr.size(), gs, dtype_size(plan_.moment), plan_.has_master, plan_.compensation)
             : model::cost::adam_step(sr.size(), gs, dtype_size(plan_.moment), plan_.has_master, plan_.compensation);
    TimedRegion ro("optimizer", stream_, c.flops, c.bytes);
    if (lamb) {
      // One launch pair over the model's tensors (ZeRO stage 0: the whole flat buffer here).
      kernels::LambParams lp = lamb_params(cfg_.optimizer, lr, step);
      lp.stochastic_rounding = cfg_.bf16.stochastic_rounding;
      lp.seed = opt_.seed;
      if (plan_.param == DType::F16)
        kernels::lamb_step(stream_, plan_.layout, lp, lamb_, params_.as<f16>(), g, plan_.grad, as_f32(master_), m_.get(),
                           v_.get(), flags + accum_ + 1, reinterpret_cast<const int*>(flags + accum_ + 2));
      else
        kernels::lamb_step(stream_, plan_.layout, lp, lamb_, params_.as<bf16>(), g, plan_.grad,
                           plan_.has_master ? as_f32(master_) : nullptr, m_.get(), v_.get(), flags + accum_ + 1,
                           reinterpret_cast<const int*>(flags + accum_ + 2),
                           plan_.compensation ? comp_.as<bf16>() : nullptr);
    }
    // One launch per decay run (model/transformer_params.h): a single one for the seed model;
    // GPT-2 and BERT decay their matrices and embeddings only. The last run also covers the
    // partition's padding past n_. Stage 3: one launch per run of its shard (shard_launches_;
    // the shard's padding, never written, is left alone).
    const std::size_t ms = dtype_size(plan_.moment);
    const std::size_t launches = lamb ? 0 : zero_.sharded() ? shard_launches_.size() : decay_runs_.size();
    for (std::size_t i = 0; i < launches; ++i) {
      std::size_t k = i, b = 0, e = 0;
      if (zero_.sharded()) {
        const parallel::ShardSegment& sg = shard_launches_[i];
        k = sg.run;
        b = sg.shard;
        e = sg.shard + sg.count;
      } else {
        const model::DecayRun& run = decay_runs_[k];
        b = std::max(run.begin, sr.begin);
        e = k + 1 == decay_runs_.size() ? sr.end : std::min(run.end, sr.end);
      }
      if (b >= e) continue;
      const std::size_t o = b - base;  // into this rank's (partition-indexed) state buffers
      p.weight_decay = decay_runs_[k].decay ? cfg_.optimizer.weight_decay : 0.f;
      // Stochastic rounding draws by (seed, step, index within the launch): another seed per
      // launch, so launches do not repeat each other's bits (launch 0 keeps the seed of the single
      // launch; stage 3 at world size 1 launches exactly the runs, so its seeds are stage 0's).
      p.seed = opt_.seed + i * 0x9E3779B97F4A7C15ull;
      if (plan_.param == DType::F16)  // fp16 always keeps the fp32 master (no compensation)
        kernels::adam_step(stream_, plan_.layout, p, params_.as<f16>() + b, static_cast<const char*>(g) + o * gs,
                           plan_.grad, as_f32(master_) + o, static_cast<char*>(m_.get()) + o * ms,
                           static_cast<char*>(v_.get()) + o * ms, e - b, flags + accum_ + 1,
                           reinterpret_cast<const int*>(flags + accum_ + 2));
      else
        kernels::adam_step(stream_, plan_.layout, p, params_.as<bf16>() + b, static_cast<const char*>(g) + o * gs,
                           plan_.grad, plan_.has_master ? as_f32(master_) + o : nullptr,
                           static_cast<char*>(m_.get()) + o * ms, static_cast<char*>(v_.get()) + o * ms, e - b,
                           flags + accum_ + 1, reinterpret_cast<const int*>(flags + accum_ + 2),
                           plan_.compensation ? comp_.as<bf16>() + o : nullptr);
    }
  }
  if (sharded_) {
    // Params stay sharded: only the persistent units are gathered again.
    TimedRegion rc("comm", stream_);
    TimedRegion rg("param_gather", stream_);
    sharded_->refresh_persistent(stream_, params_.as<bf16>());
  } else if (zero_comm_) {
    TimedRegion rc("comm", stream_);
    TimedRegion rg("param_gather", stream_);
    zero_comm_->gather_params(stream_, params_.get(), plan_.param);  // no-op at stage 0
  }
  if (swap_) swap_->after_optimizer();  // pipeline_write: the write-out overlaps the rest of the step
  prefetch_drop(step + 1);  // host work while the device runs this step
  // The MoE figures (merged on the device during the step) come back with the flags' one sync.
  if (table_.dims().moe.any()) model_->stage_moe_stats(stream_);
  read_flags();
  StepStats st;
  for (int a = 0; a < accum_; ++a) st.loss += flags_h_[a] / accum_;
  if (table_.dims().moe.any()) st.moe = model_->collect_moe_stats();
  st.layer_tokens = step_layer_tokens_;
  st.ce_loss = st.loss;
  st.distilled = distill_now_;
  if (distill_now_) {  // read_flags synchronized the stream
    CUTRAIN_CUDA_CHECK(cudaMemcpy(kd_h_.data(), kd_d_.get(), kd_h_.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (float k : kd_h_) st.kd_loss += opt_.distill.kd_beta_ce * double(k) / accum_;
  }
  st.grad_norm = flags_h_[accum_];
  int nonfinite = 0;
  std::memcpy(&nonfinite, flags_h_ + accum_ + 2, 4);
  st.skipped = nonfinite != 0;
  if (scaler_) update_loss_scale(st);
  return st;
}

// fp16, after the step's single sync: the scaler sees whether the step overflowed (the optimizer
// then changed nothing) and the next step's scale is staged (the loop logs an overflow from
// StepStats); an overflow at fp16.min_loss_scale with the hysteresis used up stops the run.
void GpuEngine::update_loss_scale(StepStats& st) {
  st.loss_scale = scaler_->loss_scale();
  const LossScaleUpdate u = scaler_->update(st.skipped);  // LossScaleError at min_loss_scale
  *scale_h_ = static_cast<float>(u.scale);  // copied to the device by the next step's staging
  st.next_loss_scale = u.scale;
}

std::optional<LossScalerState> GpuEngine::loss_scaler_state() const {
  if (!scaler_) return std::nullopt;
  return scaler_->state();
}

// A resumed fp16 run: a dynamic scaler continues from the checkpoint's scale, iteration count and
// hysteresis (the hysteresis capped at this run's fp16.hysteresis); a static one keeps the
// config's loss_scale.
bool GpuEngine::restore_loss_scaler(const LossScalerState& state) {
  if (!scaler_ || !scaler_->dynamic()) return false;
  LossScalerState s = state;
  s.hysteresis = std::clamp(s.hysteresis, 1, scaler_->options().delayed_shift);
  scaler_->restore(s);
  *scale_h_ = static_cast<float>(scaler_->loss_scale());  // copied to the device by the next step's staging
  return true;
}

MemoryStats GpuEngine::memory() const {
  const AllocatorStats s = device_allocator().stats();
  return {s.allocated_bytes.current, s.reserved_bytes.current, s.allocated_bytes.peak};
}

void GpuEngine::reset_peak() { device_allocator().reset_peak(); }

void GpuEngine::release_workspace() {
  stream_.synchronize();
  // The graphs hold the workspace's addresses: they go too, and each shape starts eager again.
  graphs_.clear();
  model_->release_workspace();
  if (pipeline_) pipeline_->release_workspace();
}

namespace {
std::vector<float> download(const Buffer& b, DType t, std::size_t n) {
  std::vector<float> out(n);
  if (t == DType::F32) {
    CUTRAIN_CUDA_CHECK(cudaMemcpy(out.data(), b.get(), n * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<std::uint16_t> h(n);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), n * 2, cudaMemcpyDeviceToHost));
    if (t == DType::F16)
      for (std::size_t i = 0; i < n; ++i) out[i] = to_float(reinterpret_cast<const f16*>(h.data())[i]);
    else
      for (std::size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(h[i]);
  }
  return out;
}
void upload(const Buffer& b, DType t, const float* v, std::size_t n, cudaStream_t s) {
  CUTRAIN_CHECK(n * dtype_size(t) <= b.bytes(), "gpu engine: upload of ", n, " elements overruns a buffer of ", b.bytes(),
                " bytes");
  if (n == 0) return;
  if (t == DType::F32) {
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(b.get(), v, n * 4, cudaMemcpyHostToDevice, s));
  } else {
    std::vector<std::uint16_t> h(n);
    if (t == DType::F16)
      for (std::size_t i = 0; i < n; ++i) h[i] = bits(to_f16(v[i]));
    else
      for (std::size_t i = 0; i < n; ++i) h[i] = f32_to_bf16_bits(v[i]);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(b.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice, s));
  }
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));  // h is about to go out of scope
}
}  // namespace

std::vector<float> GpuEngine::download_grads() const {
  ensure_state();
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (zero_.sharded()) {
    const std::vector<float> padded = download(grads_, plan_.grad, layout_.padded_elems);
    return layout_.flat_from_padded(padded.data());
  }
  return download(grads_, plan_.grad, n_);
}
void GpuEngine::poison_grads() {
  ensure_state();
  const std::size_t es = dtype_size(plan_.grad);
  for (const auto& t : table_.tensors()) {
    // Stage 3: the tensor's place in the padded layout (a tensor never spans two units).
    const std::size_t at = zero_.sharded() ? layout_.padded_of_flat(t.offset) : t.offset;
    CUTRAIN_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(grads_.get()) + at * es, 0xFF, t.count * es, stream_));
  }
}

std::vector<float> GpuEngine::download_params() const {
  ensure_state();
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (zero_.sharded()) return gather_sharded(params_, plan_.param);
  return download(params_, plan_.param, n_);
}

std::vector<float> GpuEngine::gather_sharded(const Buffer& shard, DType t) const {
  Buffer padded(device_allocator(), layout_.padded_elems * dtype_size(t), stream_);
  sharded_->gather_padded(stream_, shard.get(), padded.get(), t);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> p = download(padded, t, layout_.padded_elems);
  return layout_.flat_from_padded(p.data());
}

std::vector<float> GpuEngine::gather_stages(const Buffer& b, DType t) const {
  // This stage's range, zeros elsewhere, summed over the pipeline group: adding zeros is exact in
  // every dtype, so the sum is each stage's values (a collective of the group).
  const std::size_t es = dtype_size(t);
  Buffer mine(device_allocator(), n_ * es, stream_);
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(mine.get(), 0, n_ * es, stream_));
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(mine.get()) + stage_range_.begin * es,
                                     static_cast<const char*>(b.get()) + stage_range_.begin * es,
                                     stage_range_.size() * es, cudaMemcpyDeviceToDevice, stream_));
  pp_comm_->all_reduce(mine.get(), n_, t, comm::ReduceOp::Sum, stream_);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return download(mine, t, n_);
}

void GpuEngine::put_sharded(const Buffer& shard, DType t, const float* flat) {
  upload(shard, t, layout_.shard_from_flat(flat, zero_.rank), stream_);
}

HostState GpuEngine::save_state() const {
  ensure_state();
  if (swap_) swap_->make_resident();
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // Partitioned: every rank's partition gathered first (collective: all ranks save together).
  auto state = [&](const Buffer& b, DType t) {
    if (over_ranks_) return gather_stages(b, t);
    if (zero_.sharded()) return gather_sharded(b, t);
    if (!zero_.partitioned()) return download(b, t, n_);
    Buffer full(device_allocator(), zero_.part.padded_numel * dtype_size(t), stream_);
    zero_comm_->gather_state(stream_, b.get(), full.get(), t);
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return download(full, t, n_);
  };
  HostState s;
  s.params = over_ranks_      ? gather_stages(params_, plan_.param)
             : zero_.sharded() ? gather_sharded(params_, plan_.param)
                               : download(params_, plan_.param, n_);
  s.param_dtype = plan_.param;
  if (plan_.has_master) s.master = state(master_, DType::F32);
  if (plan_.compensation) s.compensation = state(comp_, DType::BF16);
  s.exp_avg = state(m_, plan_.moment);
  s.exp_avg_sq = state(v_, plan_.moment);
  s.moment_dtype = plan_.moment;
  if (swap_) swap_->swap_out(/*non_blocking=*/false);  // back where it lives between steps
  if (tp_slice_.size > 1)  // the whole model: the group's sum (collective over the group)
    for (std::vector<float>* v : {&s.params, &s.master, &s.compensation, &s.exp_avg, &s.exp_avg_sq}) tp_group_sum(*v);
  return s;
}

namespace {

SnapshotTensor& snapshot_part(StateSnapshot& s, DeviceRestore::Part p) {
  SnapshotTensor* parts[] = {&s.params, &s.master, &s.exp_avg, &s.exp_avg_sq, &s.compensation};
  return *parts[p];
}
const SnapshotTensor& snapshot_part(const StateSnapshot& s, DeviceRestore::Part p) {
  return snapshot_part(const_cast<StateSnapshot&>(s), p);
}

}  // namespace

std::vector<GpuEngine::StatePart> GpuEngine::state_parts() const {
  using P = DeviceRestore::Part;
  std::vector<StatePart> parts{{P::Params, &params_, plan_.param}};
  if (plan_.has_master) parts.push_back({P::Master, &master_, DType::F32});
  parts.push_back({P::ExpAvg, &m_, plan_.moment});
  parts.push_back({P::ExpAvgSq, &v_, plan_.moment});
  if (plan_.compensation) parts.push_back({P::Compensation, &comp_, DType::BF16});
  return parts;
}

void GpuEngine::snapshot_state(StateSnapshot& out) const {
  // Partitioned, sharded or swapped states are gathered (and converted) by save_state(); a whole
  // resident state is copied as it is, one device-to-host copy per buffer into pinned storage.
  if (zero_.partitioned() || zero_.sharded() || swap_ || over_ranks_ || tp_slice_.size > 1) {
    TrainBackend::snapshot_state(out);
    return;
  }
  ensure_state();
  out.pinned = true;
  for (int p = 0; p < 5; ++p) snapshot_part(out, static_cast<DeviceRestore::Part>(p)).clear();  // absent unless held
  for (const StatePart& sp : state_parts()) {
    void* dst = snapshot_part(out, sp.part).reserve(sp.dtype, n_, /*pinned=*/true);
    CUTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(dst, sp.buffer->get(), n_ * dtype_size(sp.dtype), cudaMemcpyDeviceToHost, stream_));
  }
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void GpuEngine::load_state(const HostState& s) {
  if (tp_slice_.size <= 1) return load_flat_state(s);
  // The whole model's state: this rank keeps its slices and the replicated tensors, zeros elsewhere.
  HostState mine = s;
  for (std::vector<float>* v : {&mine.params, &mine.master, &mine.compensation, &mine.exp_avg, &mine.exp_avg_sq})
    tp_mask_held(*v);
  load_flat_state(mine);
}

void GpuEngine::load_flat_state(const HostState& s) {
  CUTRAIN_CHECK(s.params.size() == n_ && s.exp_avg.size() == n_ && s.exp_avg_sq.size() == n_,
                "gpu engine: state of ", s.params.size(), " params does not fit the model's flat size ", n_);
  CUTRAIN_CHECK(!plan_.has_master || s.master.size() == n_, "gpu engine: the ", plan_.name(),
                " layout needs fp32 master weights of ", n_, " elements, the state has ", s.master.size());
  CUTRAIN_CHECK(!plan_.compensation || s.compensation.empty() || s.compensation.size() == n_, "gpu engine: the ",
                plan_.label(), " layout needs a compensation of ", n_, " elements, the state has ",
                s.compensation.size());
  // No compensation in the state (a checkpoint saved without one): it starts at zero.
  std::vector<float> zeros;
  if (plan_.compensation && s.compensation.empty()) zeros.assign(n_, 0.f);
  const std::vector<float>& comp = zeros.empty() ? s.compensation : zeros;
  ensure_state();
  if (swap_) swap_->make_resident();
  if (zero_.sharded()) {
    // This rank's shard of every state; the persistent units gathered again from the new params.
    put_sharded(params_, plan_.param, s.params.data());
    if (plan_.has_master) put_sharded(master_, DType::F32, s.master.data());
    if (plan_.compensation) put_sharded(comp_, DType::BF16, comp.data());
    put_sharded(m_, plan_.moment, s.exp_avg.data());
    put_sharded(v_, plan_.moment, s.exp_avg_sq.data());
    sharded_->refresh_persistent(stream_, params_.as<bf16>());
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (swap_) swap_->swap_out(/*non_blocking=*/false);
    return;
  }
  upload(params_, plan_.param, s.params, stream_);
  // This rank's partition of each optimizer state (all of it when not partitioned); padding 0.
  const parallel::Range r = zero_.state_range();
  const std::size_t real = r.begin < n_ ? std::min(r.end, n_) - r.begin : 0;
  auto put = [&](const Buffer& b, DType t, const std::vector<float>& v) {
    if (real < zero_.state_elems()) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(b.get(), 0, b.bytes(), stream_));
    upload(b, t, v.data() + std::min(r.begin, n_), real, stream_);
  };
  if (plan_.has_master) put(master_, DType::F32, s.master);
  if (plan_.compensation) put(comp_, DType::BF16, comp);
  put(m_, plan_.moment, s.exp_avg);
  put(v_, plan_.moment, s.exp_avg_sq);
  if (swap_) swap_->swap_out(/*non_blocking=*/false);
}

void GpuEngine::restore_snapshot(const StateSnapshot& s) {
  if (zero_.partitioned() || zero_.sharded() || swap_ || tp_slice_.size > 1) {
    TrainBackend::restore_snapshot(s);
    return;
  }
  CUTRAIN_CHECK(s.params.numel() == n_ && s.exp_avg.numel() == n_ && s.exp_avg_sq.numel() == n_, "gpu engine: state of ",
                s.params.numel(), " params does not fit the model's flat size ", n_);
  CUTRAIN_CHECK(!plan_.has_master || s.master.numel() == n_, "gpu engine: the ", plan_.name(),
                " layout needs fp32 master weights of ", n_, " elements, the state has ", s.master.numel());
  ensure_state();
  // A tensor in the buffer's dtype goes up as it is; another dtype (a checkpoint of another layout
  // or of the CPU backend) is converted on the host first.
  for (const StatePart& sp : state_parts()) {
    const SnapshotTensor& v = snapshot_part(s, sp.part);
    if (sp.part == DeviceRestore::Compensation && v.empty())  // a checkpoint without one: it starts at zero
      CUTRAIN_CUDA_CHECK(cudaMemsetAsync(sp.buffer->get(), 0, sp.buffer->bytes(), stream_));
    else if (v.dtype() == sp.dtype)
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(sp.buffer->get(), v.data(), v.bytes(), cudaMemcpyHostToDevice, stream_));
    else
      upload(*sp.buffer, sp.dtype, to_floats(v), stream_);
  }
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

namespace {

// Scratch buffers of the parts the engine holds; commit() copies them over the live ones.
class EngineRestore final : public DeviceRestore {
 public:
  struct Target {
    const Buffer* live = nullptr;
    Buffer scratch;
  };
  EngineRestore(std::array<Target, 5> t, std::size_t bytes_each[5], cudaStream_t stream)
      : t_(std::move(t)), stream_(stream) {
    for (int i = 0; i < 5; ++i) bytes_[i] = bytes_each[i];
  }
  void* part(Part p) override { return t_[p].live ? t_[p].scratch.get() : nullptr; }
  void commit() override {
    for (int i = 0; i < 5; ++i)
      if (t_[i].live)
        CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(t_[i].live->get(), t_[i].scratch.get(), bytes_[i], cudaMemcpyDeviceToDevice,
                                           stream_));
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  std::array<Target, 5> t_;
  std::size_t bytes_[5] = {};
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<DeviceRestore> GpuEngine::device_restore(DType params, std::optional<DType> master, DType moments,
                                                         std::optional<DType> compensation) {
  if (zero_.partitioned() || zero_.sharded() || swap_ || tp_slice_.size > 1) return nullptr;
  if (params != plan_.param || moments != plan_.moment) return nullptr;
  if (plan_.has_master && master != DType::F32) return nullptr;
  if (plan_.compensation && compensation && *compensation != DType::BF16) return nullptr;
  std::array<EngineRestore::Target, 5> t;
  std::size_t bytes[5] = {};
  ensure_state();  // offloaded states back before commit() copies over them
  try {
    // A compensation the file lacks stays zero in its scratch: it starts at zero.
    for (const StatePart& sp : state_parts()) {
      bytes[sp.part] = n_ * dtype_size(sp.dtype);
      t[sp.part].live = sp.buffer;
      t[sp.part].scratch = Buffer(device_allocator(), bytes[sp.part], stream_);
      CUTRAIN_CUDA_CHECK(cudaMemsetAsync(t[sp.part].scratch.get(), 0, bytes[sp.part], stream_));
    }
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (const Error&) {
    return nullptr;  // no room for the scratch: the load goes through host memory
  }
  return std::make_unique<EngineRestore>(std::move(t), bytes, stream_);
}

std::unique_ptr<TrainBackend> make_gpu_backend(const BackendOptions& o, const TrainConfig& c) {
  std::string why;
  CUTRAIN_CHECK(gpu_available(&why), "train: --device cuda needs a CUDA device (", why, "); use --device cpu");
  return std::make_unique<GpuEngine>(o, c);
}

}  // namespace cutrain::train
