// @brief Whole files through the aio handle (checkpoints): an atomic write of byte pieces and
// ranged reads, both through two 4096-aligned staging chunks (pinned when a GPU is present), so
// the handle's O_DIRECT body path is used whatever the alignment of the caller's memory, and the
// disk I/O of one chunk overlaps the memcpy of the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <utility>
#include <vector>

#include "runtime/aio/aio_handle.h"
#include "runtime/xxhash64.h"

namespace cutrain::aio {

constexpr std::size_t kFileChunkBytes = std::size_t{64} << 20;

// Writes `pieces` back to back as `path`: to AtomicFileWriter's temp name through `handle`, then
// fsync, rename over `path`, fsync the folder. A failure leaves no temp file and the old `path`.
// `sum`, when given, is updated with every byte written (each chunk hashed while the other one's
// write runs).
void write_file_atomic(AioHandle& handle, const std::filesystem::path& path,
                       std::span<const std::span<const std::byte>> pieces, std::size_t chunk_bytes = kFileChunkBytes,
                       Xxh64* sum = nullptr);

// One range of a file to read into host memory, or device memory when `device` (copied from the
// pinned staging chunk, which the next chunk's read overlaps).
struct FileRange {
  std::uint64_t offset = 0;
  void* dst = nullptr;
  std::size_t bytes = 0;
  bool device = false;
};

// Reads every range (any order; they may not overlap each other's destinations) by streaming the
// file span they cover through the staging chunks. A range past the end of the file is an error
// naming the file.
// `sum`, when given, is updated with every byte of the span read (from the first range's offset
// rounded down to 4096 to the end of the last range, in file order): with ranges from offset 0 to
// the end of the file, the whole file's XXH64 in the same pass. Returns the span [begin, end).
std::pair<std::uint64_t, std::uint64_t> read_ranges(AioHandle& handle, const std::filesystem::path& path,
                                                    std::span<const FileRange> ranges,
                                                    std::size_t chunk_bytes = kFileChunkBytes, Xxh64* sum = nullptr);

}  // namespace cutrain::aio
