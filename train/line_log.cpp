#include "train/line_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "runtime/error.h"

namespace cutrain::train {

LineLog::LineLog(const std::string& flag, const std::filesystem::path& path) : flag_(flag), path_(path) {
  const std::filesystem::path folder = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  CUTRAIN_CHECK(std::filesystem::is_directory(folder, ec), "train: ", flag, " ", path.string(), ": the folder ",
                folder.string(), " does not exist (create it first)");
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = errno;
  CUTRAIN_CHECK(fd_ >= 0, "train: ", flag, " ", path.string(), ": cannot open it for writing (", std::strerror(err), ")");
}

LineLog::~LineLog() {
  if (fd_ >= 0) ::close(fd_);
}

LineLog::LineLog(LineLog&& o) noexcept
    : flag_(std::move(o.flag_)), path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}

LineLog& LineLog::operator=(LineLog&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    flag_ = std::move(o.flag_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void LineLog::append(const std::string& text) {
  CUTRAIN_CHECK(fd_ >= 0, "train: ", flag_, ": the log is not open");
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    const int err = errno;
    CUTRAIN_CHECK(n > 0, "train: ", flag_, " ", path_.string(), ": write failed (", std::strerror(err), ")");
    p += n;
    left -= std::size_t(n);
  }
}

}  // namespace cutrain::train
