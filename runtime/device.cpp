#include "runtime/device.h"

#include <utility>

#include "runtime/check.h"

namespace cutrain {

bool gpu_available(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = detail::concat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (count == 0) {
    if (why) *why = "the CUDA runtime reports 0 devices";
    return false;
  }
  return true;
}

int current_device() {
  int d = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

DeviceInfo device_info(int device) {
  if (device < 0) device = current_device();
  cudaDeviceProp p{};
  CUTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceInfo info;
  info.index = device;
  info.name = p.name;
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  info.sm_count = p.multiProcessorCount;
  info.l2_bytes = static_cast<std::size_t>(p.l2CacheSize);
  info.smem_per_block_optin = p.sharedMemPerBlockOptin;
  info.smem_per_sm = p.sharedMemPerMultiprocessor;
  info.total_mem = p.totalGlobalMem;
  info.memory_bus_bits = p.memoryBusWidth;
  int prev = current_device();
  CUTRAIN_CUDA_CHECK(cudaSetDevice(device));
  std::size_t free_b = 0, total_b = 0;
  CUTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  CUTRAIN_CUDA_CHECK(cudaSetDevice(prev));
  info.free_mem = free_b;
  CUTRAIN_CUDA_CHECK(cudaDriverGetVersion(&info.driver_version));
  CUTRAIN_CUDA_CHECK(cudaRuntimeGetVersion(&info.runtime_version));
  return info;
}

std::string describe(const DeviceInfo& i) {
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  return detail::concat("device ", i.index, ": ", i.name, " (sm_", i.cc_major, i.cc_minor, ", ", i.sm_count,
                        " SMs, L2 ", i.l2_bytes / (1024 * 1024), " MiB, ", i.total_mem / GiB, " GiB total, ",
                        i.free_mem / GiB, " GiB free, driver ", i.driver_version / 1000, ".",
                        (i.driver_version % 1000) / 10, ", runtime ", i.runtime_version / 1000, ".",
                        (i.runtime_version % 1000) / 10, ")");
}

namespace {
// Move-assignment of an owned CUDA handle: ours destroyed, theirs taken, theirs left empty.
template <class H, class Destroy>
void take_handle(H& mine, H& theirs, Destroy destroy) {
  if (mine) destroy(mine);
  mine = std::exchange(theirs, nullptr);
}
}  // namespace

Stream::Stream(bool non_blocking, int priority) {
  CUTRAIN_CUDA_CHECK(
      cudaStreamCreateWithPriority(&s_, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault, priority));
}
Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) take_handle(s_, o.s_, cudaStreamDestroy);
  return *this;
}
void Stream::synchronize() const { CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event(bool timing) {
  CUTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) take_handle(e_, o.e_, cudaEventDestroy);
  return *this;
}
void Event::record(cudaStream_t stream) { CUTRAIN_CUDA_CHECK(cudaEventRecord(e_, stream)); }
void Event::synchronize() const { CUTRAIN_CUDA_CHECK(cudaEventSynchronize(e_)); }
bool Event::query() const {
  cudaError_t err = cudaEventQuery(e_);
  if (err == cudaErrorNotReady) return false;
  CUTRAIN_CUDA_CHECK(err);
  return true;
}
float Event::elapsed_ms(const Event& start) const {
  float ms = 0.f;
  CUTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}
void Event::wait_on(cudaStream_t stream) const { CUTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream, e_, 0)); }

}  // namespace cutrain
