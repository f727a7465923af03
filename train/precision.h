// @brief The BF16 example's three precision layouts: which persistent buffers exist, in which
// dtype, and their analytic bytes per parameter (what the engine allocates, nothing hidden).
#pragma once

#include <string>
#include <vector>

#include "kernels/adamw.cuh"
#include "runtime/dtype.h"
#include "train/config.h"

namespace cutrain::train {

using kernels::OptimizerLayout;

struct BufferSpec {
  std::string name;  // "params", "grads", "master", "exp_avg", "exp_avg_sq"
  DType dtype;
};

struct PrecisionPlan {
  OptimizerLayout layout = OptimizerLayout::Baseline;
  DType param = DType::BF16;
  DType grad = DType::BF16;    // F32 for Baseline with gradient accumulation (accumulates in fp32)
  DType moment = DType::F32;   // BF16 for Bf16Full
  bool has_master = true;      // fp32 master weights (Baseline only)

  std::vector<BufferSpec> buffers() const;
  std::size_t bytes_per_param() const;  // sum of the buffers' element sizes
  const char* name() const;             // "baseline" | "bf16_master_wg" | "bf16_full"
};

// From the config's bf16 section: bf16_optimizer_states -> Bf16Full, bf16_master_weights_and_grads
// -> Bf16MasterWG, otherwise Baseline. `accumulation` > 1 makes Baseline's gradients fp32.
PrecisionPlan plan_for(OptimizerLayout layout, int accumulation);
PrecisionPlan plan_from_config(const TrainConfig& config);

// The table of all three layouts (and Baseline with accumulation), next to the BF16 example
// README's accounting, one line each.
std::string bytes_per_param_table();

}  // namespace cutrain::train
