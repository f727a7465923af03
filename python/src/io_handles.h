// @brief aio_handle and gds_handle: DeepNVMe's Python handles (method names, arguments, defaults
// and return values of DeepSpeed's async_io / gds ops) over runtime/aio's AioHandle and GdsHandle.
#pragma once

#include <nanobind/nanobind.h>

namespace cutrain::python {

void bind_io_handles(nanobind::module_& m);

}  // namespace cutrain::python
