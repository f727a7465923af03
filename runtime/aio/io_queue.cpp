#include "runtime/aio/io_queue.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace cutrain::aio {

std::unique_ptr<IoQueue> make_uring_queue(const QueueOptions& o, std::string* why);   // uring_queue.cpp
std::unique_ptr<IoQueue> make_libaio_queue(const QueueOptions& o, std::string* why);  // libaio_queue.cpp

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Auto: return "auto";
    case Backend::IoUring: return "io_uring";
    case Backend::LibAio: return "libaio";
    case Backend::Threads: return "threads";
  }
  return "?";
}

Backend parse_backend(const std::string& s) {
  if (s == "auto") return Backend::Auto;
  if (s == "io_uring" || s == "uring") return Backend::IoUring;
  if (s == "libaio" || s == "aio") return Backend::LibAio;
  if (s == "threads" || s == "pread") return Backend::Threads;
  CUTRAIN_FAIL("unknown I/O backend '", s, "': expected auto, io_uring, libaio or threads");
}

void finish_sync(const Piece& p, std::size_t done) {
  auto* base = static_cast<char*>(p.buf);
  while (done < p.len) {
    ssize_t r = p.read ? ::pread(p.fd, base + done, p.len - done, p.offset + static_cast<std::int64_t>(done))
                       : ::pwrite(p.fd, base + done, p.len - done, p.offset + static_cast<std::int64_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      CUTRAIN_FAIL(p.read ? "read of " : "write of ", p.len, " bytes at offset ", p.offset, " of '",
                   p.path ? *p.path : "?", "' failed after ", done, " bytes: ", std::strerror(errno));
    }
    if (r == 0)
      CUTRAIN_FAIL(p.read ? "read of " : "write of ", p.len, " bytes at offset ", p.offset, " of '",
                   p.path ? *p.path : "?", "' hit end of file after ", done, " bytes");
    done += static_cast<std::size_t>(r);
  }
}

namespace {
class ThreadQueue final : public IoQueue {
 public:
  void run(std::vector<Piece>& pieces) override {
    for (auto& p : pieces) finish_sync(p, 0);
  }
  Backend backend() const override { return Backend::Threads; }
};
}  // namespace

std::unique_ptr<IoQueue> make_queue(Backend wanted, const QueueOptions& o, std::string* why) {
  CUTRAIN_CHECK(o.queue_depth >= 1 && o.queue_depth <= 4096, "queue_depth must be in [1, 4096], got ", o.queue_depth);
  std::string reasons;
  if (wanted == Backend::IoUring || wanted == Backend::Auto) {
    std::string r;
    if (auto q = make_uring_queue(o, &r)) return q;
    if (wanted == Backend::IoUring) CUTRAIN_FAIL("io_uring backend unavailable: ", r);
    reasons += "io_uring: " + r + "; ";
  }
  if (wanted == Backend::LibAio || wanted == Backend::Auto) {
    std::string r;
    if (auto q = make_libaio_queue(o, &r)) {
      if (why) *why = reasons;
      return q;
    }
    if (wanted == Backend::LibAio) CUTRAIN_FAIL("libaio backend unavailable: ", r);
    reasons += "libaio: " + r + "; ";
  }
  if (why) *why = reasons;
  return std::make_unique<ThreadQueue>();
}

std::unique_ptr<IoQueue> queue_unavailable(std::string* why, std::string reason) {
  if (why) *why = std::move(reason);
  return nullptr;
}

}  // namespace cutrain::aio
