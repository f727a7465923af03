// @brief GPUDirect Storage handle (DeepSpeed's gds_handle) through cuFile: device buffers read
// and written by the storage stack without a host bounce. cuFile is optional: where cutrain was
// built without it, or the driver/filesystem cannot do GDS, every call throws
// "GDS not available: <reason>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace cutrain::aio {

// True when cutrain was built with cuFile and its driver opens; `why` gets the reason otherwise.
// With `folder`: also whether cuFile registers a file there (a file system without GDS support,
// such as tmpfs or overlayfs, refuses it), probed with a temporary file that is removed.
bool gds_available(std::string* why = nullptr, const std::string& folder = "");

class GdsHandle {
 public:
  // block_size / intra_op_parallelism as in AioHandle: each request is cut into
  // intra_op_parallelism contiguous slices issued by that many threads, in block_size calls.
  explicit GdsHandle(std::size_t block_size = 1u << 20, int intra_op_parallelism = 1);
  ~GdsHandle();
  GdsHandle(const GdsHandle&) = delete;
  GdsHandle& operator=(const GdsHandle&) = delete;

  std::int64_t sync_pread(void* device_buffer, std::size_t bytes, const std::string& path, std::int64_t offset = 0);
  std::int64_t sync_pwrite(const void* device_buffer, std::size_t bytes, const std::string& path,
                           std::int64_t offset = 0);
  // Registers device memory with cuFile (faster repeated I/O); new_pinned_device_tensor allocates
  // and registers.
  void pin_device_tensor(void* device_buffer, std::size_t bytes);
  void unpin_device_tensor(void* device_buffer);
  void* new_pinned_device_tensor(std::size_t bytes);
  void free_pinned_device_tensor(void* device_buffer);
  std::string mode() const;  // "GDS" or "compat (POSIX through cuFile)" where the driver reports it

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cutrain::aio
