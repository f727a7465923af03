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
  if (plan_.stages == 1) {
    CUTRAIN_CHECK(whole && whole->whole_model(), "pipeline (gpu): a one-stage pipeline runs the engine's whole model");
    models_[0].push_back(whole);
    return;
  }
  for (int s = 0; s < plan_.stages; ++s) {
    const parallel::PipelineStage& st = plan_.parts[std::size_t(s)];
    for (int k = 0; k < parallel::pipeline_slots(s, plan_.stages, plan_.micro_batches); ++k) {
      owned_.push_back(make());
      owned_.back()->set_stage(st.first, st.end);
      models_[std::size_t(s)].push_back(owned_.back().get());
    }
  }
  act_elems_ = std::size_t(table.dims().hidden);  // a hand-over is per_micro (B x S) rows of it
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

std::string GpuPipeline::describe(const std::vector<parallel::PipelineLayer>& layers) const {
  std::ostringstream os;
  os << plan_.describe(layers) << "; ";
  if (plan_.stages == 1)
    os << "the GPU engine's step through the 1F1B program of the one stage (layers 0-" << plan_.parts[0].end - 1
       << ", this process)";
  else
    os << "all " << plan_.stages << " stages in this process (virtual stages: " << owned_.size()
       << " models, one per stage and activation slot, activations handed over as device copies)";
  return os.str();
}

}  // namespace cutrain::train
