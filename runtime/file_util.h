// @brief Whole-file reads and crash-safe writes: a file is either its old content or its new
// content, never a torn mix (temp name in the same directory, fsync, rename, fsync the directory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cutrain {

// Streams bytes into `<dir>/.<name>.tmp.<pid>.<n>`; commit() makes it `path`. Destroyed without a
// commit (an exception on the way), it removes the temp file, so a failed save leaves no litter and
// the previous file intact.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, std::size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // fsync, rename over `path`, fsync the directory. Throws Error naming the path on failure.
  void commit();
  std::uint64_t bytes_written() const { return written_; }
  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  void abandon() noexcept;
  std::filesystem::path path_, temp_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
};

// One-shot atomic writes; `pieces` are written back to back (e.g. a header and a payload).
void write_file_atomic(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces);
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// fsync of a directory itself (its entries: names created, renamed or removed in it). A file system
// that refuses fsync on directories (EINVAL, ENOTSUP) is not an error.
void fsync_folder(const std::filesystem::path& dir);

// Whole-file reads. Errors say which path and why (not found, a directory, permission, I/O).
std::vector<std::byte> read_file(const std::filesystem::path& path);
std::string read_text_file(const std::filesystem::path& path);

// A file opened for positioned reads (large files read piecewise: checkpoints, safetensors).
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(std::filesystem::path path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  std::uint64_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  // Reads exactly `bytes` at `offset`; a range past the end is an Error naming the file.
  void read_at(std::uint64_t offset, void* dst, std::size_t bytes) const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// Writes back and evicts the page cache of `path` (fdatasync, then POSIX_FADV_DONTNEED), so the
// next read of it comes from the disk where the file system honours the advice. False when the
// file cannot be opened.
bool drop_page_cache(const std::filesystem::path& path);

}  // namespace cutrain
