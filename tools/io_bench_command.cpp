// `cutrain io-bench`: DeepSpeed's ds_io with its flags, units and output lines ("Task Read Speed =
// X GB/sec", GB = 1024^3 bytes), with the buffered and the raw multi-threaded O_DIRECT baselines
// measured in the same run.
#include <iomanip>
#include <iostream>
#include <sstream>

#include "runtime/aio/gds_handle.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/commands.h"
#include "tools/io_measure.h"

namespace cutrain::tools {
namespace {

struct IoBenchArgs {
  std::vector<std::string> folders;
  std::vector<std::string> mapping;
  std::string io_size = "1G", block_size = "1M", backend = "auto";
  bool read = false, single_submit = false, sequential_requests = false, gpu = false, use_gds = false,
       validate = false, handle = false, no_direct = false, no_baselines = false;
  int queue_depth = 32, io_parallel = 1, loops = 3, threads = 1;
};

int parse_gpu_index(const std::string& mapping, const std::string& index) {
  char* end = nullptr;
  const long g = std::strtol(index.c_str(), &end, 10);
  CUTRAIN_CHECK(!index.empty() && *end == '\0' && g >= 0 && g < 1024, "--folder_to_device_mapping '", mapping,
                "': expected FOLDER:GPU_INDEX with a GPU index >= 0, found '", index, "'");
  return static_cast<int>(g);
}

int run_io_bench(const IoBenchArgs& a) {
  IoJob job;
  job.folders = a.folders;
  job.gpus.assign(job.folders.size(), a.gpu ? 0 : -1);
  for (const auto& m : a.mapping) {  // "folder:gpu"; the GPU is used with --gpu, ignored for CPU buffers
    auto colon = m.rfind(':');
    CUTRAIN_CHECK(colon != std::string::npos, "--folder_to_device_mapping '", m, "': expected FOLDER:GPU_INDEX, found ",
                  "no ':'");
    const int g = parse_gpu_index(m, m.substr(colon + 1));
    job.folders.push_back(m.substr(0, colon));
    job.gpus.push_back(a.gpu ? g : -1);
  }
  CUTRAIN_CHECK(!job.folders.empty(), "io-bench: expected --folder or --folder_to_device_mapping, found neither");
  CUTRAIN_CHECK(a.threads >= 1 && a.threads <= 256, "--threads: expected a count in [1, 256], found ", a.threads);
  CUTRAIN_CHECK(a.loops >= 1, "--loops: expected a count >= 1, found ", a.loops);
  CUTRAIN_CHECK(a.queue_depth >= 1, "--queue_depth: expected a depth >= 1, found ", a.queue_depth);
  CUTRAIN_CHECK(a.io_parallel >= 1, "--io_parallel: expected a count >= 1, found ", a.io_parallel);
  if (a.gpu || a.use_gds) {
    std::string why;
    CUTRAIN_CHECK(gpu_available(&why), a.use_gds ? "--use_gds" : "--gpu", ": expected a CUDA device for the GPU ",
                  "buffers, found none (", why, ")");
  }
  CUTRAIN_CHECK(!a.use_gds || a.gpu, "--use_gds: expected --gpu too (GDS moves device buffers), found CPU buffers");
  if (a.use_gds) {
    std::string why;
    CUTRAIN_CHECK(aio::gds_available(&why), "--use_gds: expected GPUDirect Storage (cuFile), found it unavailable: ",
                  why, " (without --use_gds device buffers go through pinned bounce buffers)");
  }
  // --threads N: N files per folder, all driven at once (ds_io's concurrent streams).
  const std::vector<std::string> folders = job.folders;
  const std::vector<int> gpus = job.gpus;
  for (int t = 1; t < a.threads; ++t) {
    job.folders.insert(job.folders.end(), folders.begin(), folders.end());
    job.gpus.insert(job.gpus.end(), gpus.begin(), gpus.end());
  }
  job.use_gds = a.use_gds;
  job.io_size = parse_size_flag("--io_size", a.io_size);
  job.read = a.read;
  job.loops = a.loops;
  job.validate = a.validate;
  job.handle.block_size = parse_size_flag("--block_size", a.block_size);
  job.handle.queue_depth = a.queue_depth;
  job.handle.single_submit = a.single_submit;
  job.handle.overlap_events = !a.sequential_requests;
  job.handle.intra_op_parallelism = a.io_parallel;
  job.handle.backend = aio::parse_backend(a.backend);
  job.handle.o_direct = !a.no_direct;
  const char* what = a.read ? "Read" : "Write";
  std::cout << "io-bench: " << (a.read ? "read " : "write ") << job.folders.size() << " x " << job.io_size
            << " bytes, block_size " << job.handle.block_size << ", queue_depth " << job.handle.queue_depth
            << ", io_parallel " << job.handle.intra_op_parallelism << ", single_submit " << a.single_submit
            << ", overlap_events " << job.handle.overlap_events << ", " << (a.gpu ? "GPU" : "CPU") << " buffers, "
            << job.loops << " loops; GB/sec = 1024^3 bytes per second (ds_io's unit)\n";
  IoResult r = run_io_job(job);
  std::cout << std::fixed << std::setprecision(2) << "backend: " << r.backend << "\n"
            << "Task " << what << " Speed = " << gb_per_s(r.task_bytes_per_s) << " GB/sec\n"
            << "E2E " << what << " Speed = " << gb_per_s(r.e2e_bytes_per_s) << " GB/sec\n";
  if (!a.no_baselines) {
    IoJob base = job;
    base.loops = std::max(1, job.loops);
    const double buffered = buffered_baseline_bytes_per_s(base);
    int threads = 0;
    const double odirect = odirect_threads_baseline_bytes_per_s(base, &threads);
    std::cout << "Baseline buffered " << what << " Speed = " << gb_per_s(buffered) << " GB/sec (one thread, page cache "
              << (a.read ? "dropped" : "flushed with fdatasync") << ")\n"
              << "Baseline O_DIRECT threads " << what << " Speed = " << gb_per_s(odirect) << " GB/sec (best of 1/2/4/8 "
              << "threads: " << threads << ", 8 MiB blocks)\n"
              << "Ratio task/buffered = " << r.task_bytes_per_s / buffered << ", task/O_DIRECT-threads = "
              << r.task_bytes_per_s / odirect << "\n";
  }
  return 0;
}

}  // namespace

CLI::App* setup_io_bench_command(CLI::App& parent, int& exit_code) {
  auto* a = new IoBenchArgs;  // lives for the process, like the CLI app
  CLI::App* sub = parent.add_subcommand("io-bench", "Benchmark async tensor I/O (DeepSpeed's ds_io: flags and units)");
  sub->add_option("--folder", a->folders, "Folder(s) to read from / write to (one file each)");
  sub->add_option("--folder_to_device_mapping", a->mapping,
                  "FOLDER:GPU pairs (the GPU holds that folder's buffer with --gpu; ignored for CPU buffers)");
  sub->add_option("--io_size", a->io_size, "Bytes per file (K, M, G suffixes: powers of 1024)")->capture_default_str();
  sub->add_flag("--read", a->read, "Read (default: write)");
  sub->add_option("--threads", a->threads, "Files per folder driven at once")->capture_default_str();
  sub->add_option("--block_size", a->block_size, "I/O block size")->capture_default_str();
  sub->add_option("--queue_depth", a->queue_depth, "Requests in flight per worker")->capture_default_str();
  sub->add_flag("--single_submit", a->single_submit, "One submission call per request");
  sub->add_flag("--sequential_requests", a->sequential_requests,
                "Wait for a batch to complete before submitting more (overlap_events off)");
  sub->add_flag("--validate", a->validate, "Compare with a buffered read");
  sub->add_flag("--handle", a->handle, "Use the aio handle (accepted for ds_io's command lines: always the handle)");
  sub->add_option("--loops", a->loops, "Timed repetitions (the median is reported)")->capture_default_str();
  sub->add_option("--io_parallel", a->io_parallel, "Worker threads per file (intra_op_parallelism)")
      ->capture_default_str();
  sub->add_flag("--gpu", a->gpu, "Use GPU memory buffers");
  sub->add_flag("--use_gds", a->use_gds, "GPUDirect Storage (with --gpu)");
  sub->add_option("--backend", a->backend, "auto | io_uring | libaio | threads")->capture_default_str();
  sub->add_flag("--no_direct", a->no_direct, "Buffered I/O instead of O_DIRECT");
  sub->add_flag("--no_baselines", a->no_baselines, "Skip the buffered and O_DIRECT-threads baselines");
  sub->callback([a, &exit_code] { exit_code = run_io_bench(*a); });
  return sub;
}

}  // namespace cutrain::tools
