// `cutrain info`: the device, its memory and the allocator statistics, or a clear "no GPU".
#include <iostream>

#include "runtime/device.h"
#include "tools/command_registry.h"

namespace cutrain::tools {
namespace {

int run_info() {
  std::string why;
  if (!gpu_available(&why)) {
    std::cout << "cutrain: no CUDA device available (" << why << ").\n"
              << "GPU work (training, kernels, benchmarks) needs an NVIDIA GPU; CPU paths still run.\n";
    return 0;
  }
  int n = 0;
  cudaGetDeviceCount(&n);
  for (int d = 0; d < n; ++d) std::cout << describe(device_info(d)) << "\n";
  return 0;
}

CommandRegistrar reg("info", [](CLI::App& parent, int& exit_code) {
  CLI::App* sub = parent.add_subcommand("info", "Print the devices, their memory and the allocator statistics");
  sub->callback([&exit_code] { exit_code = run_info(); });
  return sub;
});

}  // namespace
}  // namespace cutrain::tools
