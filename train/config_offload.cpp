// Run-time checks of the offload sections: the NVMe swap folder must exist where the run starts.
#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "train/config.h"
#include "train/config_reader.h"

namespace cutrain::train {

void check_offload_paths(const TrainConfig& c) {
  const OffloadConfig& o = c.zero_optimization.offload_optimizer;
  if (o.device != OffloadTarget::Nvme) return;
  const std::string path = "zero_optimization.offload_optimizer.nvme_path";
  config_detail::Reader r(c.source.empty() ? std::string("config") : c.source.string(), false, nullptr);
  if (o.nvme_path.empty())
    r.fail_missing(path, "an existing folder for the optimizer state's swap files", "device is \"nvme\"");
  std::error_code ec;
  const auto st = std::filesystem::status(o.nvme_path, ec);
  if (ec || !std::filesystem::exists(st))
    r.fail(path, detail::concat("expected an existing folder for the optimizer state's swap files, found '", o.nvme_path,
                                "' does not exist (create it, on the NVMe drive)"));
  if (!std::filesystem::is_directory(st))
    r.fail(path, detail::concat("expected an existing folder for the optimizer state's swap files, found '", o.nvme_path,
                                "' is not a folder"));
  if (::access(o.nvme_path.c_str(), W_OK | X_OK) != 0)
    r.fail(path, detail::concat("expected a folder this process can write its swap files to, found '", o.nvme_path,
                                "' is not writable"));
}

}  // namespace cutrain::train
