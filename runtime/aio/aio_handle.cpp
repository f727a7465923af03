#include "runtime/aio/aio_handle.h"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::aio {

namespace {
constexpr std::size_t kAlign = AioHandle::get_alignment();

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // no GPU or unknown pointer: host memory
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

int open_or_throw(const std::string& path, int flags, bool* direct_refused = nullptr) {
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0 && (flags & O_DIRECT) && errno == EINVAL && direct_refused) {
    *direct_refused = true;  // e.g. tmpfs: no O_DIRECT
    return -1;
  }
  if (fd < 0)
    CUTRAIN_FAIL("cannot open '", path, "' for ", (flags & (O_WRONLY | O_RDWR)) ? "writing" : "reading", ": ",
                 std::strerror(errno));
  return fd;
}

// Closes a request's descriptors, each after fdatasync when `sync`; returns the first fdatasync
// failure (the descriptors are closed either way).
std::exception_ptr close_files(std::span<const int> fds, bool sync, const std::string& path) {
  std::exception_ptr first;
  for (int fd : fds) {
    if (sync && ::fdatasync(fd) != 0 && !first)
      first = std::make_exception_ptr(
          Error(detail::concat("fdatasync of '", path, "' failed: ", std::strerror(errno)), __FILE__, __LINE__));
    ::close(fd);
  }
  return first;
}

// One request in flight: its slices finish on worker threads; the last one closes the files.
struct Op {
  std::atomic<int> remaining{0};
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::vector<int> fds;
  bool fsync = false;
  std::string path;
  std::int64_t bytes = 0;

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> g(m);
    if (!error) error = e;
  }
  void finish_one() {
    if (remaining.fetch_sub(1) != 1) return;
    std::exception_ptr e = close_files(fds, fsync, path);
    std::lock_guard<std::mutex> g(m);
    if (e && !error) error = e;
    done = true;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> g(m);
    cv.wait(g, [&] { return done; });
  }
};

struct Job {
  std::shared_ptr<Op> op;
  std::vector<Piece> pieces;
};

class Worker {
 public:
  Worker(Backend b, const QueueOptions& qo) {
    std::string why;
    queue_ = make_queue(b, qo, &why);
    why_ = why;
    thread_ = std::thread([this] { loop(); });
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(Job j) {
    {
      std::lock_guard<std::mutex> g(m_);
      jobs_.push_back(std::move(j));
    }
    cv_.notify_one();
  }
  Backend backend() const { return queue_->backend(); }
  const std::string& why() const { return why_; }

 private:
  void loop() {
    for (;;) {
      Job j;
      {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        j = std::move(jobs_.front());
        jobs_.pop_front();
      }
      try {
        if (!j.pieces.empty()) queue_->run(j.pieces);
      } catch (...) {
        j.op->fail(std::current_exception());
      }
      j.op->finish_one();
    }
  }

  std::unique_ptr<IoQueue> queue_;
  std::string why_;
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
};

std::int64_t file_size(int fd, const std::string& path) {
  struct stat st {};
  CUTRAIN_CHECK(::fstat(fd, &st) == 0, "cannot stat '", path, "': ", std::strerror(errno));
  return st.st_size;
}

}  // namespace

struct AioHandle::Impl {
  HandleOptions o;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::shared_ptr<Op>> pending;
  std::vector<std::future<void>> pending_device;
  std::mutex pending_m;
  Buffer bounce[2];
  // One pair of bounce buffers per handle: device requests (sync or async) take turns on it.
  std::mutex bounce_m;
  std::string fallback;

  std::atomic<std::uint64_t> inline_count{0}, queued_count{0};

  // The descriptors of one host request and its split: [0, body) through `body_fd` (O_DIRECT when
  // the buffer and offset are 4096-aligned and the file system takes it), [body, bytes) through
  // the buffered descriptor. What the inline and the worker paths share, checks and messages too.
  struct Files {
    int fds[2] = {-1, -1};  // buffered, then O_DIRECT when opened
    int count = 0;
    int body_fd = -1;
    std::size_t body = 0;
    std::span<const int> all() const { return {fds, static_cast<std::size_t>(count)}; }
  };

  Files open_request(const void* buf, std::size_t bytes, const std::string& path, std::int64_t offset, bool read) {
    CUTRAIN_CHECK(offset >= 0, "file offset must be >= 0, got ", offset, " for '", path, "'");
    Files f;
    const int base_flags = read ? O_RDONLY : (O_WRONLY | O_CREAT);
    const int buffered_fd = open_or_throw(path, base_flags);
    f.fds[f.count++] = buffered_fd;
    if (read) {
      std::int64_t size = file_size(buffered_fd, path);
      if (offset + static_cast<std::int64_t>(bytes) > size) {
        ::close(buffered_fd);
        CUTRAIN_FAIL("cannot read ", bytes, " bytes at offset ", offset, " from '", path, "': the file holds ", size,
                     " bytes");
      }
    }
    // O_DIRECT body: the buffer and offset must be aligned; the body is a multiple of 4096.
    const bool aligned = reinterpret_cast<std::uintptr_t>(buf) % kAlign == 0 && offset % kAlign == 0;
    if (o.o_direct && aligned && bytes >= kAlign) {
      bool refused = false;
      int direct_fd;
      try {
        direct_fd = open_or_throw(path, base_flags | O_DIRECT, &refused);
      } catch (...) {
        ::close(buffered_fd);
        throw;
      }
      if (direct_fd >= 0) {
        f.fds[f.count++] = direct_fd;
        f.body_fd = direct_fd;
        f.body = bytes / kAlign * kAlign;
      }
    }
    if (f.body_fd < 0) {  // everything buffered
      f.body_fd = buffered_fd;
      f.body = bytes;
    }
    return f;
  }

  // Whether a synchronous host request runs on the calling thread: small, and nothing queued
  // before it (a queued request on the same file would otherwise be overtaken).
  bool takes_inline(std::size_t bytes) {
    if (bytes > std::min(o.inline_bytes, o.block_size)) return false;
    std::lock_guard<std::mutex> g(pending_m);
    return pending.empty() && pending_device.empty();
  }

  // A small request on the calling thread: at most one block, so the body is one piece as on a
  // worker; the unaligned tail through the buffered descriptor; pread/pwrite to completion.
  void run_inline(void* buf, std::size_t bytes, const std::string& path, std::int64_t offset, bool read) {
    inline_count.fetch_add(1, std::memory_order_relaxed);
    Files f = open_request(buf, bytes, path, offset, read);
    try {
      if (f.body > 0) finish_sync(Piece{f.body_fd, buf, f.body, offset, read, &path}, 0);
      if (f.body < bytes)
        finish_sync(Piece{f.fds[0], static_cast<char*>(buf) + f.body, bytes - f.body,
                          offset + static_cast<std::int64_t>(f.body), read, &path},
                    0);
    } catch (...) {
      close_files(f.all(), false, path);
      throw;
    }
    if (std::exception_ptr e = close_files(f.all(), !read && o.fsync, path)) std::rethrow_exception(e);
  }

  // Queues one host-memory request on the workers; returns its Op (not yet complete).
  std::shared_ptr<Op> submit_host(void* buf, std::size_t bytes, const std::string& path, std::int64_t offset,
                                  bool read) {
    queued_count.fetch_add(1, std::memory_order_relaxed);
    Files f = open_request(buf, bytes, path, offset, read);
    auto op = std::make_shared<Op>();
    op->path = path;
    op->bytes = static_cast<std::int64_t>(bytes);
    op->fsync = !read && o.fsync;
    op->fds.assign(f.fds, f.fds + f.count);
    const std::size_t body = f.body;
    const std::size_t P = workers.size();
    // Contiguous slices, each a multiple of the alignment (the last one takes the remainder).
    std::size_t slice = (body + P - 1) / P;
    slice = (slice + kAlign - 1) / kAlign * kAlign;
    std::vector<Job> jobs(P);
    for (std::size_t w = 0; w < P; ++w) {
      jobs[w].op = op;
      std::size_t begin = std::min(body, w * slice), end = std::min(body, begin + slice);
      for (std::size_t at = begin; at < end; at += o.block_size) {
        Piece p;
        p.fd = f.body_fd;
        p.buf = static_cast<char*>(buf) + at;
        p.len = std::min(o.block_size, end - at);
        p.offset = offset + static_cast<std::int64_t>(at);
        p.read = read;
        p.path = &op->path;
        jobs[w].pieces.push_back(p);
      }
    }
    if (body < bytes) {  // unaligned tail through the buffered descriptor
      Piece p;
      p.fd = f.fds[0];
      p.buf = static_cast<char*>(buf) + body;
      p.len = bytes - body;
      p.offset = offset + static_cast<std::int64_t>(body);
      p.read = read;
      p.path = &op->path;
      jobs[P - 1].pieces.push_back(p);
    }
    op->remaining = static_cast<int>(P);
    for (std::size_t w = 0; w < P; ++w) workers[w]->push(std::move(jobs[w]));
    return op;
  }

  // A synchronous host request: inline when small, else on the workers.
  void host_io(void* buf, std::size_t bytes, const std::string& path, std::int64_t offset, bool read) {
    if (takes_inline(bytes))
      run_inline(buf, bytes, path, offset, read);
    else
      finish(submit_host(buf, bytes, path, offset, read));
  }

  static void finish(const std::shared_ptr<Op>& op) {
    op->wait();
    if (op->error) std::rethrow_exception(op->error);
  }

  void ensure_bounce() {
    for (auto& b : bounce)
      if (!b) b = Buffer(pinned_allocator(), o.bounce_bytes);
  }

  // Device memory: two pinned bounce buffers; disk I/O of one chunk overlaps the copy of the other.
  void device_io(void* dev, std::size_t bytes, const std::string& path, std::int64_t offset, bool read) {
    std::lock_guard<std::mutex> hold(bounce_m);
    ensure_bounce();
    cudaStream_t s;
    CUTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t ev[2];
    for (auto& e : ev) CUTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const std::size_t chunk = o.bounce_bytes;
    const std::size_t nchunks = (bytes + chunk - 1) / chunk;
    auto len_of = [&](std::size_t i) { return std::min(chunk, bytes - i * chunk); };
    auto* d = static_cast<char*>(dev);
    try {
      if (read) {
        for (std::size_t i = 0; i < nchunks; ++i) {
          const int b = static_cast<int>(i % 2);
          if (i >= 2) CUTRAIN_CUDA_CHECK(cudaEventSynchronize(ev[b]));  // bounce b free again
          host_io(bounce[b].get(), len_of(i), path, offset + static_cast<std::int64_t>(i * chunk), true);
          CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(d + i * chunk, bounce[b].get(), len_of(i), cudaMemcpyHostToDevice, s));
          CUTRAIN_CUDA_CHECK(cudaEventRecord(ev[b], s));
        }
      } else {
        if (nchunks) {
          CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(bounce[0].get(), d, len_of(0), cudaMemcpyDeviceToHost, s));
          CUTRAIN_CUDA_CHECK(cudaEventRecord(ev[0], s));
        }
        for (std::size_t i = 0; i < nchunks; ++i) {
          const int b = static_cast<int>(i % 2);
          CUTRAIN_CUDA_CHECK(cudaEventSynchronize(ev[b]));
          if (i + 1 < nchunks) {  // start the next D2H while this chunk goes to disk
            CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(bounce[1 - b].get(), d + (i + 1) * chunk, len_of(i + 1),
                                               cudaMemcpyDeviceToHost, s));
            CUTRAIN_CUDA_CHECK(cudaEventRecord(ev[1 - b], s));
          }
          host_io(bounce[b].get(), len_of(i), path, offset + static_cast<std::int64_t>(i * chunk), false);
        }
      }
      CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
    } catch (...) {
      cudaStreamSynchronize(s);
      for (auto& e : ev) cudaEventDestroy(e);
      cudaStreamDestroy(s);
      throw;
    }
    for (auto& e : ev) CUTRAIN_CUDA_CHECK(cudaEventDestroy(e));
    CUTRAIN_CUDA_CHECK(cudaStreamDestroy(s));
  }

  void run_sync(void* buf, std::size_t bytes, const std::string& path, std::int64_t offset, bool read) {
    if (bytes == 0) return;
    if (is_device_pointer(buf))
      device_io(buf, bytes, path, offset, read);
    else
      host_io(buf, bytes, path, offset, read);
  }

  void run_async(void* buf, std::size_t bytes, const std::string& path, std::int64_t offset, bool read) {
    std::lock_guard<std::mutex> g(pending_m);
    if (bytes == 0) {
      pending_device.push_back(std::async(std::launch::deferred, [] {}));
      return;
    }
    if (is_device_pointer(buf)) {
      pending_device.push_back(std::async(std::launch::async, [=, this] { device_io(buf, bytes, path, offset, read); }));
    } else {
      pending.push_back(submit_host(buf, bytes, path, offset, read));
    }
  }
};

AioHandle::AioHandle(const HandleOptions& options) : opts_(options), impl_(std::make_unique<Impl>()) {
  CUTRAIN_CHECK(opts_.block_size >= kAlign && opts_.block_size % kAlign == 0,
                "block_size must be a positive multiple of ", kAlign, " bytes, got ", opts_.block_size);
  CUTRAIN_CHECK(opts_.intra_op_parallelism >= 1 && opts_.intra_op_parallelism <= 256,
                "intra_op_parallelism must be in [1, 256], got ", opts_.intra_op_parallelism);
  CUTRAIN_CHECK(opts_.bounce_bytes >= kAlign && opts_.bounce_bytes % kAlign == 0,
                "bounce buffer size must be a positive multiple of ", kAlign, ", got ", opts_.bounce_bytes);
  impl_->o = opts_;
  QueueOptions qo{opts_.queue_depth, opts_.single_submit, opts_.overlap_events};
  for (int i = 0; i < opts_.intra_op_parallelism; ++i)
    impl_->workers.push_back(std::make_unique<Worker>(opts_.backend, qo));
  impl_->fallback = impl_->workers.front()->why();
}

AioHandle::~AioHandle() {
  try {
    wait();
  } catch (...) {
  }
}

Backend AioHandle::backend() const { return impl_->workers.front()->backend(); }
const std::string& AioHandle::fallback_reason() const { return impl_->fallback; }
RequestCounts AioHandle::request_counts() const {
  return {impl_->inline_count.load(std::memory_order_relaxed), impl_->queued_count.load(std::memory_order_relaxed)};
}

// NVTX: the I/O phase is "io/read", "io/write", "io/wait" under whatever range is open (e.g.
// step/offload/optimizer_swap_in_wait/io/read).
std::int64_t AioHandle::sync_pread(void* b, std::size_t n, const std::string& path, std::int64_t off) {
  NvtxRange r("io/read");
  impl_->run_sync(b, n, path, off, true);
  return static_cast<std::int64_t>(n);
}
std::int64_t AioHandle::sync_pwrite(const void* b, std::size_t n, const std::string& path, std::int64_t off) {
  NvtxRange r("io/write");
  impl_->run_sync(const_cast<void*>(b), n, path, off, false);
  return static_cast<std::int64_t>(n);
}
void AioHandle::async_pread(void* b, std::size_t n, const std::string& path, std::int64_t off) {
  NvtxRange r("io/read_submit");
  impl_->run_async(b, n, path, off, true);
}
void AioHandle::async_pwrite(const void* b, std::size_t n, const std::string& path, std::int64_t off) {
  NvtxRange r("io/write_submit");
  impl_->run_async(const_cast<void*>(b), n, path, off, false);
}

namespace {
// Compares `bytes` of `buffer` (host or device) with the file's bytes at `offset`.
void validate_against_file(const void* buffer, std::size_t bytes, const std::string& path, std::int64_t offset) {
  std::vector<char> file(bytes), mine(bytes);
  buffered_read(file.data(), bytes, path, offset);
  if (is_device_pointer(buffer))
    CUTRAIN_CUDA_CHECK(cudaMemcpy(mine.data(), buffer, bytes, cudaMemcpyDeviceToHost));
  else
    std::memcpy(mine.data(), buffer, bytes);
  auto mis = std::mismatch(file.begin(), file.end(), mine.begin());
  if (mis.first != file.end())
    CUTRAIN_FAIL("validation of '", path, "' failed: first differing byte at offset ",
                 offset + (mis.first - file.begin()), " of ", bytes, " bytes");
}

// What pread and pwrite share: `async` queues the request (wait() reports it), else it runs now and
// `validate` compares the buffer with the file afterwards. Returns the bytes.
template <class Queue, class Run>
std::int64_t queued_or_now(const char* op, const char* kind, const void* b, std::size_t n, const std::string& path,
                           bool validate, bool async, std::int64_t off, Queue queue, Run run) {
  CUTRAIN_CHECK(!(validate && async), op, ": validate needs a synchronous ", kind, " (async=false)");
  if (async) {
    queue();
  } else {
    run();
    if (validate) validate_against_file(b, n, path, off);
  }
  return static_cast<std::int64_t>(n);
}
}  // namespace

std::int64_t AioHandle::pread(void* b, std::size_t n, const std::string& path, bool validate, bool async,
                              std::int64_t off) {
  return queued_or_now("pread", "read", b, n, path, validate, async, off, [&] { async_pread(b, n, path, off); },
                       [&] { sync_pread(b, n, path, off); });
}

std::int64_t AioHandle::pwrite(const void* b, std::size_t n, const std::string& path, bool validate, bool async,
                               std::int64_t off) {
  return queued_or_now("pwrite", "write", b, n, path, validate, async, off, [&] { async_pwrite(b, n, path, off); },
                       [&] { sync_pwrite(b, n, path, off); });
}

int AioHandle::wait() {
  NvtxRange r("io/wait");
  std::vector<std::shared_ptr<Op>> ops;
  std::vector<std::future<void>> dev;
  {
    std::lock_guard<std::mutex> g(impl_->pending_m);
    ops.swap(impl_->pending);
    dev.swap(impl_->pending_device);
  }
  std::exception_ptr first;
  for (auto& op : ops) {
    op->wait();
    if (op->error && !first) first = op->error;
  }
  for (auto& f : dev) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  return static_cast<int>(ops.size() + dev.size());
}

void* AioHandle::new_cpu_locked_tensor(std::size_t bytes) {
  return pinned_allocator().allocate((bytes + kAlign - 1) / kAlign * kAlign);
}
void AioHandle::free_cpu_locked_tensor(void* p) { pinned_allocator().deallocate(p); }

void buffered_read(void* buffer, std::size_t bytes, const std::string& path, std::int64_t offset) {
  int fd = open_or_throw(path, O_RDONLY);
  std::int64_t size = file_size(fd, path);
  if (offset + static_cast<std::int64_t>(bytes) > size) {
    ::close(fd);
    CUTRAIN_FAIL("cannot read ", bytes, " bytes at offset ", offset, " from '", path, "': the file holds ", size,
                 " bytes");
  }
  std::string p = path;
  Piece piece{fd, buffer, bytes, offset, true, &p};
  try {
    finish_sync(piece, 0);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

void buffered_write(const void* buffer, std::size_t bytes, const std::string& path, std::int64_t offset,
                    bool fsync) {
  int fd = open_or_throw(path, O_WRONLY | O_CREAT);
  std::string p = path;
  Piece piece{fd, const_cast<void*>(buffer), bytes, offset, false, &p};
  try {
    finish_sync(piece, 0);
    if (fsync) CUTRAIN_SYS_CHECK(::fdatasync(fd));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

}  // namespace cutrain::aio
