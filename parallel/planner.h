// @brief The parallel-layout planner behind `cutrain plan`, the pure part (no CUDA): for the BF16
// example's model (the seed architecture) on N GPUs, the per-GPU memory and a predicted step time
// of data parallelism with ZeRO stages 0-3, pipeline parallelism (1F1B over the accumulation's
// micro-batches) and Megatron tensor parallelism, from one GPU's kernel timings
// (parallel/planner_timings.h) and a ring-collective cost model.
//
// Memory: the engine's own buffers, sized as train/engine.cpp and model/transformer_gpu.cpp
// allocate them (each rounded to the caching allocator's 512 B): the persistent state of the
// precision layout under the ZeRO plan (parallel/zero_plan.h, zero_shard_layout.h), the model's
// activations and gradient scratch (with activation checkpointing one block's set plus every
// block's input), and the fixed buffers (cuBLASLt workspace, reduction scratch, token staging,
// stage 3's gather buffers, a pipeline's send/receive buffers). Pipeline stage s keeps the
// activations of min(S - s, M) micro-batches (1F1B's in-flight count); tensor parallelism splits
// QKV, the attention output, FC1 and GELU [M, ·] by the degree and keeps the [M, hidden] ones whole.
//
// Communication (ring algorithms, n ranks, B bytes of the whole buffer, link bandwidth bw per
// direction, latency alpha per step):
//   all-reduce       2 (n-1) alpha + 2 (n-1)/n B / bw
//   reduce-scatter   (n-1) alpha + (n-1)/n B / bw       all-gather: the same
//   send/recv        alpha + B / bw
// Step time follows the engine's schedule: ZeRO 0-2 reduce after the backward and gather after
// the optimizer (exposed); stage 3 prefetches each unit's gather behind the compute and, with
// overlap_comm, reduce-scatters during the last micro-batch's backward; a pipeline step is
// (M + S - 1) slots of its slowest stage's forward + backward plus the two neighbour transfers;
// Megatron's per-layer all-reduces (2 forward, 2 backward, 2 more in the recompute) sit on the
// critical path (no Domino overlap modelled).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model/transformer_params.h"
#include "parallel/planner_timings.h"

namespace cutrain::parallel {

// Bytes per parameter of each persistent buffer of a precision layout (train/precision.h decides
// which exist and their dtypes; `cutrain plan` fills this from it).
struct StateBytes {
  std::string label;  // "bf16_full", "baseline", ...
  double params = 2, grads = 2, master = 0, moments = 8, compensation = 0;
};

// The training step being planned: the model, one GPU's micro-batch and the config's choices.
struct PlanModel {
  model::ModelDims dims;
  int micro_batch = 4, seq = 512, accumulation = 1;
  bool checkpointing = false;
  bool causal = false;
  bool deterministic_attention = true;  // cutrain.attention_backward: fast needs an fp32 dQ scratch
  StateBytes state;
  bool overlap_comm = true;                    // zero_optimization.overlap_comm (stage 3's schedule)
  std::size_t persistence_threshold = 100000;  // zero_optimization.stage3_param_persistence_threshold
};

enum class LayoutKind { Zero, Pipeline, Tensor };

// One way to spread the step over num_gpus = dp x pp x tp GPUs. Zero: dp = num_gpus, ZeRO
// `zero_stage`; Pipeline and Tensor: the remaining GPUs are data-parallel replicas (stage 0).
struct Layout {
  LayoutKind kind = LayoutKind::Zero;
  int zero_stage = 0;
  int dp = 1, pp = 1, tp = 1;
  std::string name() const;  // "zero3", "pp4", "tp2 x dp2"
};

// The link between the GPUs: bandwidth per direction per GPU (GB/s, 1e9 bytes/s) and the latency
// of one step of a ring algorithm.
struct LinkModel {
  double gbps = 450;        // NVLink 4 (H100 / H200 SXM): 900 GB/s bidirectional, 450 each way
  double latency_us = 10;
};

double allreduce_seconds(double bytes, int ranks, const LinkModel& link);
double reduce_scatter_seconds(double bytes, int ranks, const LinkModel& link);
double all_gather_seconds(double bytes, int ranks, const LinkModel& link);
double send_recv_seconds(double bytes, const LinkModel& link);

// Megatron tensor parallelism at degree `tp`: the bytes one block all-reduces per micro-batch
// (each all-reduce moves the block's [M, hidden] bf16 activation or its gradient): 2 in the
// forward (after out_proj and FC2), 2 in the backward (the inputs' gradients of QKV and FC1), 2
// more when the block is recomputed. 0 at tp = 1.
double tp_allreduce_bytes_per_layer(const PlanModel& m, int tp);
int tp_allreduces_per_layer(const PlanModel& m, int tp);

// Real parameters one GPU holds of pipeline layers [first, end) (0: the embeddings, 1..L the
// blocks, L + 1 the head; parallel/pipeline_plan.h's sequence) under Megatron's partition at
// degree tp: QKV and FC1 split by output rows (weights and biases), out_proj and FC2 by input
// columns (biases whole), LayerNorms and the position table whole, the token embedding and the
// head split by vocabulary rows.
std::size_t tp_local_params(const model::ModelDims& dims, int first, int end, int tp);

struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0;  // optimizer: master + compensation + moments
  double activations = 0;                       // activations, their gradients and the logits
  double buffers = 0;                           // workspace, scratch, staging, comm buffers
  double total() const { return params + grads + optimizer + activations + buffers; }
};

struct LayoutPrediction {
  Layout layout;
  MemoryBreakdown memory;  // the most loaded GPU (a pipeline: its largest stage)
  int memory_stage = 0;    // a pipeline: the stage of `memory`
  std::size_t local_params = 0;
  double compute_s = 0;      // kernels on the critical path (a pipeline: its slots, bubble included)
  double comm_s = 0;         // all collective and point-to-point time of the step
  double exposed_comm_s = 0; // the part not hidden behind compute
  double optimizer_s = 0;    // optimizer + gradient norm
  double step_s = 0;
  double bubble = 0;         // a pipeline: (S - 1) / (M + S - 1)
  double tokens_per_step = 0;  // dp x accumulation x micro_batch x seq
  std::string note;            // what the comm is
};

// Throws cutrain::Error naming the flag: layers, heads and the layout's degrees must divide as the
// layout needs (pp <= layers, tp divides the heads, the degrees' product divides num_gpus), head
// dim 64 or 128, only the seed architecture without MoE.
void check_layout(const PlanModel& m, const Layout& l, int num_gpus);

// One GPU, no collectives (the single-process engine that `cutrain train` runs): what its caching
// allocator's peak should read during training (the GPU test compares them).
MemoryBreakdown single_gpu_memory(const PlanModel& m);
// One rank of the engine under ZeRO `stage` at data-parallel world size `world` with a
// communicator (at world size 1 too: the engine's one-rank path, stage 3 sharded).
MemoryBreakdown zero_rank_memory(const PlanModel& m, int stage, int world);

LayoutPrediction predict(const PlanModel& m, const Layout& l, const KernelTimings& t, const LinkModel& link);

// The layouts `cutrain plan` lists for num_gpus: zero0..zero3 at dp = num_gpus, a pipeline of
// pp stages and tensor parallelism of degree tp (the rest data parallel), each named by
// `names` ("zero0".."zero3", "pp", "tp"). Throws naming --layouts for an unknown name.
std::vector<Layout> make_layouts(const std::vector<std::string>& names, int num_gpus, int pp, int tp);

// The table: one row per layout, GB = 1024^3 bytes.
std::string format_plan_table(const std::vector<LayoutPrediction>& rows, double gpu_memory_gb);

}  // namespace cutrain::parallel
