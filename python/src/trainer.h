// @brief cutrain.Trainer: one model and its training state held from Python, stepped on batches
// the caller gives (host int32 tokens and labels), with the GPU engine's offload_states /
// reload_states (DeepSpeed's engine methods) between steps.
#pragma once

#include <nanobind/nanobind.h>

namespace cutrain::python {

void bind_trainer(nanobind::module_& m);

}  // namespace cutrain::python
