// The extension module cutrain._cutrain; python/cutrain/__init__.py is the public face.
#include <nanobind/nanobind.h>

#include "io_handles.h"
#include "runtime/error.h"
#include "train_bindings.h"
#include "trainer.h"

namespace nb = nanobind;

NB_MODULE(_cutrain, m) {
  m.doc() = "cutrain's C++ runtime: DeepNVMe-style I/O handles, training, checkpoints";
  m.attr("__version__") = CUTRAIN_VERSION;
  // Every cutrain::Error (the engine's, the trainer's) is cutrain.Error with the same message.
  nb::exception<cutrain::Error>(m, "Error", PyExc_RuntimeError);
  cutrain::python::bind_io_handles(m);
  cutrain::python::bind_train(m);
  cutrain::python::bind_trainer(m);
}
