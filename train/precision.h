// @brief The BF16 example's three precision layouts (and the compensated bf16 master), and fp16
// training's (the baseline layout on fp16: fp16 params and gradients, fp32 master): which
// persistent buffers exist, in which dtype, and their analytic bytes per parameter (what the
// engine allocates, nothing hidden).
#pragma once

#include <string>
#include <vector>

#include "kernels/adamw.cuh"
#include "runtime/dtype.h"
#include "train/config.h"

namespace cutrain::train {

using kernels::OptimizerLayout;

struct BufferSpec {
  std::string name;  // "params", "grads", "master", "compensation", "exp_avg", "exp_avg_sq"
  DType dtype;
};

struct PrecisionPlan {
  OptimizerLayout layout = OptimizerLayout::Baseline;
  DType param = DType::BF16;  // F16 in fp16 training (the model's compute dtype)
  DType grad = DType::BF16;    // the params' dtype; F32 for Baseline with gradient accumulation
  DType moment = DType::F32;   // BF16 for Bf16Full
  bool has_master = true;      // fp32 master weights (Baseline only)
  // bf16 compensation of the bf16 master (Bf16MasterWG / Bf16Full with bf16.bf16_master_compensation):
  // 2 more bytes per parameter, partitioned and offloaded like the optimizer state.
  bool compensation = false;

  std::vector<BufferSpec> buffers() const;
  std::size_t bytes_per_param() const;  // sum of the buffers' element sizes
  const char* name() const;  // "baseline" | "bf16_master_wg" | "bf16_full" | "fp16" (baseline on fp16)
  std::string label() const;            // name() + "+compensation" when compensated
};

// From the config's bf16 section: bf16_optimizer_states -> Bf16Full, bf16_master_weights_and_grads
// -> Bf16MasterWG, otherwise Baseline; bf16_master_compensation adds the compensation buffer.
// `accumulation` > 1 makes Baseline's gradients fp32. `compensation` with Baseline is an error.
PrecisionPlan plan_for(OptimizerLayout layout, int accumulation, bool compensation = false);
// fp16.enabled: the baseline layout on fp16 (fp16 params and gradients, fp32 gradients with
// accumulation, fp32 master and moments).
PrecisionPlan plan_for_fp16(int accumulation);
PrecisionPlan plan_from_config(const TrainConfig& config);

// The table of all three layouts (Baseline with accumulation, the compensated ones), next to the BF16 example
// README's accounting, one line each.
std::string bytes_per_param_table();

}  // namespace cutrain::train
