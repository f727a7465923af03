// @brief CPU reference of one Adam / AdamW step for each precision layout (fp64 math), with the
// same stochastic-rounding bits as the kernel (kernels/common/stochastic_round.cuh).
#pragma once

#include <vector>

#include "kernels/adamw.cuh"

namespace cutrain::ref {

// State as floats: `params` holds bf16 values; `master` fp32 (Baseline only, else ignored);
// `m`, `v` fp32 values, or bf16 values for Bf16Full. `scale` is the full gradient factor
// (grad_scale times any device scale). Updates everything in place, rounding each store the way
// the kernel does: fp32 stores round the double result to float; bf16 stores round that float to
// bf16 (nearest-even, or stochastically with the kernel's bits, kernels::sr_draws).
// `comp` (non-null: the compensated bf16 master, not Baseline): bf16 values; the weight is
// params + comp, updated in fp64, rounded to float x; params = bf16_store(x), comp = rne(x - params).
void adam_step(kernels::OptimizerLayout layout, const kernels::AdamParams& p, double scale, std::vector<float>& params,
               const std::vector<float>& grads, std::vector<float>& master, std::vector<float>& m,
               std::vector<float>& v, std::vector<float>* comp = nullptr);

// The kernel's bf16 store of `f`: nearest-even, or stochastic with the 16 bits `r16`.
float bf16_store(float f, bool stochastic, unsigned r16);

}  // namespace cutrain::ref
