// @brief Pipeline parallelism on the CPU backend: one stage per rank over the host communicator
// (runtime/comm/host_communicator.h), on parallel/pipeline_plan.h's partition and 1F1B schedule.
// The step's gradient_accumulation_steps micro-batches flow through the stages: a stage receives
// its input activations from the previous one (stage 0: the tokens), sends its output to the next
// and, in backward, receives the output's gradient and sends its input's back. Each rank keeps and
// updates the params, gradients and moments of its own layers; the global gradient norm is the
// fp64 sum of the stages' squares; the loss (computed on the last stage) is shared with every
// rank. Checkpoints gather the stages' slices into the one flat state (rank 0 writes it).
// GPT-2's head is tied to the token embedding (DeepSpeed's TiedLayerSpec): the last stage keeps a
// copy of it, the first and last stages' gradients of it are summed after the backwards, and both
// copies take the same optimizer update.
// Data x pipeline: world = dp x stages, ranks laid out as DeepSpeed's grid (pipe outer, data
// inner: rank = stage x dp + replica); each replica pipelines its own micro-batches and, after the
// backwards, each stage's gradients are averaged over its replicas (one all-reduce over the flat
// buffer, which also sums a tied weight's two stages). ZeRO-1 (zero_optimization.stage 1): each
// replica keeps the moments of its partition of the stage's layers and updates it; the replicas'
// updated params are then shared. Stages 2 and 3 are refused (DeepSpeed's pipeline takes ZeRO-1).
// Each stage runs its part of parallel/pipeline_executor.h's program with one reference model per
// activation slot; with activation_checkpoint_interval N (DeepSpeed's pipeline key) the stage's
// layers form chunks of N, a forward keeps each chunk's input only and the backward recomputes each
// chunk from it (one model for all chunks): the same losses and gradients, fewer activations held
// (the run summary reports stage 0's peak).
#pragma once

#include <memory>

#include "train/cpu_backend.h"

namespace cutrain::train {

std::unique_ptr<TrainBackend> make_cpu_pipeline_backend(const BackendOptions& options, const TrainConfig& config);

}  // namespace cutrain::train
