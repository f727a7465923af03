// io_uring backend: one ring per worker thread, queue_depth entries.
#include <memory>
#include <string>

#include "runtime/aio/io_queue.h"

#if CUTRAIN_HAVE_LIBURING
#include <liburing.h>

#include <cstring>

#include "runtime/error.h"

namespace cutrain::aio {
namespace {

class UringQueue final : public IoQueue {
 public:
  UringQueue(io_uring ring, const QueueOptions& o) : ring_(ring), o_(o) {}
  ~UringQueue() override { io_uring_queue_exit(&ring_); }
  Backend backend() const override { return Backend::IoUring; }

  void run(std::vector<Piece>& pieces) override {
    std::size_t next = 0, inflight = 0, completed = 0;
    const std::size_t n = pieces.size();
    while (completed < n) {
      // Fill: under overlap_events keep the queue full; otherwise only refill once it drained.
      if (o_.overlap_events || inflight == 0) {
        std::size_t queued = 0;
        while (next < n && inflight < static_cast<std::size_t>(o_.queue_depth)) {
          io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
          if (!sqe) break;
          Piece& p = pieces[next];
          if (p.read)
            io_uring_prep_read(sqe, p.fd, p.buf, static_cast<unsigned>(p.len), static_cast<__u64>(p.offset));
          else
            io_uring_prep_write(sqe, p.fd, p.buf, static_cast<unsigned>(p.len), static_cast<__u64>(p.offset));
          io_uring_sqe_set_data64(sqe, next);
          ++next;
          ++inflight;
          ++queued;
          if (o_.single_submit) submit();
        }
        if (!o_.single_submit && queued) submit();
      }
      // Reap: with overlap, one completion at a time (then refill); else the whole batch.
      do {
        io_uring_cqe* cqe = nullptr;
        int r = io_uring_wait_cqe(&ring_, &cqe);
        if (r == -EINTR) continue;
        if (r < 0) CUTRAIN_FAIL("io_uring_wait_cqe failed: ", std::strerror(-r));
        const std::size_t idx = io_uring_cqe_get_data64(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        --inflight;
        ++completed;
        Piece& p = pieces[idx];
        if (res < 0)
          CUTRAIN_FAIL(p.read ? "read of " : "write of ", p.len, " bytes at offset ", p.offset, " of '",
                       p.path ? *p.path : "?", "' failed (io_uring): ", std::strerror(-res));
        if (static_cast<std::size_t>(res) < p.len) finish_sync(p, static_cast<std::size_t>(res));
      } while (!o_.overlap_events && inflight > 0);
    }
  }

 private:
  void submit() {
    int r;
    do r = io_uring_submit(&ring_);
    while (r == -EINTR || r == -EAGAIN);
    if (r < 0) CUTRAIN_FAIL("io_uring_submit failed: ", std::strerror(-r));
  }

  io_uring ring_;
  QueueOptions o_;
};

}  // namespace

std::unique_ptr<IoQueue> make_uring_queue(const QueueOptions& o, std::string* why) {
  io_uring ring;
  if (int r = io_uring_queue_init(static_cast<unsigned>(o.queue_depth), &ring, 0); r < 0)
    return queue_unavailable(why, std::string("io_uring_queue_init: ") + std::strerror(-r));
  return std::make_unique<UringQueue>(ring, o);
}

}  // namespace cutrain::aio

#else

namespace cutrain::aio {
std::unique_ptr<IoQueue> make_uring_queue(const QueueOptions&, std::string* why) {
  return queue_unavailable(why, "cutrain was built without liburing (install liburing-dev and reconfigure)");
}
}  // namespace cutrain::aio

#endif
