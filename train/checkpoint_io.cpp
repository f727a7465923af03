#include "train/checkpoint_io.h"

#include <array>
#include <cstdlib>

#include "runtime/aio/aio_file.h"
#include "runtime/aio/aio_handle.h"
#include "runtime/choice.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace cutrain::train {

namespace {
constexpr std::array<Choice<CheckpointIo>, 3> kCheckpointIos{
    {{CheckpointIo::Auto, "auto"}, {CheckpointIo::Aio, "aio"}, {CheckpointIo::Plain, "plain"}}};
}  // namespace

CheckpointIo parse_checkpoint_io(std::string_view s) {
  for (const Choice<CheckpointIo>& c : kCheckpointIos)
    if (s == c.name) return c.value;
  CUTRAIN_FAIL("checkpoint io: expected \"auto\", \"aio\" or \"plain\", found \"", s, "\"");
}

const char* checkpoint_io_name(CheckpointIo io) { return choice_name(kCheckpointIos, io, "?"); }

CheckpointFiles::CheckpointFiles(CheckpointIo requested, const aio::HandleOptions& handle) : io_(requested) {
  if (io_ == CheckpointIo::Auto) {
    if (const char* env = std::getenv("CUTRAIN_CHECKPOINT_IO"); env && *env) {
      try {
        io_ = parse_checkpoint_io(env);
      } catch (const Error& e) {
        CUTRAIN_FAIL("CUTRAIN_CHECKPOINT_IO=", env, ": ", e.message());
      }
      why_ = detail::concat("CUTRAIN_CHECKPOINT_IO=", env);
    }
  }
  if (io_ == CheckpointIo::Auto) {
    handle_ = std::make_unique<aio::AioHandle>(handle);
    if (handle_->backend() == aio::Backend::Threads) {
      io_ = CheckpointIo::Plain;
      why_ = "no kernel async I/O backend (" + handle_->fallback_reason() + ")";
      handle_.reset();
    } else {
      io_ = CheckpointIo::Aio;
      why_ = std::string("aio backend ") + aio::backend_name(handle_->backend());
    }
  }
  if (io_ == CheckpointIo::Aio && !handle_) handle_ = std::make_unique<aio::AioHandle>(handle);
  if (why_.empty()) why_ = std::string("asked for ") + checkpoint_io_name(io_);
}

CheckpointFiles::~CheckpointFiles() = default;

FileDigest CheckpointFiles::write_safetensors(const std::filesystem::path& path,
                                             std::span<const SafetensorsEntry> tensors,
                                             const SafetensorsMetadata& metadata) {
  const SafetensorsImage img = safetensors_image(path, tensors, metadata);
  std::vector<std::span<const std::byte>> pieces;
  pieces.reserve(img.data.size() + 1);
  pieces.emplace_back(reinterpret_cast<const std::byte*>(img.prefix.data()), img.prefix.size());
  pieces.insert(pieces.end(), img.data.begin(), img.data.end());
  Xxh64 sum;
  if (io_ == CheckpointIo::Plain) {
    for (const auto& p : pieces) sum.update(p.data(), p.size());
    cutrain::write_file_atomic(path, pieces);
  } else {
    aio::write_file_atomic(*handle_, path, pieces, aio::kFileChunkBytes, &sum);
  }
  return {img.total_bytes(), sum.digest()};
}

std::optional<FileDigest> CheckpointFiles::read(const SafetensorsReader& r, std::span<const TensorRead> reads,
                                                bool digest) {
  const std::uint64_t size = std::filesystem::file_size(r.path());
  if (io_ == CheckpointIo::Plain) {
    for (const auto& t : reads) {
      CUTRAIN_CHECK(!t.device, "checkpoint io: a read into device memory needs the aio path (tensor '", t.name, "')");
      r.read(t.name, t.dst, t.bytes);
    }
    if (!digest) return std::nullopt;
    return xxh64_file(r.path());
  }
  std::vector<aio::FileRange> ranges;
  ranges.reserve(reads.size() + 1);
  std::vector<char> head;
  if (digest) {  // the header too, so that the pass covers the file from its first byte
    head.resize(r.data_start());
    ranges.push_back({0, head.data(), head.size()});
  }
  for (const auto& t : reads) {
    const SafetensorsTensorInfo& info = r.tensor(t.name);
    CUTRAIN_CHECK(t.bytes == info.bytes(), "safetensors '", r.path().string(), "': tensor '", t.name, "' holds ",
                  info.bytes(), " bytes (", info.dtype_name, "), but the destination has ", t.bytes);
    ranges.push_back({r.data_start() + info.begin, t.dst, t.bytes, t.device});
  }
  Xxh64 sum;
  const auto [lo, hi] = aio::read_ranges(*handle_, r.path(), ranges, aio::kFileChunkBytes, digest ? &sum : nullptr);
  if (!digest) return std::nullopt;
  if (lo == 0 && hi == size) return FileDigest{size, sum.digest()};
  return xxh64_file(r.path());  // the reads left part of the file out: hash it whole
}

}  // namespace cutrain::train
