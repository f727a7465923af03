#include "io_handles.h"

#include <nanobind/stl/string.h>

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "locked_memory.h"
#include "runtime/aio/aio_handle.h"
#include "runtime/aio/gds_handle.h"
#include "runtime/error.h"
#include "tensor_arg.h"

namespace cutrain::python {

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// What both handles share: the tensors of queued operations (kept alive until wait()), the
// tensors new_cpu_locked_tensor handed out, the DeepNVMe settings, and closing.
class HandleBase {
 public:
  HandleBase(std::size_t block, int depth, bool single, bool overlap, int par)
      : block_(block), depth_(depth), single_(single), overlap_(overlap), par_(par) {}

  std::size_t get_block_size() const { return block_; }
  int get_queue_depth() const { return depth_; }
  bool get_single_submit() const { return single_; }
  bool get_overlap_events() const { return overlap_; }
  int get_intra_op_parallelism() const { return par_; }
  // DeepSpeed's value: one 4096-byte O_DIRECT unit per worker (a buffer sized to a multiple of it
  // splits into aligned slices).
  std::size_t get_alignment() const { return static_cast<std::size_t>(par_) * aio::AioHandle::get_alignment(); }

  nb::object new_cpu_locked_tensor(std::size_t num_elem, nb::handle example) {
    open("new_cpu_locked_tensor");
    const nb::dlpack::dtype dt = tensor_dtype(example, "new_cpu_locked_tensor", "example_tensor");
    nb::object t = new_locked_tensor(num_elem, dt, is_torch_tensor(example), "new_cpu_locked_tensor");
    locked_.insert(tensor_arg(t, "new_cpu_locked_tensor", "tensor", false).data);
    return t;
  }
  // The handle lets go of the tensor; its memory returns to the pool when the tensor object goes
  // (freeing it under a live tensor would leave the tensor dangling). False: not one of ours.
  bool free_cpu_locked_tensor(nb::handle tensor) {
    TensorArg t = tensor_arg(tensor, "free_cpu_locked_tensor", "tensor", false);
    return locked_.erase(t.data) > 0;
  }
  bool is_pinned(nb::handle buffer) {
    TensorArg t = tensor_arg(buffer, "is_pinned", "buffer", false);
    return !t.device && is_locked(t.data);
  }

 protected:
  void open(const char* op) const {
    if (closed_) throw nb::value_error((std::string(op) + ": the handle is closed").c_str());
  }
  void keep(nb::object o) { pending_.push_back(std::move(o)); }
  // A file name as the engine takes it, without an allocation per call: the str's own UTF-8
  // (cached in it) copied into this thread's string, whose capacity stays. Valid until the
  // thread's next call: take it after the tensor argument (whose import may run Python code).
  static const std::string& path_arg(nb::str s) {
    thread_local std::string path;
    Py_ssize_t n = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(s.ptr(), &n);
    if (!utf8) throw nb::python_error();
    path.assign(utf8, static_cast<std::size_t>(n));
    return path;
  }
  void drop_pending() { pending_.clear(); }
  bool closed_ = false;

 private:
  std::size_t block_;
  int depth_;
  bool single_, overlap_;
  int par_;
  std::vector<nb::object> pending_;
  std::set<const void*> locked_;
};

// read()/write() of DeepSpeed: the whole file, whose size must be the tensor's.
std::int64_t file_bytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    CUTRAIN_FAIL("cannot open '", path, "' for reading: ", std::strerror(errno));
  return static_cast<std::int64_t>(st.st_size);
}
void check_whole_file(const TensorArg& t, const std::string& path) {
  const std::int64_t n = file_bytes(path);
  if (n != static_cast<std::int64_t>(t.bytes))
    throw nb::value_error(("read: buffer holds " + std::to_string(t.bytes) + " bytes but '" + path + "' holds " +
                           std::to_string(n) + " (read() reads a whole file into a tensor of its size" +
                           (static_cast<std::int64_t>(t.bytes) < n ? "; the tensor is smaller than the file)" : ")"))
                              .c_str());
}

class PyAioHandle : public HandleBase {
 public:
  PyAioHandle(std::size_t block, int depth, bool single, bool overlap, int par)
      : HandleBase(block, depth, single, overlap, par) {
    aio::HandleOptions o;
    o.block_size = block;
    o.queue_depth = depth;
    o.single_submit = single;
    o.overlap_events = overlap;
    o.intra_op_parallelism = par;
    h_ = std::make_unique<aio::AioHandle>(o);
  }

  // The GIL is released only around engine calls that do I/O (an empty tensor does none).
  int sync_pread(nb::handle buffer, nb::str filename, std::int64_t off) {
    TensorArg t = arg("sync_pread", buffer, true);
    const std::string& path = path_arg(filename);
    if (t.bytes == 0) return h_->sync_pread(t.data, 0, path, off), 1;
    nb::gil_scoped_release r;
    h_->sync_pread(t.data, t.bytes, path, off);
    return 1;
  }
  int sync_pwrite(nb::handle buffer, nb::str filename, std::int64_t off) {
    TensorArg t = arg("sync_pwrite", buffer, false);
    const std::string& path = path_arg(filename);
    if (t.bytes == 0) return h_->sync_pwrite(t.data, 0, path, off), 1;
    nb::gil_scoped_release r;
    h_->sync_pwrite(t.data, t.bytes, path, off);
    return 1;
  }
  int async_pread(nb::handle buffer, nb::str filename, std::int64_t off) {
    TensorArg t = arg("async_pread", buffer, true, true);
    const std::string& path = path_arg(filename);
    {
      nb::gil_scoped_release r;
      h_->async_pread(t.data, t.bytes, path, off);
    }
    keep(std::move(t.keep));
    return 0;
  }
  int async_pwrite(nb::handle buffer, nb::str filename, std::int64_t off) {
    TensorArg t = arg("async_pwrite", buffer, false, true);
    const std::string& path = path_arg(filename);
    {
      nb::gil_scoped_release r;
      h_->async_pwrite(t.data, t.bytes, path, off);
    }
    keep(std::move(t.keep));
    return 0;
  }
  int pread(nb::handle buffer, nb::str filename, bool validate, bool async, std::int64_t off) {
    return async ? (check_validate("pread", validate), async_pread(buffer, filename, off))
                 : sync_checked("pread", buffer, filename, validate, off, true);
  }
  int pwrite(nb::handle buffer, nb::str filename, bool validate, bool async, std::int64_t off) {
    return async ? (check_validate("pwrite", validate), async_pwrite(buffer, filename, off))
                 : sync_checked("pwrite", buffer, filename, validate, off, false);
  }
  // DeepSpeed's non-parallel whole-file forms; 0 on success.
  int read(nb::handle buffer, const std::string& path, bool validate, std::int64_t off) {
    TensorArg t = arg("read", buffer, true);
    if (off == 0) check_whole_file(t, path);
    nb::gil_scoped_release r;
    h_->pread(t.data, t.bytes, path, validate, false, off);
    return 0;
  }
  int write(nb::handle buffer, const std::string& path, bool validate, std::int64_t off) {
    TensorArg t = arg("write", buffer, false);
    nb::gil_scoped_release r;
    h_->pwrite(t.data, t.bytes, path, validate, false, off);
    return 0;
  }
  int wait() {
    open("wait");
    int n = 0;
    try {
      nb::gil_scoped_release r;
      n = h_->wait();
    } catch (...) {
      drop_pending();
      throw;
    }
    drop_pending();
    return n;
  }
  // Waits for what is queued, then refuses every later call (ValueError naming the call).
  void close() {
    if (closed_) return;
    try {
      wait();
    } catch (...) {
      closed_ = true;
      h_.reset();
      throw;
    }
    closed_ = true;
    h_.reset();
  }
  std::string backend() const { return closed_ ? "closed" : aio::backend_name(h_->backend()); }

  // The anchor of bench/python_overhead.py: `iterations` sync_pread (or sync_pwrite) calls of the
  // C++ engine in a C++ loop, the GIL released; seconds per call.
  double engine_loop(nb::handle buffer, const std::string& path, bool read, int iterations) {
    TensorArg t = arg("_engine_loop", buffer, read);
    nb::gil_scoped_release r;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) {
      if (read)
        h_->sync_pread(t.data, t.bytes, path, 0);
      else
        h_->sync_pwrite(t.data, t.bytes, path, 0);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iterations;
  }

 private:
  TensorArg arg(const char* op, nb::handle buffer, bool writable, bool keep_alive = false) {
    open(op);
    return tensor_arg(buffer, op, "buffer", writable, keep_alive);
  }
  static void check_validate(const char* op, bool validate) {
    if (validate)
      throw nb::value_error((std::string(op) + ": validate needs a synchronous call (async=False)").c_str());
  }
  int sync_checked(const char* op, nb::handle buffer, nb::str filename, bool validate, std::int64_t off, bool read) {
    TensorArg t = arg(op, buffer, read);
    const std::string& path = path_arg(filename);  // after arg(): no Python code runs between this and the I/O
    nb::gil_scoped_release r;
    if (read)
      h_->pread(t.data, t.bytes, path, validate, false, off);
    else
      h_->pwrite(t.data, t.bytes, path, validate, false, off);
    return 1;
  }
  std::unique_ptr<aio::AioHandle> h_;
};

// GPUDirect Storage: device tensors straight to and from files through cuFile. The engine's
// calls are synchronous; the async forms run them on a thread each, joined by wait().
class PyGdsHandle : public HandleBase {
 public:
  PyGdsHandle(std::size_t block, int depth, bool single, bool overlap, int par)
      : HandleBase(block, depth, single, overlap, par), h_(std::make_unique<aio::GdsHandle>(block, par)) {}

  int sync_pread(nb::handle buffer, const std::string& path, std::int64_t off) {
    TensorArg t = arg("sync_pread", buffer, true);
    nb::gil_scoped_release r;
    h_->sync_pread(t.data, t.bytes, path, off);
    return 1;
  }
  int sync_pwrite(nb::handle buffer, const std::string& path, std::int64_t off) {
    TensorArg t = arg("sync_pwrite", buffer, false);
    nb::gil_scoped_release r;
    h_->sync_pwrite(t.data, t.bytes, path, off);
    return 1;
  }
  int async_pread(nb::handle buffer, const std::string& path, std::int64_t off) {
    TensorArg t = arg("async_pread", buffer, true);
    aio::GdsHandle* h = h_.get();
    void* d = t.data;
    const std::size_t n = t.bytes;
    queue([=] { h->sync_pread(d, n, path, off); });
    keep(std::move(t.keep));
    return 0;
  }
  int async_pwrite(nb::handle buffer, const std::string& path, std::int64_t off) {
    TensorArg t = arg("async_pwrite", buffer, false);
    aio::GdsHandle* h = h_.get();
    const void* d = t.data;
    const std::size_t n = t.bytes;
    queue([=] { h->sync_pwrite(d, n, path, off); });
    keep(std::move(t.keep));
    return 0;
  }
  int pread(nb::handle buffer, const std::string& path, bool validate, bool async, std::int64_t off) {
    no_validate("pread", validate);
    return async ? async_pread(buffer, path, off) : sync_pread(buffer, path, off);
  }
  int pwrite(nb::handle buffer, const std::string& path, bool validate, bool async, std::int64_t off) {
    no_validate("pwrite", validate);
    return async ? async_pwrite(buffer, path, off) : sync_pwrite(buffer, path, off);
  }
  int wait() {
    open("wait");
    std::vector<std::future<void>> ops;
    {
      std::lock_guard<std::mutex> g(m_);
      ops.swap(ops_);
    }
    std::exception_ptr first;
    {
      nb::gil_scoped_release r;
      for (auto& f : ops) {
        try {
          f.get();
        } catch (...) {
          if (!first) first = std::current_exception();
        }
      }
    }
    drop_pending();
    if (first) std::rethrow_exception(first);
    return static_cast<int>(ops.size());
  }
  void close() {
    if (closed_) return;
    wait();
    closed_ = true;
    h_.reset();
  }

  // Device memory registered with cuFile (DeepSpeed's names): new_pinned_device_tensor allocates
  // through torch (the example's dtype and device) and registers it.
  bool pin_device_tensor(nb::handle tensor) {
    TensorArg t = device_arg("pin_device_tensor", tensor);
    h_->pin_device_tensor(t.data, t.bytes);
    return true;
  }
  bool unpin_device_tensor(nb::handle tensor) {
    TensorArg t = device_arg("unpin_device_tensor", tensor);
    h_->unpin_device_tensor(t.data);
    return true;
  }
  nb::object new_pinned_device_tensor(std::size_t num_elem, nb::handle example) {
    open("new_pinned_device_tensor");
    nb::object torch = nb::module_::import_("torch");
    nb::object t = torch.attr("empty")(num_elem, "dtype"_a = example.attr("dtype"), "device"_a = example.attr("device"));
    pin_device_tensor(t);
    return t;
  }
  bool free_pinned_device_tensor(nb::handle tensor) { return unpin_device_tensor(tensor); }

 private:
  TensorArg arg(const char* op, nb::handle buffer, bool writable) {
    open(op);
    TensorArg t = tensor_arg(buffer, op, "buffer", writable);
    if (!t.device)
      throw nb::value_error((std::string(op) + ": gds_handle moves CUDA tensors; buffer is host memory "
                             "(use aio_handle for host tensors)")
                                .c_str());
    return t;
  }
  TensorArg device_arg(const char* op, nb::handle tensor) {
    open(op);
    TensorArg t = tensor_arg(tensor, op, "tensor", false);
    if (!t.device) throw nb::value_error((std::string(op) + ": tensor is not a CUDA tensor").c_str());
    return t;
  }
  static void no_validate(const char* op, bool validate) {
    if (validate) throw nb::value_error((std::string(op) + ": gds_handle has no validate (pass False)").c_str());
  }
  template <class F>
  void queue(F f) {
    std::lock_guard<std::mutex> g(m_);
    ops_.push_back(std::async(std::launch::async, std::move(f)));
  }
  std::unique_ptr<aio::GdsHandle> h_;
  std::mutex m_;
  std::vector<std::future<void>> ops_;
};

template <class H, class C>
void common_methods(C& c) {
  c.def("get_block_size", &H::get_block_size)
      .def("get_queue_depth", &H::get_queue_depth)
      .def("get_single_submit", &H::get_single_submit)
      .def("get_overlap_events", &H::get_overlap_events)
      .def("get_intra_op_parallelism", &H::get_intra_op_parallelism)
      .def("get_alignment", &H::get_alignment)
      .def("sync_pread", &H::sync_pread, "buffer"_a, "filename"_a, "file_offset"_a = 0,
           "Synchronous parallel file read. Returns count of completed read ops (1).")
      .def("sync_pwrite", &H::sync_pwrite, "buffer"_a, "filename"_a, "file_offset"_a = 0,
           "Synchronous parallel file write. Returns count of completed write ops (1).")
      .def("async_pread", &H::async_pread, "buffer"_a, "filename"_a, "file_offset"_a = 0,
           "Asynchronous parallel file read. Returns 0; wait() returns the count of completed ops.")
      .def("async_pwrite", &H::async_pwrite, "buffer"_a, "filename"_a, "file_offset"_a = 0,
           "Asynchronous parallel file write. Returns 0; wait() returns the count of completed ops.")
      .def("pread", &H::pread, "buffer"_a, "filename"_a, "validate"_a, "async"_a, "file_offset"_a = 0,
           "Parallel file read, asynchronous if `async`. Returns 1 when synchronous, else 0.")
      .def("pwrite", &H::pwrite, "buffer"_a, "filename"_a, "validate"_a, "async"_a, "file_offset"_a = 0,
           "Parallel file write, asynchronous if `async`. Returns 1 when synchronous, else 0.")
      .def("wait", &H::wait, "Waits for the queued operations; returns how many completed.")
      .def("new_cpu_locked_tensor", &H::new_cpu_locked_tensor, "num_elem"_a, "example_tensor"_a,
           "A 1-D page-locked host tensor of num_elem elements of example_tensor's dtype (a torch.Tensor "
           "for a torch example, else a NumPy array).")
      .def("free_cpu_locked_tensor", &H::free_cpu_locked_tensor, "tensor"_a,
           "Releases a tensor of new_cpu_locked_tensor (its memory returns when the tensor goes). "
           "False if it is not one of this handle's.")
      .def("is_pinned", &H::is_pinned, "buffer"_a)
      .def("close", &H::close, "Waits for queued operations; later calls raise ValueError.")
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](H& h, nb::args) { h.close(); });
}

}  // namespace

void bind_io_handles(nb::module_& m) {
  auto aio_cls = nb::class_<PyAioHandle>(m, "aio_handle", "DeepNVMe's aio_handle over cutrain's engine.")
                     .def(nb::init<std::size_t, int, bool, bool, int>(), "block_size"_a = 1u << 20,
                          "queue_depth"_a = 128, "single_submit"_a = false, "overlap_events"_a = false,
                          "intra_op_parallelism"_a = 1)
                     .def("read", &PyAioHandle::read, "buffer"_a, "filename"_a, "validate"_a, "file_offset"_a = 0,
                          "Reads the whole file into a tensor of its size. Returns 0.")
                     .def("write", &PyAioHandle::write, "buffer"_a, "filename"_a, "validate"_a,
                          "file_offset"_a = 0, "Writes the tensor. Returns 0.")
                     .def_prop_ro("backend", &PyAioHandle::backend)
                     .def("_engine_loop", &PyAioHandle::engine_loop, "buffer"_a, "filename"_a, "read"_a,
                          "iterations"_a);
  common_methods<PyAioHandle>(aio_cls);

  auto gds_cls = nb::class_<PyGdsHandle>(m, "gds_handle", "DeepNVMe's gds_handle (GPUDirect Storage via cuFile).")
                     .def(nb::init<std::size_t, int, bool, bool, int>(), "block_size"_a = 1u << 20,
                          "queue_depth"_a = 128, "single_submit"_a = false, "overlap_events"_a = false,
                          "intra_op_parallelism"_a = 1)
                     .def("pin_device_tensor", &PyGdsHandle::pin_device_tensor, "tensor"_a)
                     .def("unpin_device_tensor", &PyGdsHandle::unpin_device_tensor, "tensor"_a)
                     .def("new_pinned_device_tensor", &PyGdsHandle::new_pinned_device_tensor, "num_elem"_a,
                          "example_tensor"_a, "A CUDA torch tensor like example_tensor, registered with cuFile.")
                     .def("free_pinned_device_tensor", &PyGdsHandle::free_pinned_device_tensor, "tensor"_a);
  common_methods<PyGdsHandle>(gds_cls);

  m.def("gds_available", [](const std::string& folder) {
    std::string why;
    const bool ok = aio::gds_available(&why, folder);
    return nb::make_tuple(ok, why);
  }, "folder"_a = "", "(available, reason): whether GPUDirect Storage opens here (and registers a file in "
     "`folder`, when given), and why not.");
}

}  // namespace cutrain::python
