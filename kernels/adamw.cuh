// @brief Adam / AdamW over the flat parameter buffer in one launch, for each precision layout,
// with optional stochastic rounding of every bf16 write and an optional bf16 compensation buffer
// (Kahan summation) for bf16 master weights.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// The BF16 example's three layouts.
enum class OptimizerLayout {
  Baseline,      // bf16 params + bf16 grads, fp32 master weights, fp32 moments
  Bf16MasterWG,  // bf16 params are the master, fp32 moments   (bf16_master_weights_and_grads)
  Bf16Full,      // bf16 params are the master, bf16 moments   (+ bf16_optimizer_states)
};

struct AdamParams {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  bool decoupled = true;       // true: AdamW (decoupled decay); false: Adam (L2 added to the gradient)
  int step = 1;                // 1-based, for bias correction
  float grad_scale = 1.f;      // multiplies every gradient (accumulation averaging, loss scale)
  bool stochastic_rounding = false;
  std::uint64_t seed = 0;      // stochastic rounding: hash(seed, step, index) -> reproducible bits
};

// params: bf16 (or fp16) [n]. grads: [n] of `grad_type` (the params' type, or fp32 for an accumulation buffer).
// master: fp32 [n] for Baseline, null otherwise. m, v: fp32 [n] (Baseline, Bf16MasterWG) or bf16
// [n] (Bf16Full). `device_scale` (may be null): a device fp32 multiplied into grad_scale (the
// clipping coefficient computed on the device). `skip` (may be null): a device int; when non-zero
// the launch changes nothing (NaN/Inf gradients). Buffers should be 16-byte aligned (the vector
// path); a misaligned view is still correct, through a slower scalar path. Stochastic rounding
// bits: kernels/common/stochastic_round.cuh (sr_draws), index = element index: reproducible
// across runs and resumes. `compensation` (may be null; Bf16MasterWG and Bf16Full only): bf16 [n],
// the part of each weight below its bf16 rounding; the kernel updates w + c in fp32 and stores
// w' = round(x) (nearest, or stochastic with the parameter's draws) and c' = rne(x - w'), so a
// bf16 master carries about 16 mantissa bits for 2 more bytes per parameter (docs/training.md).
// Compensation is a compile-time flag of the kernel (instances with and without). The kernel moves warp-coalesced chunks (fp32 arrays as 16-byte float4
// per lane, bf16 arrays as 8-byte loads when any fp32 array is present), two chunks in flight.
// P, the parameters' (model copy's) type: bf16 (every layout), or fp16 (fp16 training: layout
// Baseline only, fp32 master, no stochastic rounding; grads fp16 or fp32). Instances of both.
template <typename P>
void adam_step(cudaStream_t s, OptimizerLayout layout, const AdamParams& p, P* params, const void* grads,
               DType grad_type, float* master, void* m, void* v, std::size_t n, const float* device_scale,
               const int* skip, nondeduced_t<P>* compensation = nullptr);

// Bytes one step must move per parameter for the layout (for benchmarks and docs).
double adam_bytes_per_param(OptimizerLayout layout, DType grad_type, bool compensated = false);

}  // namespace cutrain::kernels
