#include "train/cpu_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "model/reference_model.h"
#include "parallel/partition.h"
#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_plan.h"
#include "parallel/pipeline_transfers.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/error.h"
#include "train/cpu_tensor_parallel.h"

namespace cutrain::train {
namespace {

using parallel::PipeAction;

class CpuPipelineBackend final : public TrainBackend {
 public:
  CpuPipelineBackend(const BackendOptions& o, const TrainConfig& c) : opt_(o), cfg_(c), table_(o.dims) {
    CUTRAIN_CHECK(c.zero_optimization.stage <= 1, "pipeline parallelism on the CPU backend: zero_optimization.stage ",
                  c.zero_optimization.stage, " with --pipeline_parallel_size ", o.pipeline_stages,
                  ": expected stage 0 or 1 (DeepSpeed's pipeline engine takes ZeRO-1 only)");
    const auto layers = parallel::pipeline_layers(table_);
    plan_ = parallel::make_pipeline_plan(layers, parallel::parse_partition_method(o.partition_method, "--partition_method"),
                                         o.pipeline_stages, c.accumulation());
    comm_ = o.comm;
    if (!comm_) {
      const comm::LaunchEnv env = comm::read_launch_env();
      CUTRAIN_CHECK(env.world_size % o.pipeline_stages == 0, "pipeline: --pipeline_parallel_size ", o.pipeline_stages,
                    " does not divide the world size ", env.world_size);
      // Rings that hold every activation a stage sends before its neighbour takes it: at most S
      // in flight per direction in 1F1B, so no send waits.
      comm::HostCommOptions ho;
      const std::size_t act = std::size_t(o.batch) * o.seq * o.dims.hidden * sizeof(float);
      ho.channel_bytes = std::max(ho.channel_bytes, act * std::size_t(o.pipeline_stages + 1));
      comm_ = comm::create_host_communicator(env, ho);
    }
    CUTRAIN_CHECK(comm_->device() < 0, "cpu backend: expected a host communicator, found ", comm_->backend_name());
    // The grid as DeepSpeed's (pipe outer, data inner): rank = stage x dp + replica.
    CUTRAIN_CHECK(comm_->world_size() % plan_.stages == 0, "pipeline: ", plan_.stages,
                  " stages do not divide the world size ", comm_->world_size());
    dp_ = comm_->world_size() / plan_.stages;
    stage_ = comm_->rank() / dp_;
    replica_ = comm_->rank() % dp_;
    prev_ = comm_->rank() - dp_;
    next_ = comm_->rank() + dp_;
    const parallel::PipelineStage& st = plan_.parts[std::size_t(stage_)];
    const int L = o.dims.layers;
    // Layer i of the sequence is parameter unit i: 0 the embedding, 1 + l block l, L + 1 the head.
    span_.embedding = st.first == 0;
    span_.head = st.end == L + 2;
    span_.first = std::max(st.first, 1) - 1;
    span_.end = std::min(st.end, L + 1) - 1;
    // DeepSpeed's activation_checkpoint_interval: the stage's layers in chunks of that many from
    // its first; each chunk keeps only its input and is recomputed in backward.
    CUTRAIN_CHECK(o.activation_checkpoint_interval >= 0, "pipeline: activation_checkpoint_interval ",
                  o.activation_checkpoint_interval, ": expected >= 0 (0: off)");
    ckpt_interval_ = o.activation_checkpoint_interval;
    for (int f = st.first; ckpt_interval_ > 0 && f < st.end; f += ckpt_interval_) {
      const int e = std::min(f + ckpt_interval_, st.end);
      chunks_.push_back(model::LayerSpan{f == 0, std::max(f, 1) - 1, std::min(e, L + 1) - 1, e == L + 2});
    }
    owned_ = {table_.units()[std::size_t(st.first)].begin, table_.units()[std::size_t(st.end) - 1].end};
    const std::size_t n = table_.flat_size();
    params_.resize(n);
    table_.init(params_.data(), o.seed);  // every rank alike; each uses and updates its own layers
    if (o.tensor_parallel > 1) {  // PP x TP: this stage's layers, this rank's slices of them
      tp_ = std::make_unique<CpuTensorParallel>(o, table_);
      tp_->set_span(span_.embedding, span_.end - span_.first, span_.head);
      tp_->keep_held(params_);
    }
    grads_.assign(n, 0.f);
    // ZeRO-1 over the stage's replicas: each keeps and updates the moments of its partition of the
    // stage's layers (parallel/partition.h), then the replicas' updated params are shared.
    state_ = owned_;
    zero1_ = c.zero_optimization.stage == 1 && dp_ > 1;
    if (zero1_) {
      const parallel::FlatPartition part = parallel::partition_flat(owned_.size(), dp_, sizeof(float));
      const parallel::Range r = part.owned_real(replica_);
      const std::size_t lo = std::min(owned_.begin + r.begin, owned_.end);  // may be empty on the last replicas
      state_ = {lo, std::max(lo, std::min(owned_.begin + r.end, owned_.end))};
    }
    m_.assign(state_.size(), 0.f);
    v_.assign(state_.size(), 0.f);
    // GPT-2's head is the token embedding (DeepSpeed's TiedLayerSpec): the last stage keeps a copy
    // of it with its own moments; the two stages' gradients of it are summed after the backwards,
    // so both copies take the same update. Stage 0 owns it (checkpoints, the norm).
    if (table_.tied_head()) {
      const model::ParamTensor& wte = table_.tensor(table_.embedding());
      tied_ = {wte.offset, wte.offset + wte.count};
      tied_decay_ = wte.decay;
      if (span_.head && !span_.embedding) {
        m_tied_.assign(tied_.size(), 0.f);
        v_tied_.assign(tied_.size(), 0.f);
      }
    }
    // One model per activation slot (parallel/pipeline_executor.h: the micro-batches 1F1B keeps
    // alive on this stage); with checkpointing one model recomputes the chunks and each slot keeps
    // its chunks' inputs.
    const int slots = parallel::pipeline_slots(stage_, plan_.stages, plan_.micro_batches);
    for (int m = 0; m < (chunks_.empty() ? slots : 1); ++m) models_.emplace_back(table_, o.causal);
    ckpt_in_.resize(chunks_.empty() ? 0 : std::size_t(slots));
    if (tp_)
      for (auto& m : models_) tp_->attach(m);
    // The world's rank (with tensor parallelism comm_ is the stages x replicas of this rank's tp index).
    const int world_rank = o.tp_comm ? comm::read_launch_env().rank : comm_->rank();
    if (world_rank == 0)
      std::cout << "[Rank 0] " << plan_.describe(layers)
                << (dp_ > 1 ? "; " + std::to_string(dp_) + " data-parallel replicas (rank = stage x " +
                                  std::to_string(dp_) + " + replica)"
                            : std::string())
                << (tied_.empty() ? "" : "; tied: the token embedding is the head's weight on stages 0 and " +
                                             std::to_string(plan_.stages - 1) + ", its gradients summed between them")
                << std::endl;
    std::cout << "[Rank " << world_rank << "] pipeline stage " << stage_ << " of " << plan_.stages
              << (dp_ > 1 ? ", replica " + std::to_string(replica_) + " of " + std::to_string(dp_) : std::string())
              << (zero1_ ? ", ZeRO-1: the moments of [" + std::to_string(state_.begin) + ", " +
                               std::to_string(state_.end) + ")"
                         : std::string())
              << " over the "
              << comm_->backend_name() << " communicator: layers " << st.first << "-" << st.end - 1 << ", flat ["
              << owned_.begin << ", " << owned_.end << ")"
              << (chunks_.empty() ? std::string()
                                  : "; activation_checkpoint_interval " + std::to_string(ckpt_interval_) + ": " +
                                        std::to_string(chunks_.size()) + " chunk(s) recomputed in backward")
              << std::endl;
    if (tp_) std::cout << "[Rank " << world_rank << "] stage " << stage_ << ": " << tp_->describe() << std::endl;
  }
  const model::TransformerParams& table() const override { return table_; }

  StepStats step(const std::int32_t* tokens, const std::int32_t* labels, int step, float lr) override {
    const int M = plan_.micro_batches;
    const std::size_t per = std::size_t(opt_.batch) * opt_.seq, act = per * std::size_t(opt_.dims.hidden);
    std::fill(grads_.begin() + std::ptrdiff_t(owned_.begin), grads_.begin() + std::ptrdiff_t(owned_.end), 0.f);
    if (holds_tied_copy())
      std::fill(grads_.begin() + std::ptrdiff_t(tied_.begin), grads_.begin() + std::ptrdiff_t(tied_.end), 0.f);
    double loss = 0;
    std::vector<float> in(act), out, dout(act), din;
    // This stage's program (parallel/pipeline_executor.h: its 1F1B order and activation slots) and,
    // between two actions, its exchange with the neighbour stages (parallel/pipeline_transfers.h,
    // the GPU pipeline's too): the last action's result sent, the next one's input received.
    const std::vector<parallel::StageStep> program = parallel::pipeline_program(plan_.stages, stage_, stage_ + 1, M);
    const std::vector<parallel::PipeExchange> exchanges = parallel::pipeline_exchanges(plan_.stages, stage_, M);
    std::size_t next_exchange = 0;
    for (std::size_t i = 0; i <= program.size(); ++i) {
      if (next_exchange < exchanges.size() && exchanges[next_exchange].before == i) {
        std::vector<comm::P2POp> ops;
        for (const parallel::PipeTransfer& t : exchanges[next_exchange++].transfers) {
          std::vector<float>& buf = t.kind == parallel::PipeTransfer::SendAct   ? out
                                    : t.kind == parallel::PipeTransfer::RecvAct ? in
                                    : t.kind == parallel::PipeTransfer::RecvGrad ? dout
                                                                                 : din;
          ops.push_back({t.is_send() ? comm::P2POp::Send : comm::P2POp::Recv, buf.data(), act,
                         t.peer < stage_ ? prev_ : next_});
        }
        comm_->send_recv(ops, DType::F32, nullptr);
      }
      if (i == program.size()) break;
      const parallel::StageStep& a = program[i];
      const std::size_t at = std::size_t(a.micro) * per;
      if (tp_) tp_->begin_pass();
      if (a.kind == PipeAction::Forward) {
        const double l = forward_stage(a.slot, tokens + at, labels + at, in, out);
        if (span_.head) loss += l / M;
      } else {
        backward_stage(a.slot, tokens + at, labels + at, dout, din);
      }
      if (tp_) tp_->end_pass();
    }
    reduce_grads();
    StepStats st;
    st.loss = span_.head ? loss / dp_ : 0.0;
    comm_->all_reduce_sum_f64(&st.loss, 1, nullptr);  // from the last stage to every rank
    double sq = 0;  // replica 0 of each stage: the stage's reduced gradients once
    if (replica_ == 0 && tp_) sq = tp_->counted_sq(grads_.data(), owned_.begin, owned_.end);
    else if (replica_ == 0)
      for (std::size_t i = owned_.begin; i < owned_.end; ++i) sq += double(grads_[i]) * grads_[i];
    comm_->all_reduce_sum_f64(&sq, 1, nullptr);
    if (tp_) tp_->group().all_reduce_sum_f64(&sq, 1, nullptr);
    st.grad_norm = std::sqrt(sq);
    if (!std::isfinite(st.grad_norm)) {
      st.skipped = true;
      return st;
    }
    const double scale = clip_scale(cfg_.gradient_clipping, st.grad_norm);
    const auto& o = cfg_.optimizer;
    for (const model::DecayRun& r : table_.decay_runs()) {
      const std::size_t a = std::max(r.begin, state_.begin), b = std::min(r.end, state_.end);
      if (a < b)
        model::reference_adam_step(params_.data() + a, grads_.data() + a, m_.data() + (a - state_.begin),
                                   v_.data() + (a - state_.begin), b - a, lr, o.beta1, o.beta2, o.eps,
                                   r.decay ? o.weight_decay : 0.0, o.adam_w_mode, step, scale);
    }
    if (zero1_) share_params();
    if (holds_tied_copy())  // the same update as stage 0's of the same values
      model::reference_adam_step(params_.data() + tied_.begin, grads_.data() + tied_.begin, m_tied_.data(),
                                 v_tied_.data(), tied_.size(), lr, o.beta1, o.beta2, o.eps,
                                 tied_decay_ ? o.weight_decay : 0.0, o.adam_w_mode, step, scale);
    return st;
  }

  double eval_loss(const std::int32_t* tokens, const std::int32_t* labels) override {
    const std::size_t act = std::size_t(opt_.batch) * opt_.seq * std::size_t(opt_.dims.hidden);
    std::vector<float> in(act), out;
    if (!span_.embedding) comm_->recv(in.data(), act, DType::F32, prev_, nullptr);
    double loss = models_[0].forward_span(params_.data(), span_, tokens, labels, in.data(), opt_.batch, opt_.seq, &out);
    if (!span_.head) comm_->send(out.data(), act, DType::F32, next_, nullptr), loss = 0;
    loss /= dp_;  // every replica evaluates the same batch
    comm_->all_reduce_sum_f64(&loss, 1, nullptr);
    return loss;
  }

  MemoryStats memory() const override {
    // This stage's params, grads, two moments (and the last stage's copy of a tied weight).
    const auto bytes = std::int64_t(4 * (2 * owned_.size() + 2 * state_.size()) +
                                    (holds_tied_copy() ? 4 * 4 * tied_.size() : 0));
    return {bytes, bytes, bytes};
  }
  void reset_peak() override {}
  HostState save_state() const override {
    // Every rank's slice into the flat buffers (zeros elsewhere), summed: the stages' state exactly.
    const std::size_t n = table_.flat_size();
    HostState s{std::vector<float>(n, 0.f), {}, std::vector<float>(n, 0.f), std::vector<float>(n, 0.f), {}, DType::F32};
    if (replica_ == 0)  // one replica per stage
      std::copy(params_.begin() + std::ptrdiff_t(owned_.begin), params_.begin() + std::ptrdiff_t(owned_.end),
                s.params.begin() + std::ptrdiff_t(owned_.begin));
    if (replica_ == 0 || zero1_) {  // ZeRO-1: every replica its partition of the moments
      std::copy(m_.begin(), m_.end(), s.exp_avg.begin() + std::ptrdiff_t(state_.begin));
      std::copy(v_.begin(), v_.end(), s.exp_avg_sq.begin() + std::ptrdiff_t(state_.begin));
    }
    for (std::vector<float>* v : {&s.params, &s.exp_avg, &s.exp_avg_sq}) {
      comm_->all_reduce(v->data(), n, DType::F32, comm::ReduceOp::Sum, nullptr);
      if (tp_) tp_->combine(*v);  // the tensor-parallel group's slices into the whole tensors
    }
    return s;
  }
  void load_state(const HostState& full) override {
    HostState mine;
    const HostState* sp = &full;
    if (tp_) {
      mine = full;
      for (std::vector<float>* v : {&mine.params, &mine.exp_avg, &mine.exp_avg_sq}) tp_->keep_held(*v);
      sp = &mine;
    }
    const HostState& s = *sp;
    const std::size_t n = table_.flat_size();
    CUTRAIN_CHECK(s.params.size() == n && s.exp_avg.size() == n && s.exp_avg_sq.size() == n, "cpu backend: state of ",
                  s.params.size(), " params does not fit the model's ", n);
    params_ = s.params;
    m_.assign(s.exp_avg.begin() + std::ptrdiff_t(state_.begin), s.exp_avg.begin() + std::ptrdiff_t(state_.end));
    v_.assign(s.exp_avg_sq.begin() + std::ptrdiff_t(state_.begin), s.exp_avg_sq.begin() + std::ptrdiff_t(state_.end));
    if (holds_tied_copy()) {
      m_tied_.assign(s.exp_avg.begin() + std::ptrdiff_t(tied_.begin), s.exp_avg.begin() + std::ptrdiff_t(tied_.end));
      v_tied_.assign(s.exp_avg_sq.begin() + std::ptrdiff_t(tied_.begin), s.exp_avg_sq.begin() + std::ptrdiff_t(tied_.end));
    }
  }
  const char* describe() const override {
    return tp_ ? "cpu (fp32 reference model, pipeline x tensor parallel over the host communicator)"
               : "cpu (fp32 reference model, pipeline over the host communicator)";
  }
  std::string run_summary() const override {
    std::string s = tp_ ? tp_->run_summary() + "; " : std::string();
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.3f", double(peak_act_) / (1 << 20));
    s += "pipeline stage " + std::to_string(stage_) + ": activations held at most " + mib + " MiB (" +
         std::to_string(peak_act_) + " bytes, host) over " +
         std::to_string(parallel::pipeline_slots(stage_, plan_.stages, plan_.micro_batches)) +
         " activation slot(s); " +
         (chunks_.empty() ? std::string("every activation kept (activation_checkpoint_interval 0)")
                          : "activation_checkpoint_interval " + std::to_string(ckpt_interval_) + ": each slot keeps " +
                                std::to_string(chunks_.size()) + " chunk input(s), one chunk recomputed at a time");
    return s;
  }

 private:
  BackendOptions opt_;
  TrainConfig cfg_;
  model::TransformerParams table_;
  parallel::PipelinePlan plan_;
  std::shared_ptr<comm::Communicator> comm_;
  int dp_ = 1, stage_ = 0, replica_ = 0, prev_ = -1, next_ = -1;  // the grid: ranks of the neighbour stages
  model::LayerSpan span_;
  parallel::Range owned_;  // this stage's layers in the flat buffer
  parallel::Range state_;  // the part of owned_ whose moments this rank keeps (all of it without ZeRO-1)
  bool zero1_ = false;
  std::vector<float> params_, grads_, m_, v_;  // params_, grads_ full size; m_, v_ of state_
  std::vector<model::ReferenceModel<float>> models_;  // one per micro-batch: its activations
  parallel::Range tied_;  // GPT-2: the token embedding, the head's weight (empty for Simple)
  bool tied_decay_ = true;
  std::vector<float> m_tied_, v_tied_;  // the last stage's moments of its copy
  std::unique_ptr<CpuTensorParallel> tp_;  // PP x TP: this rank's slices of its stage
  bool holds_tied_copy() const { return !tied_.empty() && span_.head && !span_.embedding; }
  // activation_checkpoint_interval: the stage's chunks (empty: off), each slot's chunk inputs
  // [slot][chunk] (empty for a chunk that starts with the embedding), the peak of the activation
  // bytes held (models' activations and kept inputs) after any forward.
  int ckpt_interval_ = 0;
  std::vector<model::LayerSpan> chunks_;
  std::vector<std::vector<std::vector<float>>> ckpt_in_;
  std::size_t peak_act_ = 0;

  void note_activations() {
    std::size_t b = 0;
    for (const auto& m : models_) b += m.activation_bytes();
    for (const auto& slot : ckpt_in_)
      for (const auto& v : slot) b += v.size() * sizeof(float);
    peak_act_ = std::max(peak_act_, b);
  }

  // One micro-batch's forward of the stage into `out` (no head) or the loss (head).
  double forward_stage(int slot, const std::int32_t* tokens, const std::int32_t* labels, const std::vector<float>& in,
                       std::vector<float>& out) {
    if (chunks_.empty()) {
      const double l = models_[std::size_t(slot)].forward_span(params_.data(), span_, tokens, labels, in.data(),
                                                               opt_.batch, opt_.seq, &out);
      note_activations();
      return l;
    }
    std::vector<std::vector<float>>& keep = ckpt_in_[std::size_t(slot)];
    keep.assign(chunks_.size(), {});
    std::vector<float> x = span_.embedding ? std::vector<float>() : in;
    double loss = 0;
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      keep[c] = std::move(x);
      x.clear();
      loss = models_[0].forward_span(params_.data(), chunks_[c], tokens, labels,
                                     chunks_[c].embedding ? nullptr : keep[c].data(), opt_.batch, opt_.seq, &x);
      note_activations();
    }
    if (!span_.head) out = std::move(x);
    return loss;
  }

  // Its backward from `dout` (no head) or the loss (head), d(input) into `din` (no embedding).
  void backward_stage(int slot, const std::int32_t* tokens, const std::int32_t* labels, const std::vector<float>& dout,
                      std::vector<float>& din) {
    const double scale = 1.0 / plan_.micro_batches;
    if (chunks_.empty()) {
      models_[std::size_t(slot)].backward_span(params_.data(), grads_.data(), dout.data(), scale, &din);
      return;
    }
    std::vector<std::vector<float>>& keep = ckpt_in_[std::size_t(slot)];
    std::vector<float> dy = span_.head ? std::vector<float>() : dout, dx, y;
    for (std::size_t c = chunks_.size(); c-- > 0;) {
      // The chunk again from its kept input: the same activations, then its backward.
      models_[0].forward_span(params_.data(), chunks_[c], tokens, labels, chunks_[c].embedding ? nullptr : keep[c].data(),
                              opt_.batch, opt_.seq, &y);
      note_activations();
      dx.clear();
      models_[0].backward_span(params_.data(), grads_.data(), chunks_[c].head ? nullptr : dy.data(), scale,
                               chunks_[c].embedding ? nullptr : &dx);
      dy = std::move(dx);
    }
    keep.clear();  // this micro-batch's inputs are done with
    if (!span_.embedding) din = std::move(dy);
  }

  // After the backwards: each stage's gradients averaged over its replicas and a tied weight's
  // summed over its two stages, in one all-reduce over the flat buffer: every rank adds its
  // stage's slice (and the last stage its tied copy's gradient), zeros elsewhere.
  // ZeRO-1: each replica's updated partition to the stage's other replicas (one all-reduce over
  // the flat buffer, every rank adding its partition, zeros elsewhere: the sum is exact).
  void share_params() {
    std::vector<float> p(table_.flat_size(), 0.f);
    std::copy(params_.begin() + std::ptrdiff_t(state_.begin), params_.begin() + std::ptrdiff_t(state_.end),
              p.begin() + std::ptrdiff_t(state_.begin));
    comm_->all_reduce(p.data(), p.size(), DType::F32, comm::ReduceOp::Sum, nullptr);
    std::copy(p.begin() + std::ptrdiff_t(owned_.begin), p.begin() + std::ptrdiff_t(owned_.end),
              params_.begin() + std::ptrdiff_t(owned_.begin));
  }

  void reduce_grads() {
    if (dp_ == 1 && tied_.empty()) return;
    const std::size_t n = table_.flat_size();
    std::vector<float> g(n, 0.f);
    auto take = [&](parallel::Range r) {
      std::copy(grads_.begin() + std::ptrdiff_t(r.begin), grads_.begin() + std::ptrdiff_t(r.end),
                g.begin() + std::ptrdiff_t(r.begin));
    };
    take(owned_);
    if (holds_tied_copy()) take(tied_);
    comm_->all_reduce(g.data(), n, DType::F32, comm::ReduceOp::Sum, nullptr);
    auto give = [&](parallel::Range r) {
      for (std::size_t i = r.begin; i < r.end; ++i) grads_[i] = g[i] / float(dp_);
    };
    give(owned_);
    if (holds_tied_copy()) give(tied_);
  }
};

}  // namespace

std::unique_ptr<TrainBackend> make_cpu_pipeline_backend(const BackendOptions& o, const TrainConfig& c) {
  return std::make_unique<CpuPipelineBackend>(o, c);
}

}  // namespace cutrain::train
