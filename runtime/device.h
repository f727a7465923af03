// @brief Device queries and RAII wrappers for CUDA streams and events.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace cutrain {

// True when a usable CUDA device exists. On a machine without one, `why` gets the CUDA
// runtime's reason (no device, no driver, ...). Never throws.
bool gpu_available(std::string* why = nullptr);

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  std::size_t l2_bytes = 0;
  std::size_t smem_per_block_optin = 0;  // max dynamic shared memory after cudaFuncSetAttribute
  std::size_t smem_per_sm = 0;
  std::size_t total_mem = 0;
  std::size_t free_mem = 0;
  int memory_bus_bits = 0;
  int driver_version = 0;   // e.g. 13000
  int runtime_version = 0;
};

// Properties of `device` (or the current device when -1), free memory read now.
DeviceInfo device_info(int device = -1);
std::string describe(const DeviceInfo& info);  // one line, human-readable

int current_device();

class Stream {
 public:
  explicit Stream(bool non_blocking = true, int priority = 0);
  ~Stream();
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return s_; }
  operator cudaStream_t() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  explicit Event(bool timing = true);
  ~Event();
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t stream);
  void synchronize() const;
  bool query() const;                         // true when complete
  float elapsed_ms(const Event& start) const;  // this - start, both recorded and complete
  void wait_on(cudaStream_t stream) const;     // make `stream` wait for this event

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace cutrain
