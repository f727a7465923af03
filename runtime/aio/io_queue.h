// @brief One worker's submission engine: io_uring, libaio or plain pread/pwrite.
// A queue takes a list of pieces (fd, buffer, length, offset) and runs them all, keeping up to
// queue_depth in flight, checking every completion (errno, short transfers) with the file name,
// offset and size in the error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cutrain::aio {

enum class Backend { Auto, IoUring, LibAio, Threads };
const char* backend_name(Backend b);
Backend parse_backend(const std::string& s);  // "auto" | "io_uring" | "libaio" | "threads"

struct Piece {
  int fd = -1;
  void* buf = nullptr;
  std::size_t len = 0;
  std::int64_t offset = 0;
  bool read = true;
  const std::string* path = nullptr;  // for messages
};

struct QueueOptions {
  int queue_depth = 128;
  bool single_submit = false;   // one submission syscall per piece (else batched)
  bool overlap_events = false;  // refill as completions arrive (else submit a batch, wait for all)
};

class IoQueue {
 public:
  virtual ~IoQueue() = default;
  // Runs every piece to completion. Short transfers are finished with further calls; an error
  // or end-of-file throws cutrain::Error naming the file, offset and size.
  virtual void run(std::vector<Piece>& pieces) = 0;
  virtual Backend backend() const = 0;
};

// Creates a queue of the wanted backend; Auto tries io_uring, then libaio, then threads.
// A backend that cannot start (not compiled in, refused by the kernel) falls back the same way
// under Auto and throws when asked for explicitly; `why` gets the reason of each fallback.
std::unique_ptr<IoQueue> make_queue(Backend wanted, const QueueOptions& opts, std::string* why = nullptr);

// Finishes a piece synchronously with pread/pwrite from `done` bytes on (short-transfer repair
// and the last-resort backend). Throws on error or EOF.
void finish_sync(const Piece& p, std::size_t done);

// For the backends' factories: no queue, with `reason` in `why` (when given).
std::unique_ptr<IoQueue> queue_unavailable(std::string* why, std::string reason);

}  // namespace cutrain::aio
