// libaio backend (kernel AIO): io_setup / io_submit / io_getevents; true async only with O_DIRECT.
#include <memory>
#include <string>

#include "runtime/aio/io_queue.h"

#if CUTRAIN_HAVE_LIBAIO
#include <libaio.h>

#include <cstring>
#include <vector>

#include "runtime/error.h"

namespace cutrain::aio {
namespace {

class LibAioQueue final : public IoQueue {
 public:
  LibAioQueue(io_context_t ctx, const QueueOptions& o) : ctx_(ctx), o_(o), iocbs_(o.queue_depth), events_(o.queue_depth) {
    for (auto& cb : iocbs_) free_.push_back(&cb);
  }
  ~LibAioQueue() override { io_destroy(ctx_); }
  Backend backend() const override { return Backend::LibAio; }

  void run(std::vector<Piece>& pieces) override {
    std::size_t next = 0, inflight = 0, completed = 0;
    const std::size_t n = pieces.size();
    std::vector<iocb*> batch;
    while (completed < n) {
      if (o_.overlap_events || inflight == 0) {
        batch.clear();
        while (next < n && !free_.empty()) {
          iocb* cb = free_.back();
          free_.pop_back();
          Piece& p = pieces[next];
          if (p.read)
            io_prep_pread(cb, p.fd, p.buf, p.len, p.offset);
          else
            io_prep_pwrite(cb, p.fd, p.buf, p.len, p.offset);
          cb->data = reinterpret_cast<void*>(next);
          ++next;
          ++inflight;
          if (o_.single_submit)
            submit(&cb, 1);
          else
            batch.push_back(cb);
        }
        if (!batch.empty()) submit(batch.data(), batch.size());
      }
      long want = o_.overlap_events ? 1 : static_cast<long>(inflight);
      while (want > 0) {
        int got = io_getevents(ctx_, want, static_cast<long>(events_.size()), events_.data(), nullptr);
        if (got == -EINTR) continue;
        if (got < 0) CUTRAIN_FAIL("io_getevents failed: ", std::strerror(-got));
        for (int i = 0; i < got; ++i) {
          iocb* cb = events_[i].obj;
          const std::size_t idx = reinterpret_cast<std::size_t>(cb->data);
          const long res = static_cast<long>(events_[i].res);
          free_.push_back(cb);
          --inflight;
          ++completed;
          Piece& p = pieces[idx];
          if (res < 0)
            CUTRAIN_FAIL(p.read ? "read of " : "write of ", p.len, " bytes at offset ", p.offset, " of '",
                         p.path ? *p.path : "?", "' failed (libaio): ", std::strerror(static_cast<int>(-res)));
          if (static_cast<std::size_t>(res) < p.len) finish_sync(p, static_cast<std::size_t>(res));
        }
        want -= got;
      }
    }
  }

 private:
  void submit(iocb** cbs, std::size_t count) {
    std::size_t done = 0;
    while (done < count) {
      int r = io_submit(ctx_, static_cast<long>(count - done), cbs + done);
      if (r == -EINTR || r == -EAGAIN) continue;
      if (r < 0) CUTRAIN_FAIL("io_submit failed: ", std::strerror(-r));
      done += static_cast<std::size_t>(r);
    }
  }

  io_context_t ctx_;
  QueueOptions o_;
  std::vector<iocb> iocbs_;
  std::vector<iocb*> free_;
  std::vector<io_event> events_;
};

}  // namespace

std::unique_ptr<IoQueue> make_libaio_queue(const QueueOptions& o, std::string* why) {
  io_context_t ctx = nullptr;
  if (int r = io_setup(o.queue_depth, &ctx); r < 0)
    return queue_unavailable(why, std::string("io_setup: ") + std::strerror(-r));
  return std::make_unique<LibAioQueue>(ctx, o);
}

}  // namespace cutrain::aio

#else

namespace cutrain::aio {
std::unique_ptr<IoQueue> make_libaio_queue(const QueueOptions&, std::string* why) {
  return queue_unavailable(why, "cutrain was built without libaio (install libaio-dev and reconfigure)");
}
}  // namespace cutrain::aio

#endif
