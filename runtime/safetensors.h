// @brief safetensors files (the Hugging Face format): an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}} padded with spaces to 8
// bytes, then the tensors back to back with no holes, each aligned to its element size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/file_util.h"

namespace cutrain {

// One tensor to write: host memory, row-major, `shape` elements of `dtype`.
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  const void* data;
};

using SafetensorsMetadata = std::map<std::string, std::string>;

// Writes atomically (temp file, fsync, rename). Names must be unique, non-empty and not
// "__metadata__"; dims >= 0. Tensors are laid out by element size, largest first, then by name
// (what the reference implementation does), so every tensor is aligned to its element size.
void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                       const SafetensorsMetadata& metadata = {});

// The bytes of that file without writing it: `prefix` (the 8-byte length and the padded JSON
// header), then `data` in file order (views of the entries' memory). write_safetensors writes
// exactly prefix + data; other writers (the aio checkpoint path) can too. Same checks and errors.
struct SafetensorsImage {
  std::string prefix;
  std::vector<std::span<const std::byte>> data;
  std::uint64_t total_bytes() const;
};
SafetensorsImage safetensors_image(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                                   const SafetensorsMetadata& metadata = {});

// "BF16" for DType::BF16 etc.
const char* safetensors_dtype_name(DType t);

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;        // as in the file: "BF16", "F32", "I64", ...
  std::optional<DType> dtype;    // when cutrain has the type
  std::size_t element_size = 0;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte range within the data section
  std::uint64_t numel() const;
  std::uint64_t bytes() const { return end - begin; }
};

// Opens and validates a file: header length vs file size, JSON, dtypes, shapes, offsets in range,
// dtype x shape == byte range, no overlaps and no holes, unique names. Every error names the file
// (and the tensor). Tensor data is read on demand.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  // In file order (by offset).
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  std::uint64_t data_start() const { return data_start_; }  // file offset of the data section
  bool contains(std::string_view name) const;
  const SafetensorsTensorInfo& tensor(std::string_view name) const;  // Error naming file and tensor if absent

  // Copies the tensor's bytes into `dst` (`dst_bytes` must equal its size).
  void read(std::string_view name, void* dst, std::size_t dst_bytes) const;
  std::vector<std::byte> read(std::string_view name) const;

 private:
  ReadOnlyFile file_;
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
  SafetensorsMetadata metadata_;
};

}  // namespace cutrain
