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
// One stage of a pipeline over ranks (--pipeline_parallel_size S, one stage per GPU): this rank's
// stage with one model per activation slot (the whole model, the engine's own, when S is 1), its
// program pipeline_program(S, s, s + 1, M), and between two actions the exchange of
// parallel/pipeline_transfers.h (the activation to stage s + 1 after a forward, the input's
// gradient to stage s - 1 after a backward, what the next action needs received) posted as one
// Communicator::send_recv (an NCCL group) over the pipeline group on the engine's stream; after the
// program the last stage's losses are broadcast to the group and the micro-batches' status words
// summed over it, so every stage's rank logs and checks the step.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer_gpu.h"
#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_plan.h"
#include "parallel/pipeline_transfers.h"
#include "runtime/comm/communicator.h"

namespace cutrain::train {

class GpuPipeline {
 public:
  using ModelFactory = std::function<std::unique_ptr<model::GpuModel>()>;
  // Every stage of `plan` in this process. `whole`: the engine's model, the stage of a one-stage
  // plan; `make` builds the models of a plan of more stages (one per stage and slot).
  GpuPipeline(const model::TransformerParams& table, const parallel::PipelinePlan& plan,
              model::GpuModel* whole, const ModelFactory& make);
  // Stage `link->rank()` of `plan` on this rank, over the pipeline group `link` (its ranks are the
  // stages: link->world_size() == plan.stages). `whole` runs a one-stage plan, as above.
  GpuPipeline(const model::TransformerParams& table, const parallel::PipelinePlan& plan,
              std::shared_ptr<comm::Communicator> link, model::GpuModel* whole, const ModelFactory& make);

  // Called before each action with the model and the micro-batch it runs (random-LTD's indices).
  using Prepare = std::function<void(model::GpuModel&, int micro)>;
  // The step's micro-batches: tokens / labels [M][per_micro] (device), d_loss [M], d_status
  // [M][2] (as forward_backward's, per micro-batch), gradients into `grads` (written by each
  // stage's first micro-batch, added by the others).
  void enqueue(cudaStream_t s, model::ParamAccess& params, void* grads, DType grad_type, const std::int32_t* tokens,
               const std::int32_t* labels, std::size_t per_micro, float grad_scale, float* d_loss, int* d_status,
               const Prepare& prepare = {});
  // Over ranks, the step in pieces, for a driver that interleaves several ranks' stages in one
  // process (the one-GPU test's loopback transport); enqueue() is begin_step, advance until false,
  // end_step. advance(): the exchange before the next action (pending_exchange(), if any) and the
  // action; false once the program is done (its last exchange then posted). end_step(): the losses
  // and status words shared over the group.
  struct StepArgs {
    model::ParamAccess* params = nullptr;
    void* grads = nullptr;
    DType grad_type = DType::F32;
    const std::int32_t* tokens = nullptr;
    const std::int32_t* labels = nullptr;
    std::size_t per_micro = 0;
    float grad_scale = 1.f;
    float* d_loss = nullptr;
    int* d_status = nullptr;
    Prepare prepare;
  };
  void begin_step(const StepArgs& args);
  bool advance(cudaStream_t s);
  void end_step(cudaStream_t s);
  const parallel::PipeExchange* pending_exchange() const;
  // Over ranks: one micro-batch's validation forward through the stages (the stage's slot-0
  // model; a one-stage plan runs the whole model's forward_loss), the loss broadcast from the last
  // stage into d_loss[0], the status words summed over the group.
  void enqueue_eval(cudaStream_t s, model::ParamAccess& params, void* grads, DType grad_type,
                    const std::int32_t* tokens, const std::int32_t* labels, float* d_loss, int* d_status);

  int stages() const { return plan_.stages; }
  // Over ranks: this rank's stage and the pipeline group; in process: -1 and null.
  int rank_stage() const { return link_ ? link_->rank() : -1; }
  const comm::Communicator* link() const { return link_.get(); }
  // This rank's stage's layers in the partition (all of them in process).
  int first_layer() const;
  int end_layer() const;
  const std::vector<parallel::PipeExchange>& exchanges() const { return exchanges_; }
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
  std::vector<std::vector<model::GpuModel*>> models_;  // [stage][slot] (over ranks: only this rank's stage filled)
  std::vector<std::unique_ptr<model::GpuModel>> owned_;
  std::size_t act_elems_ = 0;  // one hand-over: B*S x hidden
  std::shared_ptr<comm::Communicator> link_;        // over ranks: the pipeline group
  std::vector<parallel::PipeExchange> exchanges_;   // over ranks: this stage's, in program order
  StepArgs args_;             // over ranks: the step begin_step() started
  std::size_t cursor_ = 0;     // the program index advance() runs next
  std::size_t next_exchange_ = 0;
  void build_stage(int stage, model::GpuModel* whole, const ModelFactory& make);
  // Over ranks: the exchange's transfers on the stage's models' hand-over buffers.
  void exchange(cudaStream_t s, const parallel::PipeExchange& e, std::size_t per_micro);
  // Over ranks: the last stage's losses [count] to every stage, the status words [2 x count] summed.
  void share_words(cudaStream_t s, float* d_loss, int* d_status, int count);
};

}  // namespace cutrain::train
