// @brief A tensor argument of the Python API: any object offering DLPack (torch, CuPy, JAX) or
// the buffer protocol (NumPy, bytearray, memoryview), seen as one contiguous range of bytes on
// the host or on a device. Bad input is a ValueError / TypeError naming the method and argument.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>

namespace cutrain::python {

namespace nb = nanobind;

// The bytes of a tensor for the length of a call. Holds the buffer-protocol export it came from
// (released when it goes: destroy it with the GIL held), so the exporter cannot resize or free
// the memory under the call.
struct TensorArg {
  void* data = nullptr;
  std::size_t bytes = 0;
  bool device = false;  // CUDA memory (the engine bounces it through pinned buffers)
  nb::dlpack::dtype dtype{};  // set by the DLPack path only
  nb::object keep;      // with keep_alive: an object that keeps the memory alive after the call

  TensorArg() = default;
  TensorArg(TensorArg&& o) noexcept;
  TensorArg& operator=(TensorArg&&) = delete;
  TensorArg(const TensorArg&) = delete;
  ~TensorArg();

  Py_buffer view{};
  bool has_view = false;
};

// `op` and `arg` name the call in errors ("sync_pread", "buffer"). `writable`: the call writes
// into the tensor (a read from a file), so a read-only buffer is refused. `keep_alive`: fill
// `keep` (queued operations outlive the call). The cheapest import that keeps every check, by
// bench/python/python_overhead.py: a torch.Tensor through four of its attributes (is_contiguous,
// is_cpu (is_cuda when not), data_ptr, nbytes: ~40 ns each, where its __dlpack__ takes ~2 us and
// device.type 0.26 us), a torch subclass by its MRO (no __instancecheck__ call), a buffer-
// protocol object through PyObject_GetBuffer (no allocation), anything else through nanobind's
// DLPack import; `dtype` is set by the last one only.
TensorArg tensor_arg(nb::handle obj, const char* op, const char* arg, bool writable, bool keep_alive = false);

// The element type of any tensor (through DLPack or the buffer protocol).
nb::dlpack::dtype tensor_dtype(nb::handle obj, const char* op, const char* arg);

// Whether `obj` is a torch.Tensor (without importing torch).
bool is_torch_tensor(nb::handle obj);

}  // namespace cutrain::python
