// @brief Page-locked host memory for new_cpu_locked_tensor: pinned (cudaHostAlloc, from the
// runtime's pinned caching allocator) where a CUDA device is present, else page-aligned memory
// locked with mlock. Either way 4096-aligned, so O_DIRECT I/O takes it without a bounce.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>

namespace cutrain::python {

namespace nb = nanobind;

// A 1-D tensor of `num_elem` elements of `dtype` in locked memory, as a torch.Tensor (`torch`) or
// a NumPy array; the memory goes back when the last reference to the tensor goes.
nb::object new_locked_tensor(std::size_t num_elem, nb::dlpack::dtype dtype, bool torch, const char* op);

// Whether `p` is CUDA-pinned host memory or memory of new_locked_tensor.
bool is_locked(const void* p);

}  // namespace cutrain::python
