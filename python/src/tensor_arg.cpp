#include "tensor_arg.h"

#include <cuda_runtime.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <string>

#include "runtime/check.h"

namespace cutrain::python {

TensorArg::TensorArg(TensorArg&& o) noexcept
    : data(o.data), bytes(o.bytes), device(o.device), dtype(o.dtype), keep(std::move(o.keep)), view(o.view),
      has_view(o.has_view) {
  o.has_view = false;
}

TensorArg::~TensorArg() {
  if (has_view) PyBuffer_Release(&view);
}

namespace {
std::string py_type_name(nb::handle obj) { return nb::cast<std::string>(nb::str(obj.type().attr("__name__"))); }

// str(obj), whatever obj is (nb::str(object) would insist that it already is a str).
std::string py_str(nb::handle obj) {
  PyObject* s = PyObject_Str(obj.ptr());
  if (!s) throw nb::python_error();
  return nb::cast<std::string>(nb::steal<nb::str>(s));
}

[[noreturn]] void throw_non_contiguous(nb::handle obj, const char* op, const char* arg, const char* hint) {
  throw nb::value_error((std::string(op) + ": " + arg + " is a non-contiguous tensor (" + py_type_name(obj) +
                         "); pass a contiguous one (" + hint + ")")
                            .c_str());
}
[[noreturn]] void throw_read_only(nb::handle obj, const char* op, const char* arg) {
  throw nb::value_error(
      (std::string(op) + ": " + arg + " is read-only (" + py_type_name(obj) + "); a read needs a writable tensor")
          .c_str());
}
[[noreturn]] void throw_not_a_tensor(nb::handle obj, const char* op, const char* arg) {
  throw nb::type_error((std::string(op) + ": " + arg + " must be a tensor offering DLPack or the buffer protocol " +
                        "(NumPy, PyTorch, CuPy), got " + py_type_name(obj))
                           .c_str());
}
constexpr const char* kNumpyHint = "e.g. .contiguous() or numpy.ascontiguousarray";

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
void from_array(TensorArg& t, A&& a, nb::handle obj, const char* op, const char* arg, bool keep_alive) {
  if (!c_contiguous(a)) throw_non_contiguous(obj, op, arg, kNumpyHint);
  const int dev = a.device_type();
  if (dev != nb::device::cpu::value && dev != nb::device::cuda::value && dev != nb::device::cuda_host::value)
    throw nb::value_error((std::string(op) + ": " + arg + " lives on DLPack device type " + std::to_string(dev) +
                           "; only CPU and CUDA tensors are supported")
                              .c_str());
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.bytes = a.nbytes();
  t.device = dev == nb::device::cuda::value;
  t.dtype = a.dtype();
  if (keep_alive) t.keep = nb::cast(a);
  // A CUDA array from another library: its producer's streams are unknown here, so the device
  // finishes its queued work before the engine's copy reads or writes the memory.
  if (t.device) CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
}

// The buffer protocol straight (NumPy, bytearray, memoryview, array): no Python call and no
// allocation; false (nothing held) when the object declines the request, for the DLPack path.
bool from_buffer(TensorArg& t, nb::handle obj, const char* op, const char* arg, bool writable, bool keep_alive) {
  if (PyObject_GetBuffer(obj.ptr(), &t.view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return false;
  }
  t.has_view = true;
  // Python objects ('O') are pointers, not data to store.
  if (t.view.format && std::strchr(t.view.format, 'O')) throw_not_a_tensor(obj, op, arg);
  if (!PyBuffer_IsContiguous(&t.view, 'C')) throw_non_contiguous(obj, op, arg, kNumpyHint);
  if (writable && t.view.readonly) throw_read_only(obj, op, arg);
  t.data = t.view.buf;
  t.bytes = static_cast<std::size_t>(t.view.len);
  if (keep_alive) t.keep = nb::steal(PyMemoryView_FromObject(obj.ptr()));  // holds its own export
  if (keep_alive && !t.keep.is_valid()) throw nb::python_error();
  return true;
}

// Attribute names interned once: a lookup by an interned string skips building and hashing one.
struct TorchNames {
  PyObject* is_contiguous = PyUnicode_InternFromString("is_contiguous");
  PyObject* is_cuda = PyUnicode_InternFromString("is_cuda");
  PyObject* is_cpu = PyUnicode_InternFromString("is_cpu");
  PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
  PyObject* nbytes = PyUnicode_InternFromString("nbytes");
};
const TorchNames& torch_names() {
  static const TorchNames n;  // kept for the process
  return n;
}

nb::object attr(nb::handle obj, PyObject* name) {
  PyObject* r = PyObject_GetAttr(obj.ptr(), name);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}
nb::object call0(nb::handle obj, PyObject* name) {
  PyObject* r = PyObject_CallMethodObjArgs(obj.ptr(), name, nullptr);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}
bool truth(const nb::object& o) {
  const int r = PyObject_IsTrue(o.ptr());
  if (r < 0) throw nb::python_error();
  return r == 1;
}

// torch.Tensor once torch has been imported (by anyone): a cached type object, so the check is a
// pointer comparison after the first tensor; before that one dict lookup in sys.modules.
nb::handle torch_tensor_type() {
  static nb::handle type;
  static PyObject* modules = nullptr;
  if (!type.is_valid()) {
    if (!modules) modules = nb::module_::import_("sys").attr("modules").inc_ref().ptr();  // kept for the process
    static PyObject* key = PyUnicode_InternFromString("torch");
    if (PyObject* torch = PyDict_GetItemWithError(modules, key))
      type = nb::handle(nb::handle(torch).attr("Tensor")).inc_ref();  // kept for the process
    else if (PyErr_Occurred())
      throw nb::python_error();
  }
  return type;
}

bool is_torch_instance(nb::handle obj) {
  nb::handle tt = torch_tensor_type();
  if (!tt.is_valid()) return false;
  // The type's MRO (subclasses: nn.Parameter, ...), without isinstance's __instancecheck__ call.
  return PyType_IsSubtype(Py_TYPE(obj.ptr()), reinterpret_cast<PyTypeObject*>(tt.ptr())) != 0;
}

void from_torch(TensorArg& t, nb::handle obj, const char* op, const char* arg, bool keep_alive) {
  const TorchNames& n = torch_names();
  if (!truth(call0(obj, n.is_contiguous))) throw_non_contiguous(obj, op, arg, "e.g. .contiguous()");
  // is_cpu first: one attribute for the common case.
  PyObject* cpu = PyObject_GetAttr(obj.ptr(), n.is_cpu);  // PyTorch before 1.13 lacks it
  const bool on_cpu = cpu ? truth(nb::steal(cpu)) : (PyErr_Clear(), py_str(obj.attr("device").attr("type")) == "cpu");
  t.device = !on_cpu && truth(attr(obj, n.is_cuda));
  if (!on_cpu && !t.device)
    throw nb::value_error((std::string(op) + ": " + arg + " lives on " + py_str(obj.attr("device")) +
                           "; only CPU and CUDA tensors are supported")
                              .c_str());
  const nb::object ptr = call0(obj, n.data_ptr), nbytes = attr(obj, n.nbytes);
  t.data = PyLong_AsVoidPtr(ptr.ptr());
  t.bytes = PyLong_AsSize_t(nbytes.ptr());
  if (PyErr_Occurred()) throw nb::python_error();
  if (keep_alive) t.keep = nb::borrow(obj);
  // The engine copies on its own stream: what PyTorch's current stream has queued for this tensor
  // (the kernel that writes it, or one still reading it) finishes first.
  if (t.device) nb::module_::import_("torch.cuda").attr("current_stream")(obj.attr("device")).attr("synchronize")();
}

// The general path: nanobind's DLPack / buffer-protocol import.
void from_dlpack(TensorArg& t, nb::handle obj, const char* op, const char* arg, bool writable, bool keep_alive) {
  if (writable) {
    nb::ndarray<> a;
    if (nb::try_cast(obj, a, false)) return from_array(t, a, obj, op, arg, keep_alive);
  }
  nb::ndarray<nb::ro> r;
  if (nb::try_cast(obj, r, false)) {
    if (writable) throw_read_only(obj, op, arg);
    return from_array(t, r, obj, op, arg, keep_alive);
  }
  throw_not_a_tensor(obj, op, arg);
}
}  // namespace

bool is_torch_tensor(nb::handle obj) {
  nb::handle tp = obj.type();
  nb::object mod = nb::getattr(tp, "__module__", nb::none());
  return nb::isinstance<nb::str>(mod) && nb::cast<std::string>(mod).rfind("torch", 0) == 0 &&
         nb::hasattr(obj, "__dlpack__");
}

TensorArg tensor_arg(nb::handle obj, const char* op, const char* arg, bool writable, bool keep_alive) {
  TensorArg t;
  if (is_torch_instance(obj))
    from_torch(t, obj, op, arg, keep_alive);
  else if (!(PyObject_CheckBuffer(obj.ptr()) && from_buffer(t, obj, op, arg, writable, keep_alive)))
    from_dlpack(t, obj, op, arg, writable, keep_alive);
  return t;
}

nb::dlpack::dtype tensor_dtype(nb::handle obj, const char* op, const char* arg) {
  TensorArg t;
  from_dlpack(t, obj, op, arg, false, false);
  return t.dtype;
}

}  // namespace cutrain::python
