// @brief The GPU engine's pipeline step: the step's micro-batches run through
// parallel/pipeline_executor.h's program (the 1F1B schedule of parallel/pipeline_plan.h, the
// partition's layer range per stage) on model::GpuModel's stage spans. One stage (the
// degree-1 pipeline, --pipeline_parallel_size 1) is the engine's own model running the whole
// layer range: forward and backward of each micro-batch in turn, the plain engine's kernels in
// the plain engine's order. Several stages in this one process ("virtual stages",
// --pipeline_stages_in_process P): each stage has one model per activation slot, each running its
// stage's layers, and a stage's output (and in backward its input's gradient) is handed to the
// neighbour stage's model as a device-to-device copy on the stream, no communicator. Every stage
// writes its layers' gradients into the one flat gradient buffer, each stage's backwards in
// micro-batch order, so the gradients accumulate in the plain engine's order.
// Stages on several GPUs (the hand-over as NCCL send / recv between stage ranks) are not built.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer_gpu.h"
#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_plan.h"

namespace cutrain::train {

class GpuPipeline {
 public:
  using ModelFactory = std::function<std::unique_ptr<model::GpuModel>()>;
  // Every stage of `plan` in this process. `whole`: the engine's model, the stage of a one-stage
  // plan; `make` builds the models of a plan of more stages (one per stage and slot).
  GpuPipeline(const model::TransformerParams& table, const parallel::PipelinePlan& plan,
              model::GpuModel* whole, const ModelFactory& make);

  // Called before each action with the model and the micro-batch it runs (random-LTD's indices).
  using Prepare = std::function<void(model::GpuModel&, int micro)>;
  // The step's micro-batches: tokens / labels [M][per_micro] (device), d_loss [M], d_status
  // [M][2] (as forward_backward's, per micro-batch), gradients into `grads` (written by each
  // stage's first micro-batch, added by the others).
  void enqueue(cudaStream_t s, model::ParamAccess& params, void* grads, DType grad_type, const std::int32_t* tokens,
               const std::int32_t* labels, std::size_t per_micro, float grad_scale, float* d_loss, int* d_status,
               const Prepare& prepare = {});

  int stages() const { return plan_.stages; }
  const parallel::PipelinePlan& plan() const { return plan_; }
  const std::vector<parallel::StageStep>& program() const { return program_; }
  // Every model of the pipeline (the engine's own included), for settings that apply to all.
  std::vector<model::GpuModel*> models() const;
  void release_workspace();     // the models this pipeline owns
  std::size_t workspace_bytes() const;  // of the models it owns (0 for one stage)
  // "pipeline (gpu): 2 stages in this process, ...; 1F1B over M micro-batches, program F0 ..."
  std::string describe(const std::vector<parallel::PipelineLayer>& layers) const;

 private:
  parallel::PipelinePlan plan_;
  std::vector<parallel::StageStep> program_;
  std::vector<std::vector<model::GpuModel*>> models_;  // [stage][slot]
  std::vector<std::unique_ptr<model::GpuModel>> owned_;
  std::size_t act_elems_ = 0;  // one hand-over: B*S x hidden
};

}  // namespace cutrain::train
