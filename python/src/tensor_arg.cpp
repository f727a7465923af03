#include "tensor_arg.h"

#include <cuda_runtime.h>
#include <nanobind/stl/string.h>

#include <string>

#include "runtime/check.h"

namespace cutrain::python {

// The general path: nanobind's DLPack / buffer-protocol import.
TensorArg tensor_arg_dlpack(nb::handle obj, const char* op, const char* arg, bool writable);

namespace {
std::string py_type_name(nb::handle obj) { return nb::cast<std::string>(nb::str(obj.type().attr("__name__"))); }

// Row-major with no gaps: each stride (in elements) is the product of the later extents; extents
// of 1 may carry any stride (PyTorch gives them arbitrary ones).
template <class A>
bool c_contiguous(const A& a) {
  std::int64_t expect = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) == 1) continue;
    if (a.stride(i) != expect) return false;
    expect *= static_cast<std::int64_t>(a.shape(i));
  }
  return true;
}

template <class A>
TensorArg from_array(A&& a, nb::handle obj, const char* op, const char* arg) {
  if (!c_contiguous(a))
    throw nb::value_error((std::string(op) + ": " + arg + " is a non-contiguous tensor (" + py_type_name(obj) +
                           "); pass a contiguous one (e.g. .contiguous() or numpy.ascontiguousarray)")
                              .c_str());
  const int dev = a.device_type();
  if (dev != nb::device::cpu::value && dev != nb::device::cuda::value && dev != nb::device::cuda_host::value)
    throw nb::value_error((std::string(op) + ": " + arg + " lives on DLPack device type " + std::to_string(dev) +
                           "; only CPU and CUDA tensors are supported")
                              .c_str());
  TensorArg t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.bytes = a.nbytes();
  t.device = dev == nb::device::cuda::value;
  t.dtype = a.dtype();
  t.keep = nb::cast(a);
  // A CUDA array from another library: its producer's streams are unknown here, so the device
  // finishes its queued work before the engine's copy reads or writes the memory.
  if (t.device) CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  return t;
}

// torch.Tensor once torch has been imported (by anyone): a cached type object, so the check is a
// pointer comparison after the first tensor.
nb::handle torch_tensor_type() {
  static nb::handle type;
  if (!type.is_valid()) {
    nb::dict modules = nb::borrow<nb::dict>(nb::module_::import_("sys").attr("modules"));
    if (modules.contains("torch")) type = nb::handle(modules["torch"].attr("Tensor")).inc_ref();  // kept for the process
  }
  return type;
}

TensorArg from_torch(nb::handle obj, const char* op, const char* arg) {
  if (!nb::cast<bool>(obj.attr("is_contiguous")()))
    throw nb::value_error((std::string(op) + ": " + arg + " is a non-contiguous tensor (Tensor); pass a contiguous " +
                           "one (e.g. .contiguous())")
                              .c_str());
  TensorArg t;
  t.device = nb::cast<bool>(obj.attr("is_cuda"));
  if (!t.device && nb::cast<std::string>(nb::str(obj.attr("device").attr("type"))) != "cpu")
    throw nb::value_error((std::string(op) + ": " + arg + " lives on " + nb::cast<std::string>(nb::str(obj.attr("device"))) +
                           "; only CPU and CUDA tensors are supported")
                              .c_str());
  t.data = reinterpret_cast<void*>(nb::cast<std::uintptr_t>(obj.attr("data_ptr")()));
  t.bytes = nb::cast<std::size_t>(obj.attr("nbytes"));
  t.keep = nb::borrow(obj);
  // The engine copies on its own stream: what PyTorch's current stream has queued for this tensor
  // (the kernel that writes it, or one still reading it) finishes first.
  if (t.device) nb::module_::import_("torch.cuda").attr("current_stream")(obj.attr("device")).attr("synchronize")();
  return t;
}
}  // namespace

bool is_torch_tensor(nb::handle obj) {
  nb::handle tp = obj.type();
  nb::object mod = nb::getattr(tp, "__module__", nb::none());
  return nb::isinstance<nb::str>(mod) && nb::cast<std::string>(mod).rfind("torch", 0) == 0 &&
         nb::hasattr(obj, "__dlpack__");
}

TensorArg tensor_arg(nb::handle obj, const char* op, const char* arg, bool writable) {
  nb::handle tt = torch_tensor_type();
  if (tt.is_valid() && PyObject_IsInstance(obj.ptr(), tt.ptr()) == 1) return from_torch(obj, op, arg);
  return tensor_arg_dlpack(obj, op, arg, writable);
}

nb::dlpack::dtype tensor_dtype(nb::handle obj, const char* op, const char* arg) {
  return tensor_arg_dlpack(obj, op, arg, false).dtype;
}

TensorArg tensor_arg_dlpack(nb::handle obj, const char* op, const char* arg, bool writable) {
  if (writable) {
    nb::ndarray<> a;
    if (nb::try_cast(obj, a, false)) return from_array(a, obj, op, arg);
  }
  nb::ndarray<nb::ro> r;
  if (nb::try_cast(obj, r, false)) {
    if (writable)
      throw nb::value_error(
          (std::string(op) + ": " + arg + " is read-only (" + py_type_name(obj) + "); a read needs a writable tensor")
              .c_str());
    return from_array(r, obj, op, arg);
  }
  throw nb::type_error((std::string(op) + ": " + arg + " must be a tensor offering DLPack or the buffer protocol " +
                        "(NumPy, PyTorch, CuPy), got " + py_type_name(obj))
                           .c_str());
}

}  // namespace cutrain::python
