#include "runtime/aio/gds_handle.h"

#include "runtime/error.h"

#if CUTRAIN_HAVE_CUFILE
#include <cuda_runtime.h>
#include <cufile.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/check.h"

namespace cutrain::aio {

namespace {
std::string cufile_error(CUfileError_t e) {
  std::string s = detail::concat("cuFile error ", static_cast<int>(e.err));
  if (IS_CUFILE_ERR(e.err)) s += detail::concat(" (", CUFILE_ERRSTR(e.err), ")");
  if (IS_CUDA_ERR(e)) s += detail::concat(", CUDA error ", static_cast<int>(e.cu_err));
  return s;
}

// The driver is opened once per process and closed at exit.
struct Driver {
  bool ok = false;
  std::string why;
  Driver() {
    CUfileError_t e = cuFileDriverOpen();
    ok = e.err == CU_FILE_SUCCESS;
    if (!ok) why = "cuFileDriverOpen failed: " + cufile_error(e);
  }
  ~Driver() {
    if (ok) cuFileDriverClose();
  }
};
Driver& driver() {
  static Driver d;
  return d;
}

struct FileReg {
  int fd = -1;
  CUfileHandle_t handle{};
  FileReg(const std::string& path, bool write) {
    fd = ::open(path.c_str(), (write ? (O_WRONLY | O_CREAT) : O_RDONLY) | O_DIRECT, 0644);
    if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), write ? (O_WRONLY | O_CREAT) : O_RDONLY, 0644);
    CUTRAIN_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
    CUfileDescr_t d{};
    d.handle.fd = fd;
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    CUfileError_t e = cuFileHandleRegister(&handle, &d);
    if (e.err != CU_FILE_SUCCESS) {
      ::close(fd);
      CUTRAIN_FAIL("GDS not available for '", path, "': cuFileHandleRegister: ", cufile_error(e));
    }
  }
  ~FileReg() {
    cuFileHandleDeregister(handle);
    ::close(fd);
  }
};
}  // namespace

bool gds_available(std::string* why, const std::string& folder) {
  Driver& d = driver();
  if (!d.ok) {
    if (why) *why = d.why;
    return false;
  }
  if (folder.empty()) return true;
  const std::string probe = folder + "/.cutrain_gds_probe." + std::to_string(::getpid());
  try {
    FileReg f(probe, /*write=*/true);
  } catch (const Error& e) {
    ::unlink(probe.c_str());
    if (why) *why = e.what();
    return false;
  }
  ::unlink(probe.c_str());
  return true;
}

struct GdsHandle::Impl {
  std::size_t block = 0;
  int par = 1;
  std::mutex m;
  std::vector<void*> pinned;

  void io(void* dev, std::size_t bytes, const std::string& path, std::int64_t offset, bool write) {
    FileReg f(path, write);
    if (!write) {
      off_t size = ::lseek(f.fd, 0, SEEK_END);
      CUTRAIN_CHECK(offset + static_cast<std::int64_t>(bytes) <= size, "cannot read ", bytes, " bytes at offset ",
                    offset, " from '", path, "': the file holds ", size, " bytes");
    }
    const std::size_t slice = (bytes + par - 1) / par;
    std::vector<std::thread> threads;
    std::vector<std::string> errors(par);
    for (int t = 0; t < par; ++t) {
      threads.emplace_back([&, t] {
        const std::size_t begin = std::min(bytes, t * slice), end = std::min(bytes, begin + slice);
        for (std::size_t at = begin; at < end;) {
          const std::size_t len = std::min(block, end - at);
          ssize_t r = write ? cuFileWrite(f.handle, dev, len, offset + static_cast<off_t>(at), static_cast<off_t>(at))
                            : cuFileRead(f.handle, dev, len, offset + static_cast<off_t>(at), static_cast<off_t>(at));
          if (r <= 0) {
            errors[t] = detail::concat(write ? "cuFileWrite" : "cuFileRead", " of ", len, " bytes at offset ",
                                       offset + static_cast<std::int64_t>(at), " of '", path, "' returned ", r,
                                       r < 0 ? detail::concat(" (", std::strerror(static_cast<int>(-r)), ")") : "");
            return;
          }
          at += static_cast<std::size_t>(r);
        }
      });
    }
    for (auto& th : threads) th.join();
    for (auto& e : errors) CUTRAIN_CHECK(e.empty(), e);
  }
};

GdsHandle::GdsHandle(std::size_t block_size, int par) : impl_(std::make_unique<Impl>()) {
  std::string why;
  CUTRAIN_CHECK(gds_available(&why), "GDS not available: ", why);
  CUTRAIN_CHECK(block_size >= 4096 && block_size % 4096 == 0, "block_size must be a multiple of 4096, got ", block_size);
  CUTRAIN_CHECK(par >= 1 && par <= 256, "intra_op_parallelism must be in [1, 256], got ", par);
  impl_->block = block_size;
  impl_->par = par;
}
GdsHandle::~GdsHandle() {
  for (void* p : impl_->pinned) {
    cuFileBufDeregister(p);
    cudaFree(p);
  }
}

std::int64_t GdsHandle::sync_pread(void* d, std::size_t n, const std::string& path, std::int64_t off) {
  impl_->io(d, n, path, off, false);
  return static_cast<std::int64_t>(n);
}
std::int64_t GdsHandle::sync_pwrite(const void* d, std::size_t n, const std::string& path, std::int64_t off) {
  impl_->io(const_cast<void*>(d), n, path, off, true);
  return static_cast<std::int64_t>(n);
}
void GdsHandle::pin_device_tensor(void* d, std::size_t n) {
  CUfileError_t e = cuFileBufRegister(d, n, 0);
  CUTRAIN_CHECK(e.err == CU_FILE_SUCCESS, "cuFileBufRegister of ", n, " bytes failed: ", cufile_error(e));
}
void GdsHandle::unpin_device_tensor(void* d) {
  CUfileError_t e = cuFileBufDeregister(d);
  CUTRAIN_CHECK(e.err == CU_FILE_SUCCESS, "cuFileBufDeregister failed: ", cufile_error(e));
}
void* GdsHandle::new_pinned_device_tensor(std::size_t n) {
  void* p = nullptr;
  CUTRAIN_CUDA_CHECK(cudaMalloc(&p, n));
  try {
    pin_device_tensor(p, n);
  } catch (...) {
    cudaFree(p);
    throw;
  }
  std::lock_guard<std::mutex> g(impl_->m);
  impl_->pinned.push_back(p);
  return p;
}
void GdsHandle::free_pinned_device_tensor(void* p) {
  std::lock_guard<std::mutex> g(impl_->m);
  auto it = std::find(impl_->pinned.begin(), impl_->pinned.end(), p);
  CUTRAIN_CHECK(it != impl_->pinned.end(), "free_pinned_device_tensor: pointer not from new_pinned_device_tensor");
  cuFileBufDeregister(p);
  CUTRAIN_CUDA_CHECK(cudaFree(p));
  impl_->pinned.erase(it);
}
std::string GdsHandle::mode() const {
  CUfileDrvProps_t props{};
  if (cuFileDriverGetProperties(&props).err != CU_FILE_SUCCESS) return "unknown";
  return detail::concat("cuFile driver ", props.nvfs.major_version, ".", props.nvfs.minor_version);
}

}  // namespace cutrain::aio

#else

namespace cutrain::aio {
namespace {
constexpr const char* kWhy = "cutrain was built without cuFile (libcufile and cufile.h were not found at configure time)";
}
bool gds_available(std::string* why, const std::string&) {
  if (why) *why = kWhy;
  return false;
}
struct GdsHandle::Impl {};
GdsHandle::GdsHandle(std::size_t, int) { CUTRAIN_FAIL("GDS not available: ", kWhy); }
GdsHandle::~GdsHandle() = default;
std::int64_t GdsHandle::sync_pread(void*, std::size_t, const std::string&, std::int64_t) { CUTRAIN_FAIL("GDS not available: ", kWhy); }
std::int64_t GdsHandle::sync_pwrite(const void*, std::size_t, const std::string&, std::int64_t) {
  CUTRAIN_FAIL("GDS not available: ", kWhy);
}
void GdsHandle::pin_device_tensor(void*, std::size_t) { CUTRAIN_FAIL("GDS not available: ", kWhy); }
void GdsHandle::unpin_device_tensor(void*) { CUTRAIN_FAIL("GDS not available: ", kWhy); }
void* GdsHandle::new_pinned_device_tensor(std::size_t) { CUTRAIN_FAIL("GDS not available: ", kWhy); }
void GdsHandle::free_pinned_device_tensor(void*) { CUTRAIN_FAIL("GDS not available: ", kWhy); }
std::string GdsHandle::mode() const { return "unavailable"; }
}  // namespace cutrain::aio

#endif
