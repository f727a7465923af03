// GpuEngine::eval_loss: the validation forward of one micro-batch (no gradients, no optimizer),
// outside the captured step graph, on the same activations and stream.
#include <cstring>

#include "runtime/check.h"
#include "train/engine.h"

namespace cutrain::train {

double GpuEngine::eval_loss(const std::int32_t* tokens, const std::int32_t* labels) {
  ensure_state();  // offloaded params come back first
  const std::size_t per_micro = std::size_t(opt_.batch) * opt_.seq;
  // The staging and the first micro-batch slot are free between steps (each step ends synchronized);
  // the captured graph copies them afresh from the staging on every replay.
  std::memcpy(tokens_h_, tokens, per_micro * 4);
  std::memcpy(labels_h_, labels, per_micro * 4);
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(tokens_d_.get(), tokens_h_, per_micro * 4, cudaMemcpyHostToDevice, stream_));
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(labels_d_.get(), labels_h_, per_micro * 4, cudaMemcpyHostToDevice, stream_));
  float* flags = flags_d_.as<float>();
  int* status = reinterpret_cast<int*>(flags + accum_ + 3);
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(status, 0, 2 * accum_ * sizeof(int), stream_));
  model::FlatParams flat(table_, params_.get(), plan_.param);
  if (sharded_) sharded_->begin_pass(params_.as<bf16>(), eval_order_);  // stage 3: gathered unit by unit
  model::ParamAccess& P = sharded_ ? static_cast<model::ParamAccess&>(*sharded_) : flat;
  model_->set_shape(opt_.batch, opt_.seq);  // validation runs whole samples (a curriculum's step sets its own)
  if (pipeline_ && pipeline_->link())  // over ranks: through the stages, the loss from the last one
    pipeline_->enqueue_eval(stream_, P, grads_.get(), plan_.grad, tokens_d_.as<std::int32_t>(),
                            labels_d_.as<std::int32_t>(), flags, status);
  else
    model_->forward_loss(stream_, P, tokens_d_.as<std::int32_t>(), labels_d_.as<std::int32_t>(), flags, status);
  if (sharded_) sharded_->end_pass(stream_);
  read_flags();  // synchronizes; a bad token or label is an error naming its position
  return flags_h_[0];
}

}  // namespace cutrain::train
