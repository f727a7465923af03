// @brief How checkpoint files travel to and from disk. `aio`: through the aio handle
// (runtime/aio/aio_file.h: O_DIRECT, two aligned staging chunks, pinned with a GPU; still a temp
// name, fsync and rename). `plain`: buffered write() / pread() (AtomicFileWriter, ReadOnlyFile).
// Both write byte-identical files. `auto` takes CUTRAIN_CHECKPOINT_IO (aio | plain) when set,
// else aio when the handle gets a kernel async backend (io_uring or libaio), else plain.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "runtime/aio/aio_handle.h"
#include "runtime/safetensors.h"
#include "runtime/xxhash64.h"


namespace cutrain::train {

enum class CheckpointIo { Auto, Aio, Plain };
CheckpointIo parse_checkpoint_io(std::string_view s);  // "auto" | "aio" | "plain", else an error
const char* checkpoint_io_name(CheckpointIo io);

// One tensor to read: all of its bytes into `dst`.
struct TensorRead {
  std::string name;
  void* dst = nullptr;
  std::size_t bytes = 0;
  bool device = false;  // dst is device memory (the aio path only)
};

// The files of one save or load (it holds the aio handle for them).
class CheckpointFiles {
 public:
  explicit CheckpointFiles(CheckpointIo requested = CheckpointIo::Auto, const aio::HandleOptions& handle = {});
  ~CheckpointFiles();
  CheckpointFiles(const CheckpointFiles&) = delete;
  CheckpointFiles& operator=(const CheckpointFiles&) = delete;

  CheckpointIo io() const { return io_; }  // Aio or Plain, never Auto
  const std::string& why() const { return why_; }  // how Auto decided

  // Returns the file's size and XXH64, computed over the bytes handed to the write.
  FileDigest write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                               const SafetensorsMetadata& metadata = {});
  // Sizes checked against the file's tensors (an error names the file and tensor). With `digest`,
  // also the whole file's size and XXH64: on the aio path from the same pass (the header read with
  // the tensors), on the plain path from a second one.
  std::optional<FileDigest> read(const SafetensorsReader& reader, std::span<const TensorRead> reads,
                                 bool digest = false);

 private:
  CheckpointIo io_;
  std::string why_;
  std::unique_ptr<aio::AioHandle> handle_;
};

}  // namespace cutrain::train
