// @brief LAMB in training: the tensors its trust ratios are taken over (the model's parameter
// tensors), and the host step of the CPU backend (`cutrain train --device cpu`): DeepSpeed's
// FusedLamb math as kernels/lamb.cuh states it, over fp32 buffers, fp64 arithmetic and norms.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/lamb.cuh"
#include "model/transformer_params.h"
#include "train/config.h"

namespace cutrain::train {

// The kernel's parameters from the config's optimizer section at this step's lr (1-based step).
kernels::LambParams lamb_params(const OptimizerConfig& o, float lr, int step);

// One LambTensor per parameter tensor of the table (offset, count, its weight-decay flag); the
// flat buffer's padding between them belongs to none. A tied head is its embedding's tensor.
std::vector<kernels::LambTensor> lamb_tensors(const model::TransformerParams& table);

// One step over `tensors` of the flat fp32 buffers (elements outside every tensor untouched).
// `scale` multiplies every gradient (clipping). `ratios` (may be null): each tensor's trust ratio.
void host_lamb_step(const kernels::LambParams& p, double scale, const std::vector<kernels::LambTensor>& tensors,
                    float* params, const float* grads, float* m, float* v, std::vector<double>* ratios = nullptr);

}  // namespace cutrain::train
