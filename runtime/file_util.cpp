#include "runtime/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace cutrain {
namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) { return detail::concat(std::strerror(err), " (errno ", err, ")"); }

// A distinct temp name per writer, also across threads of one process.
fs::path temp_name_for(const fs::path& path) {
  static std::atomic<unsigned> counter{0};
  fs::path dir = path.parent_path();
  std::string name = detail::concat(".", path.filename().string(), ".tmp.", ::getpid(), ".", counter++);
  return dir.empty() ? fs::path(name) : dir / name;
}

void fsync_directory(const fs::path& path) {
  fs::path dir = path.parent_path();
  fsync_folder(dir.empty() ? fs::path(".") : dir);
}

// Opens `path` for reading; errors tell "not found" from "a directory" from "no permission".
int open_for_read(const fs::path& path, std::uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) CUTRAIN_FAIL("file not found: '", path.string(), "'");
    CUTRAIN_FAIL("cannot open '", path.string(), "' for reading: ", errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    CUTRAIN_FAIL("cannot stat '", path.string(), "': ", errno_text(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    CUTRAIN_FAIL("'", path.string(), "' is a directory, expected a file");
  }
  *size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

void pread_exact(int fd, const fs::path& path, std::uint64_t offset, void* dst, std::size_t bytes) {
  auto* p = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pread(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      CUTRAIN_FAIL("read of '", path.string(), "' at byte ", offset + done, " failed: ", errno_text(errno));
    }
    if (n == 0)
      CUTRAIN_FAIL("'", path.string(), "' ended early: expected ", bytes, " bytes at offset ", offset, ", found ",
                   done);
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

void fsync_folder(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) CUTRAIN_FAIL("cannot open directory '", dir.string(), "' to fsync it: ", errno_text(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems (e.g. certain network mounts) refuse fsync on directories: not a data loss.
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    CUTRAIN_FAIL("fsync of directory '", dir.string(), "' failed: ", errno_text(err));
}

// ---- AtomicFileWriter ----

AtomicFileWriter::AtomicFileWriter(fs::path path) : path_(std::move(path)), temp_(temp_name_for(path_)) {
  CUTRAIN_CHECK(!path_.empty() && path_.has_filename(), "write_file_atomic: expected a file path, found '",
                path_.string(), "'");
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0)
    CUTRAIN_FAIL("cannot create '", temp_.string(), "' (temp file for '", path_.string(), "'): ", errno_text(errno));
}

AtomicFileWriter::~AtomicFileWriter() { abandon(); }

void AtomicFileWriter::abandon() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(temp_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, std::size_t bytes) {
  CUTRAIN_CHECK(fd_ >= 0, "write to '", path_.string(), "' after commit or failure");
  const auto* p = static_cast<const char*>(data);
  std::size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      abandon();
      CUTRAIN_FAIL("write of '", path_.string(), "' failed after ", written_ + done, " bytes: ", errno_text(err));
    }
    done += static_cast<std::size_t>(n);
  }
  written_ += bytes;
}

void AtomicFileWriter::commit() {
  CUTRAIN_CHECK(fd_ >= 0, "commit of '", path_.string(), "' twice or after a failure");
  if (::fsync(fd_) != 0) {
    int err = errno;
    abandon();
    CUTRAIN_FAIL("fsync of '", temp_.string(), "' failed: ", errno_text(err));
  }
  if (::close(fd_) != 0) {
    int err = errno;
    fd_ = -1;
    ::unlink(temp_.c_str());
    CUTRAIN_FAIL("close of '", temp_.string(), "' failed: ", errno_text(err));
  }
  fd_ = -1;
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(temp_.c_str());
    CUTRAIN_FAIL("cannot rename '", temp_.string(), "' to '", path_.string(), "': ", errno_text(err));
  }
  fsync_directory(path_);
}

// ---- one-shot helpers ----

void write_file_atomic(const fs::path& path, std::span<const std::span<const std::byte>> pieces) {
  AtomicFileWriter w(path);
  for (const auto& piece : pieces) w.write(piece.data(), piece.size());
  w.commit();
}

void write_file_atomic(const fs::path& path, std::span<const std::byte> bytes) {
  std::span<const std::byte> one[] = {bytes};
  write_file_atomic(path, std::span<const std::span<const std::byte>>(one));
}

void write_file_atomic(const fs::path& path, std::string_view text) {
  write_file_atomic(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

std::vector<std::byte> read_file(const fs::path& path) {
  ReadOnlyFile f(path);
  std::vector<std::byte> out(f.size());
  f.read_at(0, out.data(), out.size());
  return out;
}

std::string read_text_file(const fs::path& path) {
  ReadOnlyFile f(path);
  std::string out(f.size(), '\0');
  f.read_at(0, out.data(), out.size());
  return out;
}

// ---- ReadOnlyFile ----

ReadOnlyFile::ReadOnlyFile(fs::path path) : path_(std::move(path)) { fd_ = open_for_read(path_, &size_); }

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read_at(std::uint64_t offset, void* dst, std::size_t bytes) const {
  CUTRAIN_CHECK(offset <= size_ && bytes <= size_ - offset, "read past the end of '", path_.string(),
                "': expected bytes [", offset, ", ", offset + bytes, ") within its ", size_, " bytes");
  pread_exact(fd_, path_, offset, dst, bytes);
}

bool drop_page_cache(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return true;
}

}  // namespace cutrain
