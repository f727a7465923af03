// `cutrain io-bench`: DeepSpeed's ds_io equivalent, with the buffered and the raw multi-threaded
// O_DIRECT baselines measured in the same run.
#include <iomanip>
#include <iostream>
#include <sstream>

#include "runtime/aio/gds_handle.h"
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
       validate = false, no_direct = false, no_baselines = false;
  int queue_depth = 32, io_parallel = 1, loops = 3;
};

int run_io_bench(const IoBenchArgs& a) {
  IoJob job;
  job.folders = a.folders;
  for (const auto& m : a.mapping) {  // "folder:gpu"
    auto colon = m.rfind(':');
    CUTRAIN_CHECK(colon != std::string::npos, "--folder_to_device_mapping '", m, "': expected FOLDER:GPU_INDEX");
    job.folders.push_back(m.substr(0, colon));
    job.gpus.resize(job.folders.size() - 1, a.gpu ? 0 : -1);
    job.gpus.push_back(std::stoi(m.substr(colon + 1)));
  }
  CUTRAIN_CHECK(!job.folders.empty(), "give --folder or --folder_to_device_mapping");
  job.gpus.resize(job.folders.size(), a.gpu ? 0 : -1);
  job.use_gds = a.use_gds;
  if (a.use_gds) {
    std::string why;
    CUTRAIN_CHECK(aio::gds_available(&why), "GDS not available: ", why,
                  " (run without --use_gds: device buffers then go through pinned bounce buffers)");
  }
  job.io_size = parse_size(a.io_size);
  job.read = a.read;
  job.loops = a.loops;
  job.validate = a.validate;
  job.handle.block_size = parse_size(a.block_size);
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
            << job.loops << " loops\n";
  IoResult r = run_io_job(job);
  std::cout << std::fixed << std::setprecision(2) << "backend: " << r.backend << "\n"
            << "Task " << what << " Speed = " << r.task_gbps << " GB/sec\n"
            << "E2E " << what << " Speed = " << r.e2e_gbps << " GB/sec\n";
  if (!a.no_baselines) {
    IoJob base = job;
    base.loops = std::max(1, job.loops);
    double buffered = buffered_baseline_gbps(base);
    int threads = 0;
    double odirect = odirect_threads_baseline_gbps(base, &threads);
    std::cout << "Baseline buffered " << what << " Speed = " << buffered << " GB/sec (one thread, page cache "
              << (a.read ? "dropped" : "flushed with fdatasync") << ")\n"
              << "Baseline O_DIRECT threads " << what << " Speed = " << odirect << " GB/sec (best of 1/2/4/8 "
              << "threads: " << threads << ", 8 MiB blocks)\n"
              << "Ratio task/buffered = " << r.task_gbps / buffered << ", task/O_DIRECT-threads = "
              << r.task_gbps / odirect << "\n";
  }
  return 0;
}

}  // namespace

CLI::App* setup_io_bench_command(CLI::App& parent, int& exit_code) {
  auto* a = new IoBenchArgs;  // lives for the process, like the CLI app
  CLI::App* sub = parent.add_subcommand("io-bench", "Benchmark async tensor I/O (like DeepSpeed's ds_io)");
  sub->add_option("--folder", a->folders, "Folder(s) to read from / write to (one file each)");
  sub->add_option("--folder_to_device_mapping", a->mapping, "FOLDER:GPU pairs");
  sub->add_option("--io_size", a->io_size, "Bytes per file (e.g. 400M, 1G)")->capture_default_str();
  sub->add_flag("--read", a->read, "Read (default: write)");
  sub->add_option("--block_size", a->block_size, "I/O block size")->capture_default_str();
  sub->add_option("--queue_depth", a->queue_depth, "Requests in flight per worker")->capture_default_str();
  sub->add_flag("--single_submit", a->single_submit, "One submission call per request");
  sub->add_flag("--sequential_requests", a->sequential_requests,
                "Wait for a batch to complete before submitting more (overlap_events off)");
  sub->add_option("--io_parallel", a->io_parallel, "Worker threads per file (intra_op_parallelism)")
      ->capture_default_str();
  sub->add_option("--loops", a->loops, "Timed repetitions (the median is reported)")->capture_default_str();
  sub->add_flag("--gpu", a->gpu, "Use GPU memory buffers");
  sub->add_flag("--use_gds", a->use_gds, "GPUDirect Storage");
  sub->add_flag("--validate", a->validate, "Compare with a buffered read");
  sub->add_option("--backend", a->backend, "auto | io_uring | libaio | threads")->capture_default_str();
  sub->add_flag("--no_direct", a->no_direct, "Buffered I/O instead of O_DIRECT");
  sub->add_flag("--no_baselines", a->no_baselines, "Skip the buffered and O_DIRECT-threads baselines");
  sub->callback([a, &exit_code] { exit_code = run_io_bench(*a); });
  return sub;
}

}  // namespace cutrain::tools
