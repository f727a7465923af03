// `cutrain info`: the device, its memory and the allocator statistics, or a clear "no GPU".
#include <cstdio>
#include <iostream>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "tools/commands.h"

namespace cutrain::tools {
namespace {

// A training step's allocation pattern at GPT-2-small scale (124M parameters, batch 8 x 1024,
// 12 layers, width 768): flat parameter and gradient buffers, per-layer activations, small
// statistics. Activations are freed and taken again, as the next step would, to show the reuse.
void exercise_allocator(CachingAllocator& a) {
  const std::size_t params = 124'439'808, tokens = 8 * 1024, width = 768, layers = 12;
  std::vector<Buffer> keep;
  keep.emplace_back(a, params * 2);  // bf16 parameters
  keep.emplace_back(a, params * 2);  // bf16 gradients
  for (int step = 0; step < 2; ++step) {
    std::vector<Buffer> acts;
    for (std::size_t l = 0; l < layers; ++l) {
      acts.emplace_back(a, tokens * width * 2);      // layer input, bf16
      acts.emplace_back(a, tokens * 4 * width * 2);  // MLP hidden, bf16
      acts.emplace_back(a, tokens * 4 * 2);          // layernorm mean / rstd, fp32
    }
    acts.emplace_back(a, 4096);  // a small scratch (loss, norms)
  }
}

void print_stats(const CachingAllocator& a) {
  AllocatorStats s = a.stats();
  auto bytes_row = [](const char* name, const Stat& st) {
    std::printf("  %-16s %12s %12s %14s %14s\n", name, format_bytes(static_cast<double>(st.current)).c_str(),
                format_bytes(static_cast<double>(st.peak)).c_str(), format_bytes(static_cast<double>(st.allocated)).c_str(),
                format_bytes(static_cast<double>(st.freed)).c_str());
  };
  auto count_row = [](const char* name, const Stat& st) {
    std::printf("  %-16s %12lld %12lld %14lld %14lld\n", name, static_cast<long long>(st.current),
                static_cast<long long>(st.peak), static_cast<long long>(st.allocated), static_cast<long long>(st.freed));
  };
  std::printf("  %-16s %12s %12s %14s %14s\n", "", "current", "peak", "total added", "total removed");
  bytes_row("allocated bytes", s.allocated_bytes);
  bytes_row("reserved bytes", s.reserved_bytes);
  bytes_row("active bytes", s.active_bytes);
  bytes_row("requested bytes", s.requested_bytes);
  count_row("allocations", s.allocation);
  count_row("active blocks", s.active);
  count_row("segments", s.segment);
  std::printf("  raw allocs %lld, raw frees %lld, alloc retries %lld, OOMs %lld\n",
              static_cast<long long>(s.num_raw_allocs), static_cast<long long>(s.num_raw_frees),
              static_cast<long long>(s.num_alloc_retries), static_cast<long long>(s.num_ooms));
}

int run_info() {
  std::string why;
  if (!gpu_available(&why)) {
    std::cout << "cutrain: no CUDA device available (" << why << ").\n"
              << "GPU work (training, kernels, benchmarks) needs an NVIDIA GPU; CPU paths still run.\n";
    return 0;
  }
  int n = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDeviceCount(&n));
  for (int d = 0; d < n; ++d) std::cout << describe(device_info(d)) << "\n";

  CachingAllocator& a = device_allocator();
  exercise_allocator(a);
  std::cout << "\ncaching allocator, device " << current_device()
            << ", after a GPT-2-small-sized step pattern run twice (all freed again):\n";
  std::cout.flush();
  print_stats(a);
  a.empty_cache();
  std::cout << "after empty_cache: " << a.summary() << "\n";
  return 0;
}

}  // namespace

CLI::App* setup_info_command(CLI::App& parent, int& exit_code) {
  CLI::App* sub = parent.add_subcommand("info", "Print the devices, their memory and the allocator statistics");
  sub->callback([&exit_code] { exit_code = run_info(); });
  return sub;
}

}  // namespace cutrain::tools
