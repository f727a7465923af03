// The CUDA raw sources of the caching allocator: device memory (cudaMalloc) and pinned host
// memory (cudaHostAlloc), both with real CUDA events for record_stream.
#include <unistd.h>

#include "runtime/allocator.h"
#include "runtime/check.h"

namespace cutrain {

namespace {

// Makes `device` current for a scope and restores the previous one (cudaMalloc and
// cudaEventCreate act on the current device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    CUTRAIN_CUDA_CHECK(cudaGetDevice(&prev_));
    if (device != prev_) CUTRAIN_CUDA_CHECK(cudaSetDevice(device));
    changed_ = device != prev_;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool changed_ = false;
};

// An event remembers its device: cudaEventRecord needs the event and the stream on one device.
struct CudaEvent {
  cudaEvent_t ev = nullptr;
  int device = -1;
};

class CudaEventOps : public RawSource {
 public:
  void* create_event() override {
    auto* e = new CudaEvent{};
    try {
      CUTRAIN_CUDA_CHECK(cudaGetDevice(&e->device));
      CUTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming));
    } catch (...) {
      delete e;
      throw;
    }
    return e;
  }
  void record_event(void* event, cudaStream_t stream) override {
    auto* e = static_cast<CudaEvent*>(event);
    int dev = 0;
    bool special = stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
#if CUDART_VERSION >= 12080
    if (!special) CUTRAIN_CUDA_CHECK(cudaStreamGetDevice(stream, &dev));
#else
    special = true;  // older runtimes cannot ask a stream for its device
#endif
    if (special) CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));  // the per-device default streams: current device
    if (dev != e->device) {  // recreate it on the stream's device
      DeviceGuard g(dev);
      CUTRAIN_CUDA_CHECK(cudaEventDestroy(e->ev));
      e->ev = nullptr;
      CUTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming));
      e->device = dev;
    }
    CUTRAIN_CUDA_CHECK(cudaEventRecord(e->ev, stream));
  }
  bool query_event(void* event) override {
    cudaError_t err = cudaEventQuery(static_cast<CudaEvent*>(event)->ev);
    if (err == cudaErrorNotReady) return false;
    CUTRAIN_CUDA_CHECK(err);
    return true;
  }
  void synchronize_event(void* event) override {
    CUTRAIN_CUDA_CHECK(cudaEventSynchronize(static_cast<CudaEvent*>(event)->ev));
  }
  void destroy_event(void* event) override {
    auto* e = static_cast<CudaEvent*>(event);
    if (e->ev) cudaEventDestroy(e->ev);
    delete e;
  }
};

class DeviceSource final : public CudaEventOps {
 public:
  explicit DeviceSource(int device) : device_(device) {}
  void* alloc(std::size_t bytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // exhaustion is reported by returning nullptr
      return nullptr;
    }
    CUTRAIN_CUDA_CHECK(err);
    return p;
  }
  void free(void* p, std::size_t) override {
    DeviceGuard g(device_);
    CUTRAIN_CUDA_CHECK(cudaFree(p));
  }
  const char* name() const override { return "device"; }
  bool is_device() const override { return true; }
  void mem_info(std::size_t* free_bytes, std::size_t* total_bytes) const override {
    DeviceGuard g(device_);
    std::size_t f = 0, t = 0;
    CUTRAIN_CUDA_CHECK(cudaMemGetInfo(&f, &t));
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
  }
  void* create_event() override {
    DeviceGuard g(device_);
    return CudaEventOps::create_event();
  }

 private:
  int device_;
};

class PinnedSource final : public CudaEventOps {
 public:
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    // Portable: usable by copies on every device, not only the current one.
    cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    CUTRAIN_CUDA_CHECK(err);
    return p;
  }
  void free(void* p, std::size_t) override { CUTRAIN_CUDA_CHECK(cudaFreeHost(p)); }
  const char* name() const override { return "pinned"; }
  bool is_device() const override { return false; }
  void mem_info(std::size_t* free_bytes, std::size_t* total_bytes) const override {
    long page = sysconf(_SC_PAGESIZE), phys = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    if (total_bytes) *total_bytes = phys > 0 ? static_cast<std::size_t>(phys) * page : 0;
    if (free_bytes) *free_bytes = avail > 0 ? static_cast<std::size_t>(avail) * page : 0;
  }
};

}  // namespace

std::unique_ptr<RawSource> make_device_source(int device) {
  if (device < 0) CUTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  int count = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDeviceCount(&count));
  CUTRAIN_CHECK(device < count, "make_device_source: device ", device, " does not exist (", count, " devices)");
  return std::make_unique<DeviceSource>(device);
}

std::unique_ptr<RawSource> make_pinned_source() { return std::make_unique<PinnedSource>(); }

}  // namespace cutrain
