// @brief StateOffloader: moves named device buffers ("states") to pinned or pageable host memory,
// or to files on NVMe, and back, releasing the device memory in between: the mechanism under
// DeepSpeed-style offload_states / reload_states.
//
// Ordering. Every state belongs to one "owner" stream (the stream its users run on). An offload
// first makes the copy stream wait for the work queued on the owner stream, so it copies what
// that work wrote. A reload allocates on the owner stream and makes the copy stream wait for that
// allocation point (the block may have been freed by owner-stream work still queued). A
// non-blocking reload returns at once: before touching a state, its users call
// wait_resident(name, stream) (or ensure_resident(stream)), which makes `stream` wait for the
// state's reload copy. A non-blocking offload drops the allocator's allocated bytes at once (the
// freed block is held back, via record_stream, until the copy is done); the reserved segments
// go back to the driver at the next call that finds the copies done (or synchronize()).
//
// NVMe jobs. A non-blocking NVMe offload starts a background job that waits for the owner
// stream's queued work (an event), writes each state's device memory to its file through the aio
// handle, and renames it into place; the device memory stays allocated until the job is done and
// is released by the next call that finds it done (reap: offload, reload, wait_resident,
// ensure_resident, synchronize). A non-blocking NVMe reload allocates the device memory on the
// owner stream and starts a job that reads the files into it; wait_resident (or
// ensure_resident, synchronize) joins that job. One job at a time: any offload or reload first
// joins the job in flight. A job's error is thrown by the call that joins it; a failed write
// leaves the states resident (their device memory was never released), a failed read leaves
// them offloaded in their files.
//
// Pointers. A reload reallocates: a state's device address may change. Users re-read
// Buffer::get() (or their ExternalState's pointer) after a reload, and anything that captured the
// old address (a CUDA graph) must be rebuilt; generation() counts reloads for that purpose.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cutrain {

class Buffer;
class CachingAllocator;
namespace aio {
struct HandleOptions;
}

enum class OffloadDevice { Cpu, Nvme };
const char* offload_device_name(OffloadDevice d);
OffloadDevice parse_offload_device(std::string_view s);  // "cpu" | "nvme", else an error

struct OffloadOptions {
  OffloadDevice device = OffloadDevice::Cpu;
  bool pin_memory = true;     // false: pageable host memory (malloc'd)
  // pin_memory == false: copy through two pinned bounce buffers with host threads
  // (runtime/staged_copy.h); false: the driver's own pageable cudaMemcpyAsync.
  bool pageable_staging = true;
  // Copies on the copy stream, returns at once. NVMe: the file I/O runs on a background job (one
  // at a time; see "NVMe jobs" above).
  bool non_blocking = false;
  std::string nvme_path;      // device == Nvme: the folder the state files go to
};

// Device memory owned by the caller: the offloader reads `data()` for the current pointer, calls
// `release()` once the host copy is complete and `reallocate()` (returning the new pointer) on
// reload. `bytes` never changes.
struct ExternalState {
  std::size_t bytes = 0;
  std::function<void*()> data;
  std::function<void()> release;
  std::function<void*()> reallocate;
};

class StateOffloader {
 public:
  // `device_alloc`: where Buffer states live (they must come from it) and whose empty_cache hands
  // freed segments back to the driver. `owner_stream`: the stream the states are used on.
  StateOffloader(CachingAllocator& device_alloc, cudaStream_t owner_stream);
  ~StateOffloader();  // waits for copies in flight; frees the host buffers
  StateOffloader(const StateOffloader&) = delete;
  StateOffloader& operator=(const StateOffloader&) = delete;

  // Registers a state. A Buffer state is reset on offload and reassigned (same size, from
  // `device_alloc`, on the owner stream) on reload; the Buffer object must outlive the offloader.
  // An empty Buffer (no bytes) is accepted and moves nothing. Names are unique.
  void add(const std::string& name, Buffer* buffer);
  void add(const std::string& name, ExternalState state);

  bool has(const std::string& name) const;
  std::vector<std::string> names() const;  // in registration order
  bool is_offloaded(const std::string& name) const;
  std::size_t bytes(const std::string& name) const;
  const void* host_buffer(const std::string& name) const;  // its host copy (null when none)
  void* device_ptr(const std::string& name) const;          // null while offloaded
  std::size_t offloaded_bytes() const;     // device bytes currently offloaded
  std::size_t host_buffer_bytes() const;   // host memory held by offload buffers (pinned + pageable)
  std::size_t pinned_buffer_bytes() const;
  std::uint64_t generation() const { return generation_; }  // +1 for every reload that reallocated

  // Offloads `names` (empty: every state). Unknown names are an error listing the valid ones;
  // states already offloaded are skipped. Host buffers are allocated for all of them before any
  // device memory is freed: on host exhaustion nothing changes and an error says so.
  void offload(const std::vector<std::string>& names = {}, const OffloadOptions& options = {});
  // Reloads every offloaded state (or `names`; resident ones are skipped), bit-identically.
  void reload(bool non_blocking = false);
  void reload(const std::vector<std::string>& names, bool non_blocking);

  // Makes `stream` wait for the reload copy of `name` (nothing to wait for: no-op). An error if
  // the state is offloaded.
  void wait_resident(const std::string& name, cudaStream_t stream);
  // Reloads what is offloaded (non-blocking) and makes `stream` wait for every reload in flight.
  void ensure_resident(cudaStream_t stream);
  // Blocks until every copy in flight is done, then returns released device segments.
  void synchronize();
  // Returns the host buffers (after waiting for copies in flight). An error while any state is
  // offloaded to host memory (its only copy lives there).
  void free_offload_buffers();

  cudaStream_t copy_stream();  // created on first use
  // Options of the aio handle used for NVMe states (block size, queue depth, workers ...). Joins
  // the NVMe job in flight; the handle is recreated on its next use.
  void set_aio_options(const aio::HandleOptions& options);

 private:
  struct State;
  struct Impl;
  State& find(const std::string& name);
  const State& find(const std::string& name) const;
  std::vector<State*> select(const std::vector<std::string>& names);
  void reap();  // completes finished non-blocking offloads: releases memory, empty_cache
  // Completes the NVMe job in flight (`wait`: blocks for it; else only when it is done). Rethrows
  // its error after restoring the states' bookkeeping.
  void finish_nvme_job(bool wait);

  CachingAllocator& alloc_;
  cudaStream_t owner_;
  std::uint64_t generation_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cutrain
