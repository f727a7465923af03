// @brief train() and load_checkpoint(): `cutrain train`'s loop and a checkpoint's model tensors
// from Python.
#pragma once

#include <nanobind/nanobind.h>

namespace cutrain::python {

void bind_train(nanobind::module_& m);

}  // namespace cutrain::python
