// StateOffloader: the bookkeeping of named device states and their host (or NVMe) copies.
// Order of an offload: validate every name, allocate every host buffer (exhaustion changes
// nothing), then copy, then free device memory. Order of a reload: allocate every device buffer
// (exhaustion changes nothing), then copy.
#include "runtime/offload.h"

#include <functional>
#include <future>
#include <map>
#include <mutex>

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "runtime/aio/aio_handle.h"
#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/nvtx.h"
#include "runtime/staged_copy.h"

namespace cutrain {

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

bool debug_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("CUTRAIN_DEBUG");
    return v && *v && std::string_view(v) != "0";
  }();
  return on;
}

template <typename... Args>
void debug_log(Args&&... args) {
  if (debug_enabled()) std::cerr << "[offload] " << detail::concat(std::forward<Args>(args)...) << "\n";
}

// Pageable host memory: page-aligned (huge-page aligned and advised when large, so a copy into
// it takes fewer page faults). nullptr on exhaustion.
void* pageable_alloc(std::size_t bytes) {
  const std::size_t align = bytes >= kHugePage ? kHugePage : kPage;
  const std::size_t padded = (bytes + align - 1) / align * align;
  if (padded < bytes) return nullptr;  // overflow
  void* p = std::aligned_alloc(align, padded);
#ifdef MADV_HUGEPAGE
  if (p && align == kHugePage) madvise(p, padded, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
  return p;
}

// File names from state names: keep [A-Za-z0-9._-], replace the rest.
std::string file_stem(const std::string& name) {
  std::string s = name;
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  return s;
}

}  // namespace

const char* offload_device_name(OffloadDevice d) { return d == OffloadDevice::Cpu ? "cpu" : "nvme"; }

OffloadDevice parse_offload_device(std::string_view s) {
  if (s == "cpu") return OffloadDevice::Cpu;
  if (s == "nvme") return OffloadDevice::Nvme;
  CUTRAIN_FAIL("offload device: expected \"cpu\" or \"nvme\", got \"", s, "\"");
}

struct StateOffloader::State {
  std::string name;
  Buffer* buffer = nullptr;  // a Buffer state, or
  ExternalState ext;         // a caller-owned one
  std::size_t bytes = 0;
  bool offloaded = false;
  OffloadDevice where = OffloadDevice::Cpu;
  // The host copy (kept across round trips and reused; see free_offload_buffers).
  void* host = nullptr;
  std::size_t host_bytes = 0;
  bool host_pinned = false;
  bool host_staged = false;               // pageable, copied through the staged copier
  std::string file;                       // NVMe: the state's file while offloaded
  std::shared_ptr<Event> reload_done;     // a reload copy possibly still in flight
  bool release_pending = false;           // external state: device memory freed once the copy is done
  bool nvme_busy = false;                 // part of the NVMe job in flight

  void* device_ptr() const { return buffer ? buffer->get() : (ext.data ? ext.data() : nullptr); }
};

struct StateOffloader::Impl {
  std::vector<std::unique_ptr<State>> states;
  cudaStream_t copy = nullptr;  // the process-wide copy stream of the device (copy_stream())
  // Non-blocking offloads whose copies may still run: their completion event and what then
  // remains to do (release external states, return segments to the driver).
  struct PendingOffload {
    std::shared_ptr<Event> done;
    std::vector<State*> releases;
  };
  std::vector<PendingOffload> pending;
  std::unique_ptr<aio::AioHandle> aio;
  aio::HandleOptions aio_options;
  // The NVMe job in flight (non-blocking NVMe offload or reload).
  struct NvmeJob {
    std::future<void> done;
    std::vector<State*> states;
    bool write = false;
  };
  std::optional<NvmeJob> job;

  aio::AioHandle& handle() {
    if (!aio) aio = std::make_unique<aio::AioHandle>(aio_options);
    return *aio;
  }

  // One file of an NVMe job: a state's device bytes and the file they go to or come from.
  struct NvmeItem {
    void* ptr;
    std::size_t bytes;
    std::string file;
  };
  using NvmeBody = std::function<void(aio::AioHandle&, const std::vector<NvmeItem>&)>;
  // Starts the NVMe job of `states`: on a thread of its own, on this device, once `owner` has run
  // the work queued so far, `body` moves the bytes of `items`.
  void start_nvme_job(cudaStream_t owner, bool write, const std::vector<State*>& states,
                      std::vector<NvmeItem> items, NvmeBody body) {
    auto ready = std::make_shared<Event>(false);
    ready->record(owner);
    aio::AioHandle& h = handle();
    const int dev = current_device();
    NvmeJob j;
    j.write = write;
    j.states = states;
    j.done = std::async(std::launch::async, [&h, ready, items = std::move(items), dev, body = std::move(body)] {
      CUTRAIN_CUDA_CHECK(cudaSetDevice(dev));
      ready->synchronize();
      body(h, items);
    });
    job = std::move(j);
  }
  std::unique_ptr<StagedCopier> staged;  // pageable copies (created on first use)

  StagedCopier& staged_copier() {
    if (!staged) staged = std::make_unique<StagedCopier>();
    return *staged;
  }

  void free_host(State& s) {
    if (!s.host) return;
    if (s.host_pinned) pinned_allocator().deallocate(s.host);
    else std::free(s.host);
    s.host = nullptr;
    s.host_bytes = 0;
    s.host_pinned = false;
  }
};

StateOffloader::StateOffloader(CachingAllocator& device_alloc, cudaStream_t owner_stream)
    : alloc_(device_alloc), owner_(owner_stream), impl_(std::make_unique<Impl>()) {}

StateOffloader::~StateOffloader() {
  // No throwing from here: wait for the copies, then give the host memory back.
  try {
    synchronize();
  } catch (const Error& e) {
    std::cerr << "[offload] warning: while destroying the offloader: " << e.message() << "\n";
  }
  bool pinned = impl_->staged != nullptr;
  try {
    impl_->staged.reset();
  } catch (...) {
  }
  for (auto& s : impl_->states) {
    if (s->offloaded && s->where == OffloadDevice::Cpu && s->host)
      std::cerr << "[offload] warning: state '" << s->name << "' is destroyed while offloaded (its data is lost)\n";
    if (s->offloaded && s->where == OffloadDevice::Nvme && !s->file.empty()) {
      debug_log("state '", s->name, "' is destroyed while offloaded: removing ", s->file);
      std::remove(s->file.c_str());  // nothing can reload it any more
    }
    pinned = pinned || (s->host && s->host_pinned);
    try {
      impl_->free_host(*s);
    } catch (...) {
    }
  }
  if (pinned) {
    try {
      pinned_allocator().empty_cache();
    } catch (...) {
    }
  }
}

// One copy stream per device for the whole process, never destroyed: blocks recorded on it with
// record_stream can be freed after this offloader is gone, and the allocator then records an
// event on the stream. A destroyed stream's handle is invalid (cudaErrorContextIsDestroyed at
// teardown), so the stream must outlive every block.
cudaStream_t StateOffloader::copy_stream() {
  if (!impl_->copy) {
    static std::mutex m;
    static std::map<int, cudaStream_t>* streams = new std::map<int, cudaStream_t>;
    const int dev = current_device();
    std::lock_guard<std::mutex> g(m);
    auto it = streams->find(dev);
    if (it == streams->end()) {
      cudaStream_t cs = nullptr;
      CUTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
      nvtx_name_stream(cs, "offload copy");
      it = streams->emplace(dev, cs).first;
    }
    impl_->copy = it->second;
  }
  return impl_->copy;
}

void StateOffloader::add(const std::string& name, Buffer* buffer) {
  CUTRAIN_CHECK(buffer != nullptr, "StateOffloader::add('", name, "'): the buffer is null");
  CUTRAIN_CHECK(!name.empty(), "StateOffloader::add: empty state name");
  CUTRAIN_CHECK(!has(name), "StateOffloader::add: state '", name, "' is registered already");
  auto s = std::make_unique<State>();
  s->name = name;
  s->buffer = buffer;
  s->bytes = buffer->bytes();
  impl_->states.push_back(std::move(s));
}

void StateOffloader::add(const std::string& name, ExternalState state) {
  CUTRAIN_CHECK(!name.empty(), "StateOffloader::add: empty state name");
  CUTRAIN_CHECK(!has(name), "StateOffloader::add: state '", name, "' is registered already");
  CUTRAIN_CHECK(state.data && state.release && state.reallocate, "StateOffloader::add('", name,
                "'): an external state needs all three callbacks (data, release, reallocate)");
  auto s = std::make_unique<State>();
  s->name = name;
  s->bytes = state.bytes;
  s->ext = std::move(state);
  impl_->states.push_back(std::move(s));
}

bool StateOffloader::has(const std::string& name) const {
  for (const auto& s : impl_->states)
    if (s->name == name) return true;
  return false;
}

std::vector<std::string> StateOffloader::names() const {
  std::vector<std::string> out;
  for (const auto& s : impl_->states) out.push_back(s->name);
  return out;
}

const StateOffloader::State& StateOffloader::find(const std::string& name) const {
  for (const auto& s : impl_->states)
    if (s->name == name) return *s;
  std::string valid;
  for (const auto& s : impl_->states) valid += (valid.empty() ? "" : ", ") + s->name;
  CUTRAIN_FAIL("offload: unknown state '", name, "'; valid states: ", valid.empty() ? "(none registered)" : valid);
}

StateOffloader::State& StateOffloader::find(const std::string& name) {
  return const_cast<State&>(static_cast<const StateOffloader*>(this)->find(name));
}

std::vector<StateOffloader::State*> StateOffloader::select(const std::vector<std::string>& names) {
  std::vector<State*> out;
  if (names.empty()) {
    for (auto& s : impl_->states) out.push_back(s.get());
    return out;
  }
  for (const auto& n : names) {  // every name checked before anything moves
    State* s = &find(n);
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

bool StateOffloader::is_offloaded(const std::string& name) const { return find(name).offloaded; }
std::size_t StateOffloader::bytes(const std::string& name) const { return find(name).bytes; }

const void* StateOffloader::host_buffer(const std::string& name) const { return find(name).host; }
void* StateOffloader::device_ptr(const std::string& name) const { return find(name).device_ptr(); }

std::size_t StateOffloader::offloaded_bytes() const {
  std::size_t n = 0;
  for (const auto& s : impl_->states)
    if (s->offloaded) n += s->bytes;
  return n;
}

std::size_t StateOffloader::host_buffer_bytes() const {
  std::size_t n = 0;
  for (const auto& s : impl_->states) n += s->host_bytes;
  return n;
}

std::size_t StateOffloader::pinned_buffer_bytes() const {
  std::size_t n = 0;
  for (const auto& s : impl_->states)
    if (s->host_pinned) n += s->host_bytes;
  return n;
}

void StateOffloader::finish_nvme_job(bool wait) {
  auto& job = impl_->job;
  if (!job) return;
  if (!wait && job->done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
  Impl::NvmeJob j = std::move(*job);
  job.reset();
  auto release = [](State* s) {
    if (s->buffer) s->buffer->reset();
    else s->ext.release();
  };
  try {
    j.done.get();
  } catch (...) {
    for (State* s : j.states) {
      s->nvme_busy = false;
      if (j.write) {  // the device memory was never released: the state stays resident
        s->offloaded = false;
        s->file.clear();
      } else {  // the files are intact: the state stays offloaded in them
        release(s);
        s->offloaded = true;
      }
    }
    if (!j.write) alloc_.empty_cache();
    throw;
  }
  for (State* s : j.states) {
    s->nvme_busy = false;
    if (j.write) {
      release(s);
    } else {
      std::remove(s->file.c_str());
      s->file.clear();
    }
  }
  if (j.write) alloc_.empty_cache();
}

void StateOffloader::set_aio_options(const aio::HandleOptions& options) {
  finish_nvme_job(true);
  impl_->aio.reset();
  impl_->aio_options = options;
}

void StateOffloader::reap() {
  finish_nvme_job(false);
  auto& pend = impl_->pending;
  if (pend.empty()) return;
  bool any = false;
  for (auto it = pend.begin(); it != pend.end();) {
    if (!it->done->query()) {
      ++it;
      continue;
    }
    for (State* s : it->releases) {
      s->ext.release();
      s->release_pending = false;
    }
    it = pend.erase(it);
    any = true;
  }
  if (any) alloc_.empty_cache();
}

void StateOffloader::synchronize() {
  finish_nvme_job(true);
  if (impl_->copy) CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(impl_->copy));
  reap();
  for (auto& s : impl_->states) s->reload_done.reset();
}

void StateOffloader::offload(const std::vector<std::string>& names, const OffloadOptions& opt) {
  std::vector<State*> sel = select(names);
  finish_nvme_job(true);  // one NVMe job at a time; a finished write also releases its memory here
  std::vector<State*> todo;
  for (State* s : sel) {
    if (s->offloaded) {
      debug_log("state '", s->name, "' is offloaded already: skipped");
      continue;
    }
    if (s->bytes == 0) {
      debug_log("state '", s->name, "' is empty: nothing to offload");
      continue;
    }
    if (s->buffer)
      CUTRAIN_CHECK(s->buffer->bytes() == s->bytes && s->buffer->get(), "offload of state '", s->name,
                    "': its buffer changed outside the offloader (registered with ", s->bytes, " bytes, now ",
                    s->buffer->bytes(), ")");
    else
      CUTRAIN_CHECK(s->ext.data() != nullptr, "offload of state '", s->name, "': its device pointer is null");
    todo.push_back(s);
  }
  if (opt.device == OffloadDevice::Nvme) {
    CUTRAIN_CHECK(!opt.nvme_path.empty(), "offload to nvme: no folder given (OffloadOptions::nvme_path is empty)");
    struct stat st {};
    CUTRAIN_CHECK(::stat(opt.nvme_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "offload to nvme: '", opt.nvme_path,
                  "' is not an existing folder");
  }
  if (todo.empty()) return;
  NvtxRange range("offload_states");

  if (opt.device == OffloadDevice::Cpu) {
    // 1. Host buffers for all of them (reused when the kind and size fit).
    std::vector<State*> fresh;
    for (State* s : todo) {
      if (s->host && s->host_pinned == opt.pin_memory && s->host_bytes >= s->bytes) continue;
      void* p = nullptr;
      std::string why;
      if (opt.pin_memory) {
        try {
          p = pinned_allocator().allocate(s->bytes);
        } catch (const Error& e) {  // OutOfMemoryError, or the driver refusing the size
          why = e.message();
        }
      } else {
        p = pageable_alloc(s->bytes);
        if (!p) why = "aligned_alloc returned null";
      }
      if (!p) {
        for (State* f : fresh) impl_->free_host(*f);
        CUTRAIN_FAIL("offload of state '", s->name, "' (", s->bytes, " bytes, ", format_bytes(double(s->bytes)),
                     "): host memory exhausted allocating its ", opt.pin_memory ? "pinned" : "pageable",
                     " buffer (", why, "); nothing was offloaded and the device state is intact");
      }
      if (s->host) {  // cannot be a leftover in use: an offloaded state is never in `todo`
        if (impl_->copy) CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(impl_->copy));  // a reload may still read the old buffer
        impl_->free_host(*s);
      }
      s->host = p;
      s->host_bytes = s->bytes;
      s->host_pinned = opt.pin_memory;
      fresh.push_back(s);
    }
    for (State* s : todo) s->host_staged = !opt.pin_memory && opt.pageable_staging;

    // 2. Copies on the copy stream, after the owner's queued work.
    cudaStream_t cs = copy_stream();
    Event ready(false);
    ready.record(owner_);
    ready.wait_on(cs);
    for (State* s : todo) {
      if (s->host_staged) impl_->staged_copier().to_host(s->host, s->device_ptr(), s->bytes, cs);
      else CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(s->host, s->device_ptr(), s->bytes, cudaMemcpyDeviceToHost, cs));
    }
    auto done = std::make_shared<Event>(false);
    done->record(cs);

    // 3. Free the device memory.
    if (!opt.non_blocking) {
      done->synchronize();
      for (State* s : todo) {
        if (s->buffer) s->buffer->reset();
        else s->ext.release();
      }
      alloc_.empty_cache();
    } else {
      Impl::PendingOffload p{done, {}};
      for (State* s : todo) {
        if (s->buffer) {
          alloc_.record_stream(s->buffer->get(), cs);  // the block waits for the copy before reuse
          s->buffer->reset();
        } else {
          s->release_pending = true;
          p.releases.push_back(s);
        }
      }
      impl_->pending.push_back(std::move(p));
    }
    for (State* s : todo) {
      s->offloaded = true;
      s->where = OffloadDevice::Cpu;
      s->reload_done.reset();
    }
    return;
  }

  // NVMe: each state to <folder>/<name>.state through the aio handle; a temp name renamed into
  // place once written.
  aio::AioHandle& handle = impl_->handle();
  if (opt.non_blocking) {
    // A background job: after the owner's queued work, write; the memory is released by reap.
    std::vector<Impl::NvmeItem> items;
    for (State* s : todo) items.push_back({s->device_ptr(), s->bytes, opt.nvme_path + "/" + file_stem(s->name) + ".state"});
    std::vector<std::string> files;
    for (const Impl::NvmeItem& it : items) files.push_back(it.file);
    impl_->start_nvme_job(owner_, /*write=*/true, todo, std::move(items),
                          [](aio::AioHandle& h, const std::vector<Impl::NvmeItem>& job_items) {
                            std::vector<std::string> written;
                            try {
                              for (const Impl::NvmeItem& it : job_items) {
                                const std::string tmp = it.file + ".tmp";
                                h.sync_pwrite(it.ptr, it.bytes, tmp);
                                CUTRAIN_SYS_CHECK(std::rename(tmp.c_str(), it.file.c_str()));
                                written.push_back(it.file);
                              }
                            } catch (...) {
                              for (const Impl::NvmeItem& it : job_items) std::remove((it.file + ".tmp").c_str());
                              for (const auto& f : written) std::remove(f.c_str());
                              throw;
                            }
                          });
    for (std::size_t i = 0; i < todo.size(); ++i) {
      State* s = todo[i];
      s->offloaded = true;
      s->where = OffloadDevice::Nvme;
      s->file = files[i];
      s->nvme_busy = true;
      s->reload_done.reset();
    }
    return;
  }
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(owner_));
  if (impl_->copy) CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(impl_->copy));
  std::vector<std::string> files;
  try {
    for (State* s : todo) {
      std::string file = opt.nvme_path + "/" + file_stem(s->name) + ".state";
      std::string tmp = file + ".tmp";
      handle.sync_pwrite(s->device_ptr(), s->bytes, tmp);
      CUTRAIN_SYS_CHECK(std::rename(tmp.c_str(), file.c_str()));
      files.push_back(file);
    }
  } catch (...) {
    for (const auto& f : files) std::remove(f.c_str());
    throw;  // nothing freed yet: the device state is intact
  }
  for (std::size_t i = 0; i < todo.size(); ++i) {
    State* s = todo[i];
    if (s->buffer) s->buffer->reset();
    else s->ext.release();
    s->offloaded = true;
    s->where = OffloadDevice::Nvme;
    s->file = files[i];
    s->reload_done.reset();
  }
  alloc_.empty_cache();
}

void StateOffloader::reload(bool non_blocking) { reload({}, non_blocking); }

void StateOffloader::reload(const std::vector<std::string>& names, bool non_blocking) {
  std::vector<State*> sel = select(names);
  std::vector<State*> todo;
  for (State* s : sel) {
    if (!s->offloaded) debug_log("state '", s->name, "' is resident: reload skipped");
    else todo.push_back(s);
  }
  if (todo.empty()) return;
  NvtxRange range("reload_states");
  finish_nvme_job(true);  // a write in flight must land before its file is read
  reap();
  // An external state whose release waits on a copy: finish that first (the callbacks free and
  // reallocate in order).
  for (State* s : todo)
    if (s->release_pending) {
      synchronize();
      break;
    }

  // Device memory state by state; a state's copy is queued as soon as its block exists, so the
  // later allocations overlap the earlier copies. Each copy waits for the owner stream at its
  // block's allocation point (the block may come from owner-stream work still queued). On
  // exhaustion, what this call took is given back (a block with a queued copy is held back by
  // record_stream until the copy is done) and every state stays offloaded with its host copy.
  std::vector<State*> got, cpu, nvme;
  std::vector<std::shared_ptr<Event>> cpu_done;
  cudaStream_t cs = nullptr;
  try {
    for (State* s : todo) {
      if (s->buffer) *s->buffer = Buffer(alloc_, s->bytes, owner_);
      else s->ext.reallocate();
      got.push_back(s);
      if (s->where != OffloadDevice::Cpu) {
        nvme.push_back(s);
        continue;
      }
      if (!cs) cs = copy_stream();
      Event ready(false);
      ready.record(owner_);
      ready.wait_on(cs);
      if (s->host_staged) impl_->staged_copier().to_device(s->device_ptr(), s->host, s->bytes, cs);
      else CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(s->device_ptr(), s->host, s->bytes, cudaMemcpyHostToDevice, cs));
      // One event per state: a user waiting for the first state does not wait for the others.
      auto done = std::make_shared<Event>(false);
      done->record(cs);
      // If the owner frees the block before waiting for the reload, it is still held back.
      if (s->buffer) alloc_.record_stream(s->buffer->get(), cs);
      cpu.push_back(s);
      cpu_done.push_back(std::move(done));
    }
  } catch (...) {
    if (cs) cudaStreamSynchronize(cs);  // external states: their release must not race the copy
    for (State* s : got) {
      if (s->buffer) s->buffer->reset();
      else s->ext.release();
    }
    throw;
  }
  ++generation_;

  if (!cpu.empty()) {
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      cpu[i]->offloaded = false;
      cpu[i]->reload_done = cpu_done[i];
    }
    if (!non_blocking) {
      cpu_done.back()->synchronize();  // the copy stream runs them in order
      for (State* s : cpu) s->reload_done.reset();
    }
  }
  if (!nvme.empty() && non_blocking) {
    // A background job reads the files once the owner stream has passed the allocation point;
    // wait_resident joins it.
    std::vector<Impl::NvmeItem> items;
    for (State* s : nvme) items.push_back({s->device_ptr(), s->bytes, s->file});
    impl_->start_nvme_job(owner_, /*write=*/false, nvme, std::move(items),
                          [](aio::AioHandle& h, const std::vector<Impl::NvmeItem>& job_items) {
                            for (const Impl::NvmeItem& it : job_items) h.sync_pread(it.ptr, it.bytes, it.file);
                          });
    for (State* s : nvme) {
      s->offloaded = false;
      s->nvme_busy = true;
      s->reload_done.reset();
    }
  } else if (!nvme.empty()) {
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(owner_));  // the new blocks' previous users are done
    for (std::size_t i = 0; i < nvme.size(); ++i) {
      State* s = nvme[i];
      try {
        impl_->handle().sync_pread(s->device_ptr(), s->bytes, s->file);
      } catch (...) {  // this one and the rest stay offloaded in their files
        for (std::size_t j = i; j < nvme.size(); ++j) {
          if (nvme[j]->buffer) nvme[j]->buffer->reset();
          else nvme[j]->ext.release();
        }
        throw;
      }
      std::remove(s->file.c_str());
      s->file.clear();
      s->offloaded = false;
    }
  }
}

void StateOffloader::wait_resident(const std::string& name, cudaStream_t stream) {
  State& s = find(name);
  if (s.nvme_busy && !s.offloaded) finish_nvme_job(true);  // its read job: the data is on the device after it
  CUTRAIN_CHECK(!s.offloaded, "state '", name, "' is offloaded to ", offload_device_name(s.where),
                ": reload it (reload_states) before using it");
  if (!s.reload_done) return;
  if (s.reload_done->query()) {
    s.reload_done.reset();
    return;
  }
  if (impl_->copy && stream == impl_->copy) return;  // same stream: ordered already
  s.reload_done->wait_on(stream);
}

void StateOffloader::ensure_resident(cudaStream_t stream) {
  bool any = false;
  for (auto& s : impl_->states) any = any || s->offloaded;
  if (any) {
    debug_log("ensure_resident: reloading the offloaded states");
    reload(true);
  }
  for (auto& s : impl_->states) wait_resident(s->name, stream);
  reap();
}

void StateOffloader::free_offload_buffers() {
  for (auto& s : impl_->states)
    CUTRAIN_CHECK(!(s->offloaded && s->where == OffloadDevice::Cpu), "free_offload_buffers: state '", s->name,
                  "' is offloaded: its host buffer holds its only copy (reload first)");
  synchronize();
  bool pinned = impl_->staged != nullptr;
  impl_->staged.reset();  // its pinned bounce buffers
  for (auto& s : impl_->states) {
    pinned = pinned || (s->host && s->host_pinned);
    impl_->free_host(*s);
  }
  if (pinned) pinned_allocator().empty_cache();
}

}  // namespace cutrain
