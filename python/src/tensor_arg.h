// @brief A tensor argument of the Python API: any object offering DLPack (torch, CuPy, JAX) or
// the buffer protocol (NumPy, bytearray, memoryview), seen as one contiguous range of bytes on
// the host or on a device. Bad input is a ValueError / TypeError naming the method and argument.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>

namespace cutrain::python {

namespace nb = nanobind;

struct TensorArg {
  void* data = nullptr;
  std::size_t bytes = 0;
  bool device = false;  // CUDA memory (the engine bounces it through pinned buffers)
  nb::dlpack::dtype dtype{};
  nb::object keep;      // the imported view: keeps the producer's memory alive while I/O runs
};

// `op` and `arg` name the call in errors ("sync_pread", "buffer"). `writable`: the call writes
// into the tensor (a read from a file), so a read-only buffer is refused. A torch.Tensor is read
// through its own attributes (data_ptr, nbytes, is_contiguous, is_cuda: a fraction of a
// microsecond, where its __dlpack__ takes about two); `dtype` is then left empty.
TensorArg tensor_arg(nb::handle obj, const char* op, const char* arg, bool writable);

// The element type of any tensor (through DLPack or the buffer protocol).
nb::dlpack::dtype tensor_dtype(nb::handle obj, const char* op, const char* arg);

// Whether `obj` is a torch.Tensor (without importing torch).
bool is_torch_tensor(nb::handle obj);

}  // namespace cutrain::python
