// @brief CPU reference of one LAMB step (DeepSpeed's FusedLamb math, kernels/lamb.cuh) for each
// precision layout: fp64 math and fp64 norms, the kernel's stores (fp32 rounding, bf16
// nearest-even or stochastic with the kernel's bits, kernels::sr_draws by flat index).
#pragma once

#include <vector>

#include "kernels/lamb.cuh"

namespace cutrain::ref {

// State as floats over the flat buffer, as ref::adam_step's (adamw_ref.h): `params` bf16 values,
// `master` fp32 (Baseline), `m`, `v` fp32 or bf16 values (Bf16Full), `comp` bf16 values or null.
// Only the tensors' elements change. `scale`: the full gradient factor. `ratios` (may be null):
// receives each tensor's trust ratio. Bf16Full: the direction u uses the moments as stored
// (rounded), as the kernel's second pass does.
void lamb_step(kernels::OptimizerLayout layout, const kernels::LambParams& p, double scale,
               const std::vector<kernels::LambTensor>& tensors, std::vector<float>& params,
               const std::vector<float>& grads, std::vector<float>& master, std::vector<float>& m,
               std::vector<float>& v, std::vector<float>* comp = nullptr, std::vector<double>* ratios = nullptr);

}  // namespace cutrain::ref
