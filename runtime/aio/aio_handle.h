// @brief The DeepNVMe-style async tensor I/O handle (DeepSpeed's aio_handle, with checking).
//
// Each request is split into `intra_op_parallelism` contiguous slices, one per worker thread;
// each worker cuts its slice into `block_size` pieces kept `queue_depth` deep on its own queue
// (io_uring, libaio or pread threads). O_DIRECT is used for the 4096-aligned body of a request
// whose buffer and offset are aligned; an unaligned tail goes through buffered I/O. Device
// buffers go through two pinned bounce buffers with disk I/O and H2D/D2H copies overlapped.
// A small synchronous host request (at most `inline_bytes` and one block) runs on the calling
// thread with the same descriptors, split and checks: waking a worker costs more than its I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/aio/io_queue.h"

namespace cutrain::aio {

struct HandleOptions {
  std::size_t block_size = 1u << 20;  // DeepSpeed's defaults
  int queue_depth = 128;
  bool single_submit = false;
  bool overlap_events = false;
  int intra_op_parallelism = 1;
  Backend backend = Backend::Auto;
  bool o_direct = true;                // false: buffered I/O throughout (the baseline)
  bool fsync = false;                  // fdatasync after every write
  std::size_t bounce_bytes = 64u << 20;  // each of the two pinned bounce buffers (device I/O)
  // Synchronous host requests of at most this many bytes (and at most block_size) run inline on
  // the calling thread, unless async requests have not been collected by wait() yet: then it
  // queues behind them on the workers (in order). 0: every request goes to the workers. The
  // default: bench_aio_small (docs/python.md).
  std::size_t inline_bytes = 256u << 10;
};

// How the handle's host requests ran (sync and async; device requests count their host chunks).
struct RequestCounts {
  std::uint64_t inline_requests = 0;  // on the calling thread
  std::uint64_t queued_requests = 0;  // handed to the workers
};

class AioHandle {
 public:
  explicit AioHandle(const HandleOptions& options = {});
  ~AioHandle();  // waits for outstanding operations (errors are dropped: call wait() to see them)
  AioHandle(const AioHandle&) = delete;
  AioHandle& operator=(const AioHandle&) = delete;

  // Host or device `buffer` of `bytes` bytes; returns the bytes transferred. Reading past the end
  // of the file is an error. Writes create the file if needed (no truncation, like DeepSpeed).
  std::int64_t sync_pread(void* buffer, std::size_t bytes, const std::string& path, std::int64_t file_offset = 0);
  std::int64_t sync_pwrite(const void* buffer, std::size_t bytes, const std::string& path,
                           std::int64_t file_offset = 0);
  // Queued: the buffer must not be touched until wait() returns.
  void async_pread(void* buffer, std::size_t bytes, const std::string& path, std::int64_t file_offset = 0);
  void async_pwrite(const void* buffer, std::size_t bytes, const std::string& path, std::int64_t file_offset = 0);
  // DeepSpeed's combined form; `validate` re-reads (or reads back) with plain buffered I/O and
  // compares, throwing on a mismatch (sync only).
  std::int64_t pread(void* buffer, std::size_t bytes, const std::string& path, bool validate, bool async,
                     std::int64_t file_offset = 0);
  std::int64_t pwrite(const void* buffer, std::size_t bytes, const std::string& path, bool validate, bool async,
                      std::int64_t file_offset = 0);
  // Blocks until every queued operation is done; returns how many completed since the last
  // wait(). The first error of any of them is thrown here.
  int wait();

  // Pinned (page-locked) host memory from the pinned caching allocator, aligned for O_DIRECT.
  void* new_cpu_locked_tensor(std::size_t bytes);
  void free_cpu_locked_tensor(void* p);

  std::size_t get_block_size() const { return opts_.block_size; }
  int get_queue_depth() const { return opts_.queue_depth; }
  bool get_single_submit() const { return opts_.single_submit; }
  bool get_overlap_events() const { return opts_.overlap_events; }
  int get_intra_op_parallelism() const { return opts_.intra_op_parallelism; }
  static constexpr std::size_t get_alignment() { return 4096; }
  Backend backend() const;             // the backend that actually runs
  const std::string& fallback_reason() const;  // why Auto did not get io_uring ("" if it did)
  RequestCounts request_counts() const;

 private:
  struct Impl;
  HandleOptions opts_;
  std::unique_ptr<Impl> impl_;
};

// Plain buffered I/O of a whole buffer (the baselines and `validate`): read/write with pread/pwrite.
void buffered_read(void* buffer, std::size_t bytes, const std::string& path, std::int64_t file_offset = 0);
void buffered_write(const void* buffer, std::size_t bytes, const std::string& path, std::int64_t file_offset = 0,
                    bool fsync = false);

}  // namespace cutrain::aio
