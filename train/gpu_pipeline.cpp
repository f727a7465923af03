#include "train/gpu_pipeline.h"

#include <sstream>

#include "runtime/check.h"
#include "runtime/timing.h"

namespace cutrain::train {

GpuPipeline::GpuPipeline(const model::TransformerParams& table, const parallel::PipelinePlan& plan,
                         model::GpuModel* whole, const ModelFactory& make)
    : plan_(plan), program_(parallel::pipeline_program(plan.stages, 0, plan.stages, plan.micro_batches)) {
  CUTRAIN_CHECK(int(plan_.parts.size()) == plan_.stages, "pipeline (gpu): a plan of ", plan_.stages, " stages with ",
                plan_.parts.size(), " parts");
  models_.resize(std::size_t(plan_.stages));
  for (int s = 0; s < plan_.stages; ++s) build_stage(s, whole, make);
  act_elems_ = std::size_t(table.dims().hidden);  // a hand-over is per_micro (B x S) rows of it
}

GpuPipeline::GpuPipeline(const model::TransformerParams& table, const parallel::PipelinePlan& plan,
                         std::shared_ptr<comm::Communicator> link, model::GpuModel* whole, const ModelFactory& make)
    : plan_(plan), link_(std::move(link)) {
  CUTRAIN_CHECK(int(plan_.parts.size()) == plan_.stages, "pipeline (gpu): a plan of ", plan_.stages, " stages with ",
                plan_.parts.size(), " parts");
  CUTRAIN_CHECK(link_ && link_->world_size() == plan_.stages, "pipeline (gpu): ", plan_.stages,
                " stages over ranks need a pipeline group of as many ranks, found ",
                link_ ? std::to_string(link_->world_size()) : std::string("none"));
  CUTRAIN_CHECK(link_->device() >= 0, "pipeline (gpu): the pipeline group must be a device (NCCL) communicator, found ",
                link_->backend_name());
  const int stage = link_->rank();
  program_ = parallel::pipeline_program(plan_.stages, stage, stage + 1, plan_.micro_batches);
  exchanges_ = parallel::pipeline_exchanges(plan_.stages, stage, plan_.micro_batches);
  models_.resize(std::size_t(plan_.stages));
  build_stage(stage, whole, make);
  act_elems_ = std::size_t(table.dims().hidden);
}

void GpuPipeline::build_stage(int s, model::GpuModel* whole, const ModelFactory& make) {
  if (plan_.stages == 1) {
    CUTRAIN_CHECK(whole && whole->whole_model(), "pipeline (gpu): a one-stage pipeline runs the engine's whole model");
    models_[0].push_back(whole);
    return;
  }
  const parallel::PipelineStage& st = plan_.parts[std::size_t(s)];
  for (int k = 0; k < parallel::pipeline_slots(s, plan_.stages, plan_.micro_batches); ++k) {
    owned_.push_back(make());
    owned_.back()->set_stage(st.first, st.end);
    models_[std::size_t(s)].push_back(owned_.back().get());
  }
}

int GpuPipeline::first_layer() const { return link_ ? plan_.parts[std::size_t(link_->rank())].first : 0; }
int GpuPipeline::end_layer() const {
  return link_ ? plan_.parts[std::size_t(link_->rank())].end : plan_.parts.back().end;
}

std::vector<model::GpuModel*> GpuPipeline::models() const {
  std::vector<model::GpuModel*> v;
  for (const auto& st : models_) v.insert(v.end(), st.begin(), st.end());
  return v;
}

void GpuPipeline::release_workspace() {
  for (auto& m : owned_) m->release_workspace();
}

std::size_t GpuPipeline::workspace_bytes() const {
  std::size_t b = 0;
  for (const auto& m : owned_) b += m->workspace_bytes();
  return b;
}

void GpuPipeline::enqueue(cudaStream_t s, model::ParamAccess& P, void* grads, DType gt, const std::int32_t* tokens,
                          const std::int32_t* labels, std::size_t per_micro, float grad_scale, float* d_loss,
                          int* d_status, const Prepare& prepare) {
  const int M = plan_.micro_batches, S = plan_.stages;
  auto model_of = [&](int stage, int micro) -> model::GpuModel& {
    return *models_[std::size_t(stage)][std::size_t(micro % parallel::pipeline_slots(stage, S, M))];
  };
  if (link_) {
    // Over ranks: this stage's program, each gap's exchange with the neighbour stages' ranks.
    begin_step({&P, grads, gt, tokens, labels, per_micro, grad_scale, d_loss, d_status, prepare});
    while (advance(s)) {
    }
    end_step(s);
    return;
  }
  const std::size_t hand_bytes = per_micro * act_elems_ * dtype_size(models_[0][0]->compute_dtype());
  for (const parallel::StageStep& a : program_) {
    model::GpuModel& m = *models_[std::size_t(a.stage)][std::size_t(a.slot)];
    if (prepare) prepare(m, a.micro);
    const bool first_micro = a.micro == 0;
    if (a.kind == parallel::PipeAction::Forward) {
      if (a.stage > 0) {
        // The previous stage's output of this micro-batch: its slot is not reused before this
        // micro-batch's backward has passed it, which comes after this forward.
        model::GpuModel& prev = model_of(a.stage - 1, a.micro);
        TimedRegion r("pipe_send_act", s, 0, 2.0 * double(hand_bytes));
        CUTRAIN_CUDA_CHECK(
            cudaMemcpyAsync(m.stage_input(s), prev.stage_output(s), hand_bytes, cudaMemcpyDeviceToDevice, s));
      }
      m.stage_forward(s, P, grads, gt, !first_micro, tokens + std::size_t(a.micro) * per_micro,
                      labels + std::size_t(a.micro) * per_micro, grad_scale, d_loss + a.micro,
                      d_status + 2 * std::size_t(a.micro));
    } else {
      m.stage_backward(s, P, grads, gt, !first_micro, tokens + std::size_t(a.micro) * per_micro);
      if (a.stage > 0) {
        // d(input) to the previous stage's model of this micro-batch, whose gradient buffer is
        // idle until that model's backward of it (its next use).
        model::GpuModel& prev = model_of(a.stage - 1, a.micro);
        TimedRegion r("pipe_send_grad", s, 0, 2.0 * double(hand_bytes));
        CUTRAIN_CUDA_CHECK(
            cudaMemcpyAsync(prev.stage_grad(s), m.stage_grad(s), hand_bytes, cudaMemcpyDeviceToDevice, s));
      }
    }
  }
}

void GpuPipeline::begin_step(const StepArgs& a) {
  CUTRAIN_CHECK(link_, "pipeline (gpu): begin_step runs a stage over ranks");
  args_ = a;
  cursor_ = 0;
  next_exchange_ = 0;
}

const parallel::PipeExchange* GpuPipeline::pending_exchange() const {
  if (next_exchange_ < exchanges_.size() && exchanges_[next_exchange_].before == cursor_)
    return &exchanges_[next_exchange_];
  return nullptr;
}

bool GpuPipeline::advance(cudaStream_t s) {
  CUTRAIN_CHECK(link_ && cursor_ <= program_.size(), "pipeline (gpu): advance past the stage's program");
  if (const parallel::PipeExchange* e = pending_exchange()) {
    exchange(s, *e, args_.per_micro);
    ++next_exchange_;
  }
  if (cursor_ == program_.size()) {
    ++cursor_;
    return false;
  }
  const parallel::StageStep& a = program_[cursor_++];
  model::GpuModel& m = *models_[std::size_t(a.stage)][std::size_t(a.slot)];
  if (args_.prepare) args_.prepare(m, a.micro);
  const std::int32_t* tok = args_.tokens + std::size_t(a.micro) * args_.per_micro;
  if (a.kind == parallel::PipeAction::Forward)
    m.stage_forward(s, *args_.params, args_.grads, args_.grad_type, a.micro != 0, tok,
                    args_.labels + std::size_t(a.micro) * args_.per_micro, args_.grad_scale, args_.d_loss + a.micro,
                    args_.d_status + 2 * std::size_t(a.micro));
  else
    m.stage_backward(s, *args_.params, args_.grads, args_.grad_type, a.micro != 0, tok);
  return true;
}

void GpuPipeline::end_step(cudaStream_t s) {
  CUTRAIN_CHECK(link_ && cursor_ == program_.size() + 1, "pipeline (gpu): end_step before the stage's program is done");
  share_words(s, args_.d_loss, args_.d_status, plan_.micro_batches);
}

void GpuPipeline::exchange(cudaStream_t s, const parallel::PipeExchange& e, std::size_t per_micro) {
  const int stage = link_->rank();
  const int M = plan_.micro_batches;
  const DType t = models_[std::size_t(stage)][0]->compute_dtype();
  const std::size_t count = per_micro * act_elems_;
  std::vector<comm::P2POp> ops;
  for (const parallel::PipeTransfer& x : e.transfers) {
    // The micro-batch's model on this stage: its output / input activation, or its gradient buffer
    // (the next stage's d(output) before the backward, d(input) after it).
    model::GpuModel& m =
        *models_[std::size_t(stage)][std::size_t(x.micro % parallel::pipeline_slots(stage, plan_.stages, M))];
    void* buf = x.kind == parallel::PipeTransfer::SendAct   ? m.stage_output(s)
                : x.kind == parallel::PipeTransfer::RecvAct ? m.stage_input(s)
                                                            : m.stage_grad(s);
    ops.push_back({x.is_send() ? comm::P2POp::Send : comm::P2POp::Recv, buf, count, x.peer});
  }
  TimedRegion r("pipe_p2p", s, 0, 2.0 * double(ops.size() * count * dtype_size(t)));
  link_->send_recv(ops, t, s);
}

void GpuPipeline::share_words(cudaStream_t s, float* d_loss, int* d_status, int count) {
  TimedRegion r("pipe_loss", s);
  link_->broadcast(d_loss, std::size_t(count), DType::F32, plan_.stages - 1, s);
  link_->all_reduce(d_status, 2 * std::size_t(count), DType::I32, comm::ReduceOp::Sum, s);
}

void GpuPipeline::enqueue_eval(cudaStream_t s, model::ParamAccess& P, void* grads, DType gt,
                               const std::int32_t* tokens, const std::int32_t* labels, float* d_loss, int* d_status) {
  CUTRAIN_CHECK(link_, "pipeline (gpu): enqueue_eval runs the stages over ranks");
  const int stage = link_->rank();
  model::GpuModel& m = *models_[std::size_t(stage)][0];
  if (plan_.stages == 1) {
    m.forward_loss(s, P, tokens, labels, d_loss, d_status);
  } else {
    const DType t = m.compute_dtype();
    const std::size_t count = std::size_t(m.rows()) * std::size_t(m.seq()) * act_elems_;
    if (stage > 0) link_->send_recv({{comm::P2POp::Recv, m.stage_input(s), count, stage - 1}}, t, s);
    // The training forward of the stage (the seed model: no dropout, nothing random): the head's
    // loss, its logits' gradient left unused; no gradient is written.
    m.stage_forward(s, P, grads, gt, false, tokens, labels, 1.f, d_loss, d_status);
    if (stage + 1 < plan_.stages) link_->send_recv({{comm::P2POp::Send, m.stage_output(s), count, stage + 1}}, t, s);
  }
  share_words(s, d_loss, d_status, 1);
}

std::string GpuPipeline::describe(const std::vector<parallel::PipelineLayer>& layers) const {
  std::ostringstream os;
  os << plan_.describe(layers) << "; ";
  if (link_)
    os << "stage " << link_->rank() << " of " << plan_.stages << " on this rank (layers " << first_layer() << "-"
       << end_layer() - 1 << ", " << models_[std::size_t(link_->rank())].size()
       << " model(s), one per activation slot), activations and their gradients sent to the neighbour stages' ranks "
          "over the "
       << link_->backend_name() << " pipeline group (" << exchanges_.size() << " grouped send/recv exchanges per step)";
  else if (plan_.stages == 1)
    os << "the GPU engine's step through the 1F1B program of the one stage (layers 0-" << plan_.parts[0].end - 1
       << ", this process)";
  else
    os << "all " << plan_.stages << " stages in this process (virtual stages: " << owned_.size()
       << " models, one per stage and activation slot, activations handed over as device copies)";
  return os.str();
}

}  // namespace cutrain::train
