// @brief The CPU training backend: the fp32 reference model and a host AdamW or LAMB, with the engine's
// clipping and NaN/Inf skip; data parallel (AdamW) with ZeRO stages 0-3 over the host communicator under
// a launcher (train/cpu_zero.h), pipeline (train/cpu_pipeline.h) and tensor parallelism
// (train/cpu_tensor_parallel.h) and their grid; MoE's expert parallelism (train/cpu_expert_parallel.h). Slow; for tests, CI and machines without a GPU.
#pragma once

#include <memory>
#include <string>

#include "train/config.h"
#include "train/mos_options.h"
#include "train/train_backend.h"

namespace cutrain::comm {
class Communicator;
}

namespace cutrain::train {

struct BackendOptions {
  model::ModelDims dims;
  int batch = 4, seq = 512;
  // The most tokens one micro-batch may hold under a sequence-length curriculum
  // (TrainBackend::set_seq_shape; reshape's rows may hold a few more than batch x seq); 0: batch x seq.
  std::size_t max_tokens = 0;
  std::uint64_t seed = 42;
  bool activation_checkpointing = false;
  bool recompute_gelu = false;  // GPT-2 on the GPU: llm.c's -r 1 (model/transformer_gpu.h)
  // The GPU attention backward without order-dependent atomics (false: dQ by fp32 reduce-adds,
  // faster at head dim 64, not bit-reproducible run to run; kernels/attention.cuh).
  bool deterministic_attention = true;
  bool cuda_graph = true;
  bool causal = false;
  // BERT on the GPU: the masked-LM head's slots per sequence (max_predictions_per_seq; 0: every
  // position). A sequence with more labels is an error. The CPU reference computes every row.
  int max_predictions = 0;
  // Data parallelism: the communicator to reduce over (NCCL for the GPU engine, the host
  // communicator for the CPU backend: train/cpu_zero.h). Null: the backend reads the launch
  // environment (runtime/comm/launch_env.h) and creates one only when WORLD_SIZE > 1; a single
  // process without launcher variables never makes one.
  std::shared_ptr<comm::Communicator> comm;
  // Pipeline parallelism (CPU backend: train/cpu_pipeline.h): stages > 1 splits the model's
  // layers over that many ranks by DeepSpeed's partition_method.
  int pipeline_stages = 1;
  std::string partition_method = "parameters";
  // The GPU engine (train/gpu_pipeline.h): `pipeline_engine` runs the step through the pipeline's
  // 1F1B program at degree 1 (--pipeline_parallel_size or the config's pipeline section given);
  // `stages_in_process` > 1 runs that many stages in this one process (virtual stages).
  // `pipeline_over_ranks`: the pipeline of `pipeline_stages` stages over the ranks of `comm` (or
  // the launch environment's NCCL world), one stage per rank, activations sent over NCCL; implied
  // by pipeline_stages > 1 on the GPU engine, and set alone to run that path at one stage (the
  // world-size-1 test).
  bool pipeline_engine = false;
  int stages_in_process = 1;
  bool pipeline_over_ranks = false;
  // DeepSpeed's pipeline.activation_checkpoint_interval on the CPU pipeline (train/cpu_pipeline.h):
  // each chunk of this many of a stage's layers keeps only its input and is recomputed in
  // backward; 0: every activation kept.
  int activation_checkpoint_interval = 0;
  // Tensor parallelism (CPU backend: train/cpu_tensor_parallel.h): the degree (its source named in
  // errors: the flag or tensor_parallel.autotp_size) and Domino's pieces per micro-batch. With
  // tensor_parallel > 1 make_cpu_backend lays the ranks out on parallel/rank_grid.h's grid and
  // passes each backend its groups: `comm` the data-parallel group (or, with a pipeline, the
  // stages x replicas of this tensor-parallel index) and `tp_comm` the tensor-parallel group.
  int tensor_parallel = 1;
  std::string tensor_parallel_flag = "--tensor_parallel_size";
  int domino = 1;
  std::shared_ptr<comm::Communicator> tp_comm;
  // The GPU engine: the tensor-parallel plan at degree 1 (the flag or autotp_size given), the
  // blocks' all-reduces over `tp_comm` or, without one, a one-rank NCCL communicator. Above one
  // rank the GPU engine splits its NCCL world into the grid's groups itself (train/engine_tp.cpp).
  bool tensor_parallel_engine = false;
  // Expert parallelism (CPU backend: train/cpu_expert_parallel.h): DeepSpeed's ep_size over the
  // data-parallel ranks. With expert_parallel > 1 make_cpu_backend passes each backend `comm` (the
  // data-parallel world), `ep_comm` (its expert-parallel group) and `expert_dp_comm` (the ranks
  // holding its experts). Not with tensor or pipeline parallelism.
  int expert_parallel = 1;
  std::shared_ptr<comm::Communicator> ep_comm, expert_dp_comm;
  // Knowledge distillation (Mixture-of-Students, train/mos_options.h; CPU backend): the teacher,
  // whose forward runs beside the student's on every micro-batch until distill.stop_kd_step, and
  // the loss's weights and temperature. The backend takes the pointer; once it frees the teacher
  // at the stop step, the memory goes back when the caller holds no other copy. Null: no
  // distillation. Not with tensor or pipeline parallelism.
  std::shared_ptr<const Teacher> teacher;
  MosOptions distill;
  // GPU engine: the MoE layers exchange their tokens over the expert-parallel group (NCCL) even at
  // ep_size 1 (a one-rank group; a single process then makes a world-1 NCCL communicator). Always
  // so at ep_size > 1.
  bool moe_exchange = false;
};

std::unique_ptr<TrainBackend> make_cpu_backend(const BackendOptions& options, const TrainConfig& config);

}  // namespace cutrain::train
