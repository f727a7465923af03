// @brief LAMB (DeepSpeed's FusedLamb) over many tensors of one flat buffer in two launches, for
// each precision layout of kernels/adamw.cuh, with optional stochastic rounding of every bf16 write
// and the bf16 master's compensation buffer.
//
// The math, per tensor t (DeepSpeed's csrc/lamb, eps outside the square root unless eps_inside_sqrt):
//   g = grad * scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2       (no bias correction here)
//   u = m / (sqrt(v) + eps) + wd_t * w                                       (the update direction)
//   ratio_t = clamp(|w|_t / |u|_t, min_coeff, max_coeff), or 1 when either norm is 0
//   w -= step_size * ratio_t * u,  step_size = lr * sqrt(1 - b2^step) / (1 - b1^step) (lr without
//   bias_correction)
// |w|_t is the norm of the weights before the step. Pass 1 updates m, v and sums w^2 and u^2 per
// chunk; the last chunk of a tensor to finish sums its chunks' partials in chunk order (fixed, so
// the ratio has the same bits on every run) into ratio_t. Pass 2 recomputes u from the stored m, v
// (bf16 ones as rounded) and applies it. Where the weight lives: the fp32 master (Baseline), or the
// bf16 params (+ compensation) as in adamw.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/adamw.cuh"
#include "runtime/dtype.h"

namespace cutrain::kernels {

struct LambParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  float max_coeff = 10.f, min_coeff = 0.01f;
  bool bias_correction = true;
  bool eps_inside_sqrt = false;  // DeepSpeed's eps_inside_sqrt: sqrt(v + eps) instead of sqrt(v) + eps
  int step = 1;                  // 1-based
  float grad_scale = 1.f;        // multiplies every gradient
  bool stochastic_rounding = false;
  std::uint64_t seed = 0;        // stochastic rounding: the draws of adamw.cuh (sr_draws by flat index)
};

// One tensor of the flat buffer: elements [begin, begin + count); `decay`: weight_decay applies.
struct LambTensor {
  std::size_t begin = 0, count = 0;
  bool decay = true;
};

// A piece of one tensor that one block reduces (never spans two tensors).
struct LambChunk {
  std::uint64_t begin;
  std::uint32_t count, tensor;
};
struct LambTensorInfo {
  std::uint32_t first_chunk, num_chunks;
  float decay;  // 1 or 0: multiplies weight_decay
  std::uint32_t reserved;
};

// The host side of the tensor table: built once per set of tensors, packed and uploaded by the
// caller (no allocation in kernels/).
struct LambPlan {
  static constexpr std::uint32_t kChunkElems = 16384;
  std::vector<LambTensorInfo> tensors;
  std::vector<LambChunk> chunks;
  bool aligned4 = true;  // every tensor begins at a multiple of 4 elements (the vector path)

  // Tensors in any order, non-overlapping, none empty, each below 2^32 elements (checked).
  static LambPlan make(const std::vector<LambTensor>& tensors, std::uint32_t chunk_elems = kChunkElems);
  std::size_t table_bytes() const;      // the packed table: tensor infos, then chunks
  void pack(void* host_dst) const;      // table_bytes() bytes
  std::size_t workspace_bytes() const;  // partials, ratios, norms, counters (8-byte aligned)
  std::size_t end() const;              // one past the last element any tensor covers
};

// Device views: `table` holds pack()'s bytes; `workspace` workspace_bytes(), ZEROED ONCE before the
// first launch (every launch leaves its counters at zero again, so CUDA graphs may replay it).
struct LambDeviceTable {
  const void* table = nullptr;
  void* workspace = nullptr;
  std::uint32_t num_tensors = 0, num_chunks = 0;
  bool aligned4 = true;
};
LambDeviceTable lamb_device_table(const LambPlan& plan, const void* device_table, void* device_workspace);

// The trust ratio each tensor used in the last launch (fp32 [num_tensors], device), and the norms
// |w|_t, |u|_t (fp32 [2 * num_tensors], pairs), for metrics and tests.
const float* lamb_trust_ratios(const LambDeviceTable& t);
const float* lamb_norms(const LambDeviceTable& t);

// Buffers as adam_step's (params bf16; grads bf16 or fp32; master fp32 for Baseline; m, v fp32 or
// bf16 for Bf16Full; compensation bf16 or null), indexed by the flat element index; elements no
// tensor covers are not touched. `device_scale`, `skip`: as adam_step. Two launches on `s`.
// P: bf16, or fp16 (layout Baseline only, as adam_step); instances of both.
template <typename P>
void lamb_step(cudaStream_t s, OptimizerLayout layout, const LambParams& p, const LambDeviceTable& table, P* params,
               const void* grads, DType grad_type, float* master, void* m, void* v, const float* device_scale,
               const int* skip, nondeduced_t<P>* compensation = nullptr);

// Bytes the two passes must move per parameter (pass 1 as Adam's minus the param write; pass 2
// reads the weight, m and v again and writes the weight).
double lamb_bytes_per_param(OptimizerLayout layout, DType grad_type, bool compensated = false);

}  // namespace cutrain::kernels
