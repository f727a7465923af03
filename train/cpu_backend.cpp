#include "train/cpu_backend.h"

#include <cmath>
#include <iostream>

#include "model/distillation_loss.h"
#include "model/reference_model.h"
#include "parallel/group_communicator.h"
#include "parallel/rank_grid.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/error.h"
#include "train/lamb_optimizer.h"
#include "train/random_ltd_draw.h"
#include "train/cpu_pipeline.h"
#include "parallel/expert_parallel_plan.h"
#include "train/cpu_expert_parallel.h"
#include "train/cpu_tensor_parallel.h"
#include "train/cpu_zero.h"

namespace cutrain::train {
namespace {

// The communicator of this process: the caller's, else a host communicator when the launch
// environment names more than one rank (collective over all ranks), else none.
std::shared_ptr<comm::Communicator> resolve_host_communicator(const BackendOptions& o, const TrainConfig& c) {
  if (o.tp_comm) return o.comm;  // the grid's data-parallel group (none with dp 1), made by make_cpu_backend
  const comm::LaunchEnv env = o.comm ? comm::LaunchEnv{} : comm::read_launch_env();
  if (!o.comm && env.world_size <= 1) return nullptr;
  CUTRAIN_CHECK(c.optimizer.type != OptimizerType::Lamb,
                "cpu backend: optimizer.type Lamb runs on one process (its trust ratios need whole tensors); the "
                "CPU backend's data parallelism updates with AdamW only");
  if (o.comm) return o.comm;
  // An invalid stage fails here, before the rendezvous.
  parallel::make_zero_plan(c.zero_optimization.stage, 1, env.world_size, env.rank, /*has_comm=*/true);
  std::cout << "[Rank " << env.rank << "] data parallel: rank " << env.rank << " of " << env.world_size << " (from "
            << env.source << "), host communicator (shared memory, a test backend), rendezvous " << env.master_addr
            << ":" << env.port() << std::endl;
  return comm::create_host_communicator(env);
}

class CpuBackend final : public TrainBackend {
 public:
  CpuBackend(const BackendOptions& o, const TrainConfig& c)
      : opt_(o), cfg_(c), table_(o.dims), model_(table_, o.causal), rows_(o.batch), seq_(o.seq) {
    const std::size_t n = table_.flat_size();
    params_.resize(n);
    table_.init(params_.data(), o.seed);
    if (o.teacher) attach_teacher(o);
    if (o.tensor_parallel > 1) {
      tp_ = std::make_unique<CpuTensorParallel>(o, table_);
      tp_->attach(model_);
      tp_->keep_held(params_);
      std::cout << "[Rank " << rank_of(o) << "] " << tp_->describe() << std::endl;
    }
    if (o.ep_comm) {  // expert parallelism: the two ZeRO spaces (train/cpu_expert_parallel.h)
      ep_ = std::make_unique<CpuExpertParallel>(o.comm, o.ep_comm, o.expert_dp_comm, table_, c, o.expert_parallel,
                                                params_);
      ep_->attach(model_);
      ep_->params_for_compute(params_);
      grads_.assign(n, 0.f);
      ltd_ = std::make_unique<RandomLtdDraw>(c, o.batch, o.seq, o.dims.layers, o.comm->rank());
      std::cout << ep_->describe() << std::endl;
      return;
    }
    if (auto comm = resolve_host_communicator(o, c)) {
      CUTRAIN_CHECK(comm->device() < 0, "cpu backend: expected a host communicator, found ", comm->backend_name(),
                    " (GPUs use --device cuda)");
      zero_ = std::make_unique<CpuZero>(std::move(comm), table_, c, params_);
      if (tp_) zero_->set_tensor_parallel(&tp_->counted(), &tp_->group(), rank_of(o));
      ltd_ = std::make_unique<RandomLtdDraw>(c, o.batch, o.seq, o.dims.layers, zero_->plan().rank);
      params_.resize(zero_->work_elems(), 0.f);
      grads_.assign(zero_->work_elems(), 0.f);
      std::cout << zero_->describe() << std::endl;
      return;
    }
    ltd_ = std::make_unique<RandomLtdDraw>(c, o.batch, o.seq, o.dims.layers, 0);
    grads_.assign(n, 0.f);
    m_.assign(n, 0.f);
    v_.assign(n, 0.f);
    if (c.optimizer.type == OptimizerType::Lamb) lamb_tensors_ = lamb_tensors(table_);
  }
  const model::TransformerParams& table() const override { return table_; }

  StepStats step(const std::int32_t* tokens, const std::int32_t* labels, int step, float lr) override {
    // Staged distillation: the teacher's steps are [0, stop_kd_step); at the first step past them
    // it is freed for good.
    const std::optional<int>& stop = opt_.distill.stop_kd_step;
    distill_now_ = teacher_ && (!stop || step - 1 < *stop);
    if (teacher_ && !distill_now_) release_teacher();
    StepStats st = zero_ ? zero_step(tokens, labels, step, lr) : ep_ ? ep_step(tokens, labels, step, lr)
                                                                     : local_step(tokens, labels, step, lr);
    st.distilled = distill_now_;
    st.ce_loss = st.loss;
    return st;
  }

  bool holds_teacher() const override { return teacher_ != nullptr; }

  double eval_loss(const std::int32_t* tokens, const std::int32_t* labels) override {
    model_.set_moe_mode(false);  // MoE blocks: eval_capacity_factor, no gate noise
    model_.set_training(false);  // BERT: no dropout
    if (!zero_) return model_.forward(params_.data(), tokens, labels, opt_.batch, opt_.seq);
    zero_->params_for_compute(params_);  // every rank evaluates the same batch
    const double loss = model_.forward(params_.data(), tokens, labels, opt_.batch, opt_.seq);
    zero_->release_compute(params_);
    return loss;
  }

  MemoryStats memory() const override {
    MemoryStats m = state_memory();
    const std::int64_t t = teacher_ ? std::int64_t(sizeof(float) * teacher_->params.size()) : 0;  // the teacher's weights
    return {m.allocated + t, m.reserved + t, m.peak + t};
  }

 private:
  // One process's step: its micro-batches, the global norm, clipping and the optimizer.
  StepStats local_step(const std::int32_t* tokens, const std::int32_t* labels, int step, float lr) {
    StepStats st = micro_batches(tokens, labels, step);
    double sq = 0;
    if (tp_) {  // each element once over the group
      sq = tp_->counted_sq(grads_.data(), 0, grads_.size());
      tp_->group().all_reduce_sum_f64(&sq, 1, nullptr);
    } else {
      for (float g : grads_) sq += double(g) * g;
    }
    st.grad_norm = std::sqrt(sq);
    if (!std::isfinite(st.grad_norm)) {
      st.skipped = true;
      return st;
    }
    const double scale = clip_scale(cfg_.gradient_clipping, st.grad_norm);
    const auto& o = cfg_.optimizer;
    if (o.type == OptimizerType::Lamb) {
      host_lamb_step(lamb_params(o, lr, step), scale, lamb_tensors_, params_.data(), grads_.data(), m_.data(),
                     v_.data());
      return st;
    }
    for (const model::DecayRun& r : table_.decay_runs())  // GPT-2: no decay for biases and LayerNorm
      model::reference_adam_step(params_.data() + r.begin, grads_.data() + r.begin, m_.data() + r.begin,
                                 v_.data() + r.begin, r.end - r.begin, lr, o.beta1, o.beta2, o.eps,
                                 r.decay ? o.weight_decay : 0.0, o.adam_w_mode, step, scale);
    return st;
  }

  MemoryStats state_memory() const {
    if (ep_) {  // the two spaces' state and the flat buffers the model computes on
      const std::int64_t b = ep_->state_bytes() + std::int64_t(8 * table_.flat_size());
      return {b, b, b};
    }
    if (zero_) {
      // Between steps the state this rank holds; during one, stage 3's working copies too.
      const std::int64_t held = zero_->state_bytes();
      const std::int64_t peak = held + (zero_->plan().sharded() ? std::int64_t(8 * table_.flat_size()) : 0);
      return {held, peak, peak};
    }
    // The training state on the host (params, grads, two moments), fp32.
    const auto bytes = std::int64_t(4 * 4 * params_.size());
    return {bytes, bytes, bytes};
  }

 public:
  void reset_peak() override {}
  HostState save_state() const override {
    HostState s{params_, {}, m_, v_, {}, DType::F32};
    if (ep_) ep_->gather_state(s.params, s.exp_avg, s.exp_avg_sq);  // a collective: the whole model on every rank
    if (zero_) zero_->gather_state(params_, s.params, s.exp_avg, s.exp_avg_sq);  // a collective: every rank calls it
    if (tp_)  // the group's slices and replicated tensors into the whole model (a collective of the group)
      for (std::vector<float>* v : {&s.params, &s.exp_avg, &s.exp_avg_sq}) tp_->combine(*v);
    return s;
  }
  void load_state(const HostState& full) override {
    if (ep_) {  // this rank's parts of the whole model, any ep_size's checkpoint alike
      ep_->scatter_state(full.params, full.exp_avg, full.exp_avg_sq);
      ep_->params_for_compute(params_);
      return;
    }
    const HostState* sp = &full;
    HostState mine;
    if (tp_) {  // this rank's slices and the replicated tensors
      mine = full;
      for (std::vector<float>* v : {&mine.params, &mine.exp_avg, &mine.exp_avg_sq}) tp_->keep_held(*v);
      sp = &mine;
    }
    const HostState& s = *sp;
    if (zero_) {
      const std::size_t n = table_.flat_size();
      CUTRAIN_CHECK(s.params.size() == n && s.exp_avg.size() == n && s.exp_avg_sq.size() == n, "cpu backend: state of ",
                    s.params.size(), " params does not fit the model's ", n);
      zero_->scatter_state(s.params, s.exp_avg, s.exp_avg_sq, params_);
      return;
    }
    CUTRAIN_CHECK(s.params.size() == params_.size() && s.exp_avg.size() == m_.size() && s.exp_avg_sq.size() == v_.size(),
                  "cpu backend: state of ", s.params.size(), " params does not fit the model's ", params_.size());
    params_ = s.params;
    m_ = s.exp_avg;
    v_ = s.exp_avg_sq;
  }
  std::string run_summary() const override { return tp_ ? tp_->run_summary() : std::string(); }
  // The reference model takes any B x S per call: the next micro-batches are rows x seq (random-LTD
  // draws at that shape). Tensor parallelism (its plan is per B x S) and expert parallelism keep
  // the run's shape.
  void set_seq_shape(int rows, int seq) override {
    const std::size_t cap = opt_.max_tokens ? opt_.max_tokens : std::size_t(opt_.batch) * opt_.seq;
    CUTRAIN_CHECK(rows > 0 && seq > 0 && seq <= opt_.seq && std::size_t(rows) * seq <= cap, "cpu backend: micro-batch ",
                  rows, " x ", seq, " outside the run's sequence length ", opt_.seq, " and capacity ", cap, " tokens");
    const bool full = rows == opt_.batch && seq == opt_.seq;
    CUTRAIN_CHECK(full || (!tp_ && !ep_), "cpu backend: a sequence-length curriculum (micro-batch ", rows, " x ", seq,
                  ") with ", tp_ ? "tensor parallelism" : "expert parallelism", " is not built");
    rows_ = rows;
    seq_ = seq;
  }
  const char* describe() const override {
    if (ep_) return "cpu (fp32 reference model, data and expert parallel over the host communicator)";
    if (tp_)
      return zero_ ? "cpu (fp32 reference model, data x tensor parallel over the host communicator)"
                   : "cpu (fp32 reference model, tensor parallel over the host communicator)";
    return zero_ ? "cpu (fp32 reference model, data parallel over the host communicator)" : "cpu (fp32 reference model)";
  }

 private:
  // A data-parallel step: this rank's micro-batches, the gradients reduced and the optimizer
  // state updated as the ZeRO stage says (train/cpu_zero.h).
  StepStats zero_step(const std::int32_t* tokens, const std::int32_t* labels, int step, float lr) {
    zero_->params_for_compute(params_);
    StepStats st = micro_batches(tokens, labels, step);
    st.loss = zero_->mean_over_ranks(st.loss);
    if (distill_now_) st.kd_loss = zero_->mean_over_ranks(st.kd_loss);
    st.grad_norm = zero_->reduce_grads(grads_);
    if (!std::isfinite(st.grad_norm)) {
      st.skipped = true;
      zero_->release_compute(params_);
      return st;
    }
    const double scale = clip_scale(cfg_.gradient_clipping, st.grad_norm);
    zero_->adam(params_, grads_, step, lr, scale);
    zero_->release_compute(params_);
    return st;
  }

  // An expert-parallel step: this rank's micro-batches (their MoE blocks exchanging tokens), the
  // non-expert and expert gradients reduced over their groups, AdamW on both, the params unpacked.
  StepStats ep_step(const std::int32_t* tokens, const std::int32_t* labels, int step, float lr) {
    StepStats st = micro_batches(tokens, labels, step);
    st.loss = ep_->mean_over_ranks(st.loss);
    if (distill_now_) st.kd_loss = ep_->mean_over_ranks(st.kd_loss);
    st.grad_norm = ep_->reduce_grads(grads_);
    if (!std::isfinite(st.grad_norm)) {
      st.skipped = true;
      return st;
    }
    const double scale = clip_scale(cfg_.gradient_clipping, st.grad_norm);
    ep_->adam(step, lr, scale);
    ep_->params_for_compute(params_);
    return st;
  }

  // Every step kind's start: the gradients zeroed, then this rank's micro-batches accumulated into
  // them (their losses, layer tokens and routing figures summed into the returned stats).
  StepStats micro_batches(const std::int32_t* tokens, const std::int32_t* labels, int step) {
    const int accum = cfg_.accumulation();
    const std::size_t per = std::size_t(rows_) * seq_;
    std::fill(grads_.begin(), grads_.end(), 0.f);
    StepStats st;
    for (int a = 0; a < accum; ++a) micro_batch(tokens + a * per, labels + a * per, step, a, accum, st);
    return st;
  }

  // Micro-batch `a` of `accum`: its MoE seed and random-LTD draw, forward and backward into grads_,
  // its loss, layer tokens and routing figures added to `st` (under ZeRO: this rank's micro-batches;
  // with expert parallelism its MoE blocks exchange tokens with the expert-parallel group).
  void micro_batch(const std::int32_t* tokens, const std::int32_t* labels, int step, int a, int accum, StepStats& st) {
    // The gate noise's seed from the micro-batch's number in the global batch (this data-parallel
    // rank's micro-batches follow the lower ranks'), so W ranks draw the single process's noise.
    model_.set_moe_mode(true, model::moe_forward_seed(opt_.seed, step, dp_rank() * accum + a));
    model_.set_training(true);  // BERT's dropout masks: a function of (seed, step, micro-batch)
    model_.set_dropout(opt_.seed, std::uint32_t(step), a);
    const model::TokenDropPlan& drop = ltd_->draw(step, a, rows_, seq_);  // random-LTD's kept tokens
    model_.set_token_drop(&drop);
    if (distill_now_) teacher_forward(tokens, labels);
    st.loss += forward(tokens, labels) / accum;
    if (distill_now_) st.kd_loss += distillation(accum);
    backward(1.0 / accum);
    model_.set_logits_grad_extra(nullptr);
    model_.set_token_drop(nullptr);
    st.layer_tokens += drop.layer_tokens(table_.dims().layers);
    merge_moe(st, a);
  }

  // One micro-batch's forward and backward; with tensor parallelism each is a pass of Domino's
  // timeline (parallel/tp_reducer.h).
  double forward(const std::int32_t* tokens, const std::int32_t* labels) {
    if (tp_) tp_->begin_pass();
    const double loss = model_.forward(params_.data(), tokens, labels, rows_, seq_);
    if (tp_) tp_->end_pass();
    return loss;
  }
  void backward(double scale) {
    if (tp_) tp_->begin_pass();
    model_.backward(params_.data(), grads_.data(), scale);
    if (tp_) tp_->end_pass();
  }
  static int rank_of(const BackendOptions&) { return comm::read_launch_env().rank; }

  // Mixture-of-Students: the teacher's table and reference model beside the student's.
  void attach_teacher(const BackendOptions& o) {
    CUTRAIN_CHECK(o.tensor_parallel <= 1 && o.pipeline_stages <= 1, "cpu backend: knowledge distillation with ",
                  o.tensor_parallel_flag, " ", o.tensor_parallel, " and --pipeline_parallel_size ", o.pipeline_stages,
                  ": the teacher runs beside a whole student (one process or data parallel); with tensor or pipeline "
                  "parallelism it is not built");
    teacher_ = o.teacher;
    opt_.teacher.reset();  // the backend's pointer is teacher_, released at the stop step
    teacher_table_ = std::make_unique<model::TransformerParams>(teacher_->dims);
    CUTRAIN_CHECK(teacher_->params.size() == teacher_table_->flat_size(), "cpu backend: the teacher's ",
                  teacher_->params.size(), " parameters do not fit its shape's ", teacher_table_->flat_size());
    CUTRAIN_CHECK(teacher_->dims.vocab == table_.dims().vocab, "cpu backend: the teacher's vocab_size ",
                  teacher_->dims.vocab, " is not the student's ", table_.dims().vocab);
    teacher_model_ = std::make_unique<model::ReferenceModel<float>>(*teacher_table_, teacher_->causal);
  }
  void release_teacher() {
    teacher_model_.reset();
    teacher_table_.reset();
    teacher_.reset();
    std::vector<float>().swap(kd_grad_);
  }
  // The teacher's forward on the micro-batch: evaluation mode (eval_capacity_factor, no gate noise,
  // no dropout), its logits kept for distillation(); no gradient.
  void teacher_forward(const std::int32_t* tokens, const std::int32_t* labels) {
    teacher_model_->set_moe_mode(false);
    teacher_model_->set_training(false);
    teacher_model_->forward(teacher_->params.data(), tokens, labels, opt_.batch, opt_.seq);
  }
  // The distillation term of the micro-batch just forwarded, kd_beta_ce * T^2 * mean KL, divided by
  // the accumulation; its logits gradient and the LM loss's weight handed to the student's backward.
  double distillation(int accum) {
    const MosOptions& d = opt_.distill;
    const std::vector<float>& s = model_.logits();
    const std::vector<float>& t = teacher_model_->logits();
    kd_grad_.assign(s.size(), 0.f);
    const double kd = model::distillation_loss(s.data(), table_.dims().vocab_rows(), t.data(),
                                               teacher_table_->dims().vocab_rows(), opt_.batch * opt_.seq,
                                               table_.dims().vocab, d.kd_temp, d.kd_beta_ce, kd_grad_.data());
    model_.set_logits_grad_extra(&kd_grad_, d.kd_alpha_ce);
    return d.kd_beta_ce * kd / accum;
  }
  // This rank's index among the data-parallel replicas (0 without data parallelism).
  int dp_rank() const { return ep_ ? opt_.comm->rank() : zero_ ? zero_->plan().rank : 0; }

  void merge_moe(StepStats& st, int micro) const {  // the MoE blocks' routing of micro-batch `micro`
    const auto& m = model_.moe_stats();
    st.moe.resize(m.size());
    for (std::size_t i = 0; i < m.size(); ++i) model::merge_moe_stats(st.moe[i], m[i], micro);
  }
  BackendOptions opt_;
  TrainConfig cfg_;
  model::TransformerParams table_;
  model::ReferenceModel<float> model_;
  std::vector<float> params_, grads_, m_, v_;  // m_, v_: without data parallelism
  std::vector<kernels::LambTensor> lamb_tensors_;  // Lamb: the model's parameter tensors
  std::unique_ptr<CpuZero> zero_;
  std::unique_ptr<CpuTensorParallel> tp_;  // tensor parallelism: this rank's slice
  std::unique_ptr<CpuExpertParallel> ep_;  // expert parallelism: its groups and two ZeRO spaces
  std::unique_ptr<RandomLtdDraw> ltd_;
  // Knowledge distillation: the teacher (null once freed), its table and model, the logits gradient
  // of the distillation term, and whether the step running distills.
  std::shared_ptr<const Teacher> teacher_;
  std::unique_ptr<model::TransformerParams> teacher_table_;
  std::unique_ptr<model::ReferenceModel<float>> teacher_model_;
  std::vector<float> kd_grad_;
  bool distill_now_ = false;
  int rows_, seq_;  // the micro-batch's shape (set_seq_shape; the run's B x S by default)
};

}  // namespace

// Expert parallelism: the data-parallel world, its expert-parallel and expert-data-parallel groups
// (parallel/expert_parallel_plan.h), every bad value named before the rendezvous.
std::unique_ptr<TrainBackend> make_cpu_expert_parallel_backend(const BackendOptions& opt, const TrainConfig& c) {
  const char* flag = "--moe_expert_parallel_size";
  BackendOptions o = opt;
  CUTRAIN_CHECK(o.tensor_parallel <= 1 && o.pipeline_stages <= 1, flag, " ", o.expert_parallel, " with ",
                o.tensor_parallel_flag, " ", o.tensor_parallel, " and --pipeline_parallel_size ", o.pipeline_stages,
                ": expert parallelism runs over data-parallel ranks only; with tensor or pipeline parallelism it is "
                "not built");
  CUTRAIN_CHECK(c.optimizer.type != OptimizerType::Lamb, "cpu backend: optimizer.type Lamb with ", flag, " ",
                o.expert_parallel, ": the CPU backend's data parallelism updates with AdamW only");
  CUTRAIN_CHECK(c.zero_optimization.stage >= 0 && c.zero_optimization.stage <= 2, "cpu backend: zero_optimization.stage ",
                c.zero_optimization.stage, " with ", flag, " ", o.expert_parallel,
                ": expert parallelism partitions the expert and non-expert parameters with ZeRO stages 0-2; stage 3's "
                "parameter shards are not built for it");
  // The experts' split (each MoE block's count) before any rendezvous.
  parallel::make_expert_parallel_layout(model::TransformerParams(o.dims), o.expert_parallel, flag);
  std::shared_ptr<comm::Communicator> world = o.comm;
  if (!world) {
    const comm::LaunchEnv env = comm::read_launch_env();
    parallel::make_expert_parallel_groups(env.world_size, o.expert_parallel, flag);
    world = comm::create_host_communicator(env);
    if (env.rank == 0)
      std::cout << "[Rank 0] expert parallel: world " << env.world_size << " = " << env.world_size / o.expert_parallel
                << " expert-parallel group(s) of " << o.expert_parallel << " ranks (" << flag << "), host communicator "
                << "(shared memory, a test backend)" << std::endl;
  }
  CUTRAIN_CHECK(world->device() < 0, "cpu backend: expected a host communicator, found ", world->backend_name());
  const parallel::ExpertParallelGroups g =
      parallel::make_expert_parallel_groups(world->world_size(), o.expert_parallel, flag);
  const int r = world->rank();
  o.comm = world;
  o.ep_comm = parallel::make_group_communicator(world, g.ep_group(r));
  o.expert_dp_comm = parallel::make_group_communicator(world, g.expert_dp_group(r));
  return std::make_unique<CpuBackend>(o, c);
}

std::unique_ptr<TrainBackend> make_cpu_backend(const BackendOptions& opt, const TrainConfig& c) {
  CUTRAIN_CHECK(!opt.teacher || (opt.pipeline_stages <= 1 && opt.tensor_parallel <= 1),
                "cpu backend: knowledge distillation with --pipeline_parallel_size ", opt.pipeline_stages, " and ",
                opt.tensor_parallel_flag, " ", opt.tensor_parallel, ": the teacher runs beside a whole student (one "
                "process or data parallel); with tensor or pipeline parallelism it is not built");
  if (opt.expert_parallel > 1) return make_cpu_expert_parallel_backend(opt, c);
  if (opt.tensor_parallel <= 1) {
    CUTRAIN_CHECK(opt.domino == 1, "--domino ", opt.domino, ": Domino splits the tensor-parallel all-reduces; expected "
                  "--tensor_parallel_size > 1, found ", opt.tensor_parallel);
    if (opt.pipeline_stages > 1) return make_cpu_pipeline_backend(opt, c);
    return std::make_unique<CpuBackend>(opt, c);
  }
  // Tensor parallelism: the world on the grid (parallel/rank_grid.h), each backend given its groups.
  BackendOptions o = opt;
  CUTRAIN_CHECK(c.optimizer.type != OptimizerType::Lamb, "cpu backend: optimizer.type Lamb with ",
                o.tensor_parallel_flag, " ", o.tensor_parallel, ": LAMB's trust ratios need whole tensors on one rank; "
                "tensor-parallel ranks update with AdamW only");
  // The slice's checks (heads, FFN, vocabulary; Domino's pieces) before any rendezvous.
  parallel::make_tp_slice(o.dims, o.tensor_parallel, 0, o.tensor_parallel_flag);
  parallel::check_domino(o.domino, o.batch, o.tensor_parallel, "--domino");
  std::shared_ptr<comm::Communicator> world = o.comm;
  if (!world) {
    const comm::LaunchEnv env = comm::read_launch_env();
    parallel::make_rank_grid(env.world_size, o.pipeline_stages, o.tensor_parallel, "--pipeline_parallel_size",
                             o.tensor_parallel_flag);
    if (o.pipeline_stages == 1)
      parallel::make_zero_plan(c.zero_optimization.stage, 1, env.world_size, env.rank, /*has_comm=*/true);
    comm::HostCommOptions ho;  // rings that hold a pipeline's in-flight activations (train/cpu_pipeline.h)
    const std::size_t act = std::size_t(o.batch) * o.seq * o.dims.hidden * sizeof(float);
    ho.channel_bytes = std::max(ho.channel_bytes, act * std::size_t(o.pipeline_stages + 1));
    world = comm::create_host_communicator(env, ho);
    if (env.rank == 0)
      std::cout << "[Rank 0] tensor parallel: world " << env.world_size << " = " << o.pipeline_stages
                << " stage(s) x " << env.world_size / (o.pipeline_stages * o.tensor_parallel) << " replica(s) x "
                << o.tensor_parallel << " tensor-parallel ranks (rank = (stage x dp + replica) x "
                << o.tensor_parallel << " + t), host communicator (shared memory, a test backend)" << std::endl;
  }
  CUTRAIN_CHECK(world->device() < 0, "cpu backend: expected a host communicator, found ", world->backend_name());
  const parallel::RankGrid grid = parallel::make_rank_grid(world->world_size(), o.pipeline_stages, o.tensor_parallel,
                                                           "--pipeline_parallel_size", o.tensor_parallel_flag);
  const int r = world->rank();
  o.tp_comm = parallel::make_group_communicator(world, grid.tp_group(r));
  if (o.pipeline_stages > 1) {
    o.comm = parallel::make_group_communicator(world, grid.pipe_dp_group(r));
    return make_cpu_pipeline_backend(o, c);
  }
  o.comm = grid.dp > 1 ? std::shared_ptr<comm::Communicator>(parallel::make_group_communicator(world, grid.dp_group(r)))
                       : nullptr;
  if (o.comm)
    std::cout << "[Rank " << r << "] data parallel: replica " << grid.coord(r).replica << " of " << grid.dp
              << " (its ZeRO reductions over the " << grid.dp << " ranks of tensor-parallel index " << grid.coord(r).tp
              << ")" << std::endl;
  return std::make_unique<CpuBackend>(o, c);
}

}  // namespace cutrain::train
