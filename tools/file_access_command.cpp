// `cutrain file-access`: DeepSpeedExamples' deepnvme/file_access workload: the four operations
// (load/store of a CPU tensor and of a GPU tensor), each through plain buffered file I/O and
// through the async I/O handle, in the same run, with the speed-up. GB/sec is 1024^3 bytes per
// second, as in DeepSpeed's tools.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <random>
#include <vector>

#include "runtime/aio/aio_handle.h"
#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/file_util.h"
#include "tools/commands.h"
#include "tools/io_measure.h"

namespace cutrain::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string folder = "/tmp";
  std::string size = "1G";
  int loops = 3;
  bool no_gpu = false;
};

template <typename F>
double median_seconds(int loops, const std::string& file, bool drop, F&& f) {
  std::vector<double> s;
  for (int i = 0; i < loops; ++i) {
    if (drop) drop_page_cache(file);
    auto t0 = Clock::now();
    f();
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

int run(const Args& a) {
  CUTRAIN_CHECK(std::filesystem::is_directory(a.folder), "--folder '", a.folder, "' is not a directory");
  const std::size_t n = parse_size_flag("--size", a.size);
  const bool gpu = !a.no_gpu && gpu_available();
  const std::string file = (std::filesystem::path(a.folder) / "cutrain_file_access.bin").string();
  // The CPU tensor: pinned memory where a GPU exists (what the handle's users allocate).
  void* cpu = gpu ? pinned_allocator().allocate(n) : std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  CUTRAIN_CHECK(cpu, "cannot allocate ", n, " bytes");
  std::mt19937_64 rng(1);
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    std::uint64_t r = rng();
    std::memcpy(static_cast<char*>(cpu) + i, &r, 8);
  }
  void* dev = nullptr;
  if (gpu) {
    CUTRAIN_CUDA_CHECK(cudaMalloc(&dev, n));
    CUTRAIN_CUDA_CHECK(cudaMemcpy(dev, cpu, n, cudaMemcpyHostToDevice));
  }
  std::vector<char> bounce(gpu ? n : 0);
  aio::AioHandle h;
  struct Row {
    const char* op;
    double py, aio;
  };
  std::vector<Row> rows;
  auto write_fresh = [&](auto&& f) {
    return median_seconds(a.loops, file, false, [&] {
      std::filesystem::remove(file);
      f();
      int fd = ::open(file.c_str(), O_RDONLY);
      ::fdatasync(fd);  // a store is done when it is on the device
      ::close(fd);
    });
  };
  rows.push_back({"store CPU tensor", write_fresh([&] { aio::buffered_write(cpu, n, file); }),
                  write_fresh([&] { h.sync_pwrite(cpu, n, file); })});
  rows.push_back({"load CPU tensor", median_seconds(a.loops, file, true, [&] { aio::buffered_read(cpu, n, file); }),
                  median_seconds(a.loops, file, true, [&] { h.sync_pread(cpu, n, file); })});
  if (gpu) {
    rows.push_back({"store GPU tensor", write_fresh([&] {
                      CUTRAIN_CUDA_CHECK(cudaMemcpy(bounce.data(), dev, n, cudaMemcpyDeviceToHost));
                      aio::buffered_write(bounce.data(), n, file);
                    }),
                    write_fresh([&] { h.sync_pwrite(dev, n, file); })});
    rows.push_back({"load GPU tensor", median_seconds(a.loops, file, true, [&] {
                      aio::buffered_read(bounce.data(), n, file);
                      CUTRAIN_CUDA_CHECK(cudaMemcpy(dev, bounce.data(), n, cudaMemcpyHostToDevice));
                    }),
                    median_seconds(a.loops, file, true, [&] { h.sync_pread(dev, n, file); })});
    // The round trip must be exact.
    std::vector<char> back(n);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(back.data(), dev, n, cudaMemcpyDeviceToHost));
    CUTRAIN_CHECK(std::memcmp(back.data(), cpu, n) == 0, "file-access: GPU tensor differs after the round trip");
  }
  std::cout << "file-access: " << n << " bytes in '" << a.folder << "', " << a.loops << " loops (median), backend "
            << aio::backend_name(h.backend()) << (gpu ? "" : ", no GPU: CPU tensors only")
            << "; GB/sec = 1024^3 bytes per second\n";
  std::cout << "| operation | buffered GB/sec | cutrain aio GB/sec | speed-up |\n|---|---:|---:|---:|\n"
            << std::fixed << std::setprecision(2);
  for (const auto& r : rows)
    std::cout << "| " << r.op << " | " << gb_per_s(n / r.py) << " | " << gb_per_s(n / r.aio) << " | " << r.py / r.aio
              << "x |\n";
  std::filesystem::remove(file);
  if (dev) CUTRAIN_CUDA_CHECK(cudaFree(dev));
  if (gpu)
    pinned_allocator().deallocate(cpu);
  else
    std::free(cpu);
  return 0;
}

}  // namespace

CLI::App* setup_file_access_command(CLI::App& parent, int& exit_code) {
  auto* a = new Args;
  CLI::App* sub = parent.add_subcommand(
      "file-access", "Load/store a CPU and a GPU tensor: buffered file I/O vs the async handle (deepnvme/file_access)");
  sub->add_option("--folder", a->folder, "Folder for the test file")->capture_default_str();
  sub->add_option("--size", a->size, "Tensor size (e.g. 1G)")->capture_default_str();
  sub->add_option("--loops", a->loops, "Repetitions (median)")->capture_default_str();
  sub->add_flag("--no_gpu", a->no_gpu, "CPU tensors only");
  sub->callback([a, &exit_code] { exit_code = run(*a); });
  return sub;
}

}  // namespace cutrain::tools
