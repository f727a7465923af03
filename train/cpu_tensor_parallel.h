// @brief Tensor parallelism of the CPU backend: a rank's share of the model on
// parallel/tensor_parallel_plan.h's slices, computed by the reference model
// (model/reference_tp.cpp) with its group's reductions (parallel/tp_reducer.h). Every rank keeps
// the flat layout: its slices and the replicated tensors hold values, the other ranks' slices stay
// zero (params, gradients and moments: a zero gradient and zero moments leave a zero parameter
// unchanged under AdamW). So the optimizer runs over the flat buffer as without tensor
// parallelism; the gradient norm counts each element once over the group (`counted`); a checkpoint
// is the group's sum of its counted elements: the single process's flat state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/reference_model.h"
#include "parallel/tensor_parallel_plan.h"
#include "parallel/tp_reducer.h"
#include "train/cpu_backend.h"

namespace cutrain::train {

class CpuTensorParallel {
 public:
  // o.tp_comm: the group; o.tensor_parallel its size; o.domino the pieces.
  CpuTensorParallel(const BackendOptions& o, const model::TransformerParams& table);
  // What this rank's model computes (a pipeline stage: part of the model), for the description.
  void set_span(bool embedding, int blocks, bool head);
  // The slice and the reducer into a model.
  void attach(model::ReferenceModel<float>& m) { m.set_tensor_parallel(slice_); }
  void begin_pass() { reducer_->begin_pass(); }
  void end_pass() { reducer_->end_pass(); }
  // Zeroes what this rank does not hold (the other ranks' slices).
  void keep_held(std::vector<float>& flat) const;
  // The sum of squares of the counted elements of flat [begin, end).
  double counted_sq(const float* flat, std::size_t begin, std::size_t end) const;
  const std::vector<unsigned char>& counted() const { return layout_.counted; }
  // Collective over the group: `flat` (every rank's full flat buffer) becomes the group's sum of
  // the counted elements: the whole model's state on every rank.
  void combine(std::vector<float>& flat);
  comm::Communicator& group() { return reducer_->group(); }
  std::string describe() const;       // this rank's slice, the group's communication
  std::string run_summary() const;    // Domino's modelled overlap
 private:
  model::TpSlice slice_;
  parallel::TpLayout layout_;
  std::unique_ptr<parallel::CommTpReducer> reducer_;
  int pieces_ = 1;
  model::ModelDims table_dims_;
  int batch_ = 1, seq_ = 1;
  parallel::TpCommPlan plan_;
};

}  // namespace cutrain::train
