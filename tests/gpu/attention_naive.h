// @brief Naive GPU attention for tests: materialized fp32 scores/probabilities [B, H, S, S], one
// thread per output element, fp32 math. Independent of the flash kernels (no tiling, no online
// softmax), fast enough for S = 2048 where the fp64 CPU reference is too slow.
#pragma once

#include "kernels/attention.cuh"
#include "tests/support/test_support.h"

namespace cutrain::test {

struct NaiveAttention {
  explicit NaiveAttention(const kernels::AttentionShape& shape);
  // out fp32 [B, S, H, D], lse fp32 [B, H, S]; keeps P for backward().
  void forward(const bf16* qkv, float* out, float* lse);
  // dqkv fp32 [B, S, 3, H, D]; Dvec from the `out` given (the kernel's bf16 output).
  void backward(const bf16* qkv, const bf16* out, const bf16* dout, float* dqkv);

  kernels::AttentionShape shape;
  DeviceArray<float> P, dS, dvec;
};

}  // namespace cutrain::test
