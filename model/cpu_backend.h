// @brief The CPU training backend: the fp32 reference model and a host AdamW, with the engine's
// clipping and NaN/Inf skip. Slow; for tests, CI and machines without a GPU.
#pragma once

#include <memory>

#include "model/train_backend.h"
#include "runtime/config.h"

namespace cutrain::model {

struct BackendOptions {
  ModelDims dims;
  int batch = 4, seq = 512;
  std::uint64_t seed = 42;
  bool activation_checkpointing = false;
  bool cuda_graph = true;
  bool causal = false;
};

std::unique_ptr<TrainBackend> make_cpu_backend(const BackendOptions& options, const TrainConfig& config);

}  // namespace cutrain::model
