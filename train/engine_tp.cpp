// The GPU engine's tensor parallelism above one rank (docs/distributed.md): the rank grid's NCCL
// groups, the model's slice, the gradient norm over the tensor-parallel group and the state summed
// over it for a checkpoint (the CPU backend's convention: each rank keeps the whole model's flat
// layout, its slices and the replicated tensors holding values, the rest zero; the group's sum of
// the counted elements is the single process's state).
#include <cuda_runtime.h>

#include <algorithm>
#include <iostream>

#include "kernels/reduce.cuh"
#include "model/tp_slice_runs.h"
#include "parallel/group_communicator.h"
#include "parallel/rank_grid.h"
#include "runtime/check.h"
#include "train/engine.h"

namespace cutrain::train {

// Collective over the world (ncclCommSplit): every rank calls it, in the constructor, before the
// ZeRO plan, which then runs over the data-parallel group of this rank's tensor index.
void GpuEngine::setup_tensor_grid() {
  const std::string& flag = opt_.tensor_parallel_flag;
  const int T = opt_.tensor_parallel;
  CUTRAIN_CHECK(comm_ && comm_->device() >= 0, "train: ", flag, " ", T,
                " on the GPU engine: each tensor-parallel rank is a process on its own GPU over NCCL; expected a launch "
                "of ", T, " ranks or a multiple (cutrain launch --num_gpus ", T, "), found ",
                comm_ ? std::string(comm_->backend_name()) + " communicator" : std::string("a single process"));
  CUTRAIN_CHECK(opt_.pipeline_stages <= 1 && opt_.stages_in_process <= 1, "train: ", flag, " ", T,
                " with a pipeline (--pipeline_parallel_size ", opt_.pipeline_stages, ", --pipeline_stages_in_process ",
                opt_.stages_in_process, ") on the GPU engine is not built; expected data x tensor parallelism, or "
                "--device cpu");
  CUTRAIN_CHECK(cfg_.zero_optimization.stage <= 2, "train: zero_optimization.stage ", cfg_.zero_optimization.stage,
                " with ", flag, " ", T, " on the GPU engine: stage 3's unit shards are not built with tensor "
                "parallelism; expected stage 0, 1 or 2 (DeepSpeed's AutoTP training takes 0-2), or --device cpu");
  CUTRAIN_CHECK(cfg_.optimizer.type != OptimizerType::Lamb, "train: optimizer.type Lamb with ", flag, " ", T,
                ": its trust ratios need whole tensors on one rank; expected AdamW");
  CUTRAIN_CHECK(!opt_.teacher, "train: --mos (distillation) with ", flag, " ", T,
                " on the GPU engine is not built (the teacher's logits are whole rows); expected one of them");
  const parallel::RankGrid grid =
      parallel::make_rank_grid(comm_->world_size(), 1, T, "--pipeline_parallel_size", flag);
  world_ = comm_;
  const int rank = world_->rank();
  tp_slice_ = parallel::make_tp_slice(table_.dims(), T, grid.coord(rank).tp, flag);
  parallel::check_domino(opt_.domino, opt_.batch, T, "--domino");
  tp_slice_.pieces = opt_.domino;  // Domino: the blocks' all-reduces piece by piece on a second stream
  tp_layout_ = parallel::make_tp_layout(table_, tp_slice_);
  // The same splits in the same order on every rank: the tensor-parallel groups, then (with more
  // than one replica) the data-parallel groups.
  tp_comm_ = parallel::make_group(world_, grid.tp_group(rank));
  comm_ = grid.dp > 1 ? parallel::make_group(world_, grid.dp_group(rank)) : nullptr;
  CUTRAIN_CHECK(tp_comm_->world_size() == T && tp_comm_->rank() == tp_slice_.rank, "train: the tensor-parallel group ",
                "of rank ", rank, " came out as rank ", tp_comm_->rank(), " of ", tp_comm_->world_size(),
                ", expected rank ", tp_slice_.rank, " of ", T);
  describe_ += ", tensor parallel degree " + std::to_string(T) + " x data parallel " + std::to_string(grid.dp) +
               " (NCCL groups of the grid)" +
               (opt_.domino > 1 ? ", Domino: " + std::to_string(opt_.domino) + " pieces per micro-batch" : "");
}

// After the ZeRO plan: the norm's scratch on ranks other than the group's first (their slices
// packed at stage 0, a copy of their partition at stages 1-2) and its fp64 sum.
void GpuEngine::setup_tp_norm() {
  tp_sumsq_ = Buffer(device_allocator(), sizeof(double), stream_);
  if (tp_slice_.rank == 0) return;
  std::size_t count = 0;
  if (zero_.partitioned()) {
    count = zero_.norm_range().size();
  } else {
    for (const auto& [idx, run] : model::tp_sliced_runs(table_, tp_slice_)) count += run.count();
  }
  tp_norm_pack_ = Buffer(device_allocator(), std::max<std::size_t>(count, 1) * dtype_size(plan_.grad), stream_);
  tp_norm_count_ = count;
}

void GpuEngine::tp_mask_held(std::vector<float>& v) const {
  if (v.empty()) return;
  CUTRAIN_CHECK(v.size() == tp_layout_.held.size(), "gpu engine: a state of ", v.size(),
                " elements for a tensor-parallel layout of ", tp_layout_.held.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!tp_layout_.held[i]) v[i] = 0.f;
}

// Each element once over the group: the counted elements (this rank's slices; the replicated
// tensors on the group's first rank) summed in fp32 over the group (exact: one term is non-zero).
void GpuEngine::tp_group_sum(std::vector<float>& v) const {
  if (v.empty()) return;
  CUTRAIN_CHECK(v.size() == tp_layout_.counted.size(), "gpu engine: a state of ", v.size(),
                " elements for a tensor-parallel layout of ", tp_layout_.counted.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!tp_layout_.counted[i]) v[i] = 0.f;
  Buffer d(device_allocator(), v.size() * sizeof(float), stream_);
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(d.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
  tp_comm_->all_reduce(d.get(), v.size(), DType::F32, comm::ReduceOp::Sum, stream_);
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(v.data(), d.get(), v.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// Each element's square once over the world. Stage 0 (the data-parallel mean on every replica):
// the group's first rank sums the squares of its whole flat gradient (its slices, the replicated
// tensors, zeros elsewhere), the others those of their slices, packed, and the fp64 sums are added
// over the group. Stages 1-2 (each replica's partition of the reduced gradient): the group's first
// rank sums its partition as it is, the others a copy with the replicated tensors' elements
// zeroed, and the sums are added over the world. Every rank derives the same norm, clip
// coefficient and skip flag (grad_norm_clip's formula, kernels/reduce.cuh).
void GpuEngine::enqueue_tp_norm(float* norm, float* clip_scale, int* nonfinite) {
  double* ss = tp_sumsq_.as<double>();
  const std::size_t es = dtype_size(plan_.grad);
  const char* g = static_cast<const char*>(grads_.get());
  char* pack = static_cast<char*>(tp_norm_pack_.get());
  if (zero_.partitioned()) {
    const parallel::Range r = zero_.norm_range();
    if (tp_slice_.rank == 0) {
      kernels::grad_sumsq(stream_, g + r.begin * es, plan_.grad, r.size(), ss, norm_scratch_.get());
    } else {
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(pack, g + r.begin * es, r.size() * es, cudaMemcpyDeviceToDevice, stream_));
      for (const parallel::Range& q : tp_layout_.replicated) {
        const std::size_t lo = std::max(q.begin, r.begin), hi = std::min(q.end, r.end);
        if (lo < hi) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(pack + (lo - r.begin) * es, 0, (hi - lo) * es, stream_));
      }
      kernels::grad_sumsq(stream_, pack, plan_.grad, r.size(), ss, norm_scratch_.get());
    }
    world_->all_reduce_sum_f64(ss, 1, stream_);
  } else {
    if (tp_slice_.rank == 0) {
      kernels::grad_sumsq(stream_, g, plan_.grad, n_, ss, norm_scratch_.get());
    } else {
      char* dst = pack;
      for (const auto& [idx, run] : model::tp_sliced_runs(table_, tp_slice_)) {
        CUTRAIN_CUDA_CHECK(cudaMemcpy2DAsync(dst, run.width * es, g + (table_.tensor(idx).offset + run.offset) * es,
                                             run.pitch * es, run.width * es, run.height, cudaMemcpyDeviceToDevice,
                                             stream_));
        dst += run.count() * es;
      }
      kernels::grad_sumsq(stream_, pack, plan_.grad, tp_norm_count_, ss, norm_scratch_.get());
    }
    tp_comm_->all_reduce_sum_f64(ss, 1, stream_);
  }
  kernels::grad_norm_from_sumsq(stream_, ss, cfg_.gradient_clipping, norm, clip_scale, nonfinite, loss_scale_d());
}

}  // namespace cutrain::train
