// @brief The offload example's SimpleModel on the GPU: `nlayers` Linear(hidden, hidden) layers
// (with bias) in sequence and a cross-entropy loss over `hidden` classes, trained with Adam in
// the BF16 example's baseline layout (bf16 params + grads, fp32 master + moments), micro batch 1;
// or in float32 (fp32 params + grads, fp32 master + moments).
// Its training state is registered with a StateOffloader under DeepSpeed's offload_states names:
// lp_params, lp_grads, hp_params, optim_states (exp_avg and exp_avg_sq in one buffer).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/adamw.cuh"
#include "kernels/gemm.cuh"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/offload.h"

namespace cutrain::tools {

class Fp32Linear;

struct OffloadModelOptions {
  int hidden = 1024;
  int nlayers = 1;
  // bf16: bf16 params/grads/activations; fp32: fp32 ones (plus the fp32 master, as in DeepSpeed).
  // float16 is an error (no fp16 kernels).
  DType dtype = DType::BF16;
  float lr = 1e-6f;
  std::uint64_t seed = 42;    // nn.Linear-style init U(-1/sqrt(h), 1/sqrt(h)), from this seed
};

class OffloadModel {
 public:
  explicit OffloadModel(const OffloadModelOptions& options);
  ~OffloadModel();
  OffloadModel(const OffloadModel&) = delete;
  OffloadModel& operator=(const OffloadModel&) = delete;

  // One training step on one sample: x [hidden] (host fp32, rounded to bf16), label in
  // [0, hidden). Forward, backward, Adam step; returns the loss (synchronizes the stream).
  float step(const float* x, int label);

  // DeepSpeed's engine.offload_states / reload_states. `include` empty: every state.
  void offload_states(const std::vector<std::string>& include, const OffloadOptions& options);
  void reload_states(bool non_blocking);

  StateOffloader& offloader() { return *offloader_; }
  cudaStream_t stream() const { return stream_.get(); }
  std::size_t param_count() const { return n_; }
  std::size_t state_bytes() const;  // bytes of the four offloadable states
  int step_count() const { return step_; }
  // Downloads (synchronizing): bf16 params as raw bits, fp32 master, moments [m | v].
  std::vector<std::uint16_t> download_params();
  std::vector<float> download_master();
  std::vector<float> download_moments();

  static const std::vector<std::string>& state_names();

 private:
  float step_fp32(const float* x, int label);
  kernels::AdamParams begin_optimizer(cudaStream_t s);
  OffloadModelOptions opt_;
  int h_, L_;
  std::size_t n_;  // parameters: L * (h*h + h)
  Stream stream_;
  CachingAllocator& alloc_;
  Buffer params_, grads_, master_, moments_;
  Buffer acts_, dx_, labels_d_, loss_d_, status_d_, scratch_;
  Buffer stage_;  // pinned: the input, label, and the loss/status read back
  std::unique_ptr<kernels::Gemm> gemm_;       // bf16
  std::unique_ptr<Fp32Linear> lin32_;   // fp32
  std::unique_ptr<StateOffloader> offloader_;
  int step_ = 0;
};

}  // namespace cutrain::tools
