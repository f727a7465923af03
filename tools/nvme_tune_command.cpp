// `cutrain nvme-tune`: DeepSpeed's ds_nvme_tune with its flags (--nvme_dir, --sweep_config,
// --no_read, --no_write, --gpu, --gds, --io_size, --loops, --log_dir). Runs every combination of
// the sweep, writes one log per run to --log_dir when given, prints the best read and write and
// the complete {"aio": {...}} block of a DeepSpeed config.
#include <filesystem>
#include <fstream>
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

struct TuneArgs {
  std::vector<std::string> folders;
  std::string io_size = "1G";
  std::string sweep_config, log_dir;
  // The sweep's lists from the command line; each replaces the sweep config's list when given.
  std::vector<std::string> block_sizes;
  std::vector<int> queue_depths, parallelism;
  int loops = 1;
  bool gpu = false, gds = false, no_read = false, no_write = false;
};

struct Point {
  aio::HandleOptions h;
  double bytes_per_s = 0;
};

std::string describe(const aio::HandleOptions& h) {
  std::ostringstream os;
  os << "block_size=" << size_string(h.block_size) << " queue_depth=" << h.queue_depth
     << " overlap_events=" << h.overlap_events << " single_submit=" << h.single_submit
     << " intra_op_parallelism=" << h.intra_op_parallelism;
  return os.str();
}

template <typename T>
std::string list_string(const std::vector<T>& v) {
  std::ostringstream os;
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}

int run_tune(const TuneArgs& a) {
  CUTRAIN_CHECK(!a.folders.empty(), "nvme-tune: expected --nvme_dir, found none");
  for (const auto& f : a.folders)
    CUTRAIN_CHECK(std::filesystem::is_directory(f), "--nvme_dir ", f, ": expected a writable folder on the NVMe ",
                  "drive, found no such folder");
  CUTRAIN_CHECK(!(a.no_read && a.no_write), "--no_read and --no_write: expected at most one of them, found both ",
                "(nothing would be measured)");
  CUTRAIN_CHECK(a.loops >= 1, "--loops: expected a count >= 1, found ", a.loops);
  const bool gpu = a.gpu || a.gds;  // GDS moves device buffers
  if (gpu) {
    std::string why;
    CUTRAIN_CHECK(gpu_available(&why), a.gds ? "--gds" : "--gpu", ": expected a CUDA device for the GPU buffers, ",
                  "found none (", why, ")");
  }
  if (a.gds) {
    std::string why;
    CUTRAIN_CHECK(aio::gds_available(&why), "--gds: expected GPUDirect Storage (cuFile), found it unavailable: ", why);
  }
  SweepConfig sweep = a.sweep_config.empty() ? SweepConfig{} : read_sweep_config(a.sweep_config);
  if (!a.block_sizes.empty()) {
    sweep.block_size.clear();
    for (const auto& b : a.block_sizes) sweep.block_size.push_back(parse_size_flag("--block_size", b));
  }
  if (!a.queue_depths.empty()) sweep.queue_depth = a.queue_depths;
  if (!a.parallelism.empty()) sweep.io_parallel = a.parallelism;
  for (int q : sweep.queue_depth) CUTRAIN_CHECK(q >= 1, "--queue_depth: expected depths >= 1, found ", q);
  for (int p : sweep.io_parallel) CUTRAIN_CHECK(p >= 1, "--io_parallel: expected counts >= 1, found ", p);
  const std::size_t io_size = parse_size_flag("--io_size", a.io_size);
  if (!a.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.log_dir, ec);
    CUTRAIN_CHECK(std::filesystem::is_directory(a.log_dir), "--log_dir ", a.log_dir,
                  ": expected a folder for the per-run logs (created when missing), found it cannot be created",
                  ec ? ": " + ec.message() : std::string());
  }
  std::vector<std::string> bs_names;
  for (auto b : sweep.block_size) bs_names.push_back(size_string(b));
  std::vector<int> ss(sweep.single_submit.begin(), sweep.single_submit.end()),
      oe(sweep.overlap_events.begin(), sweep.overlap_events.end());
  std::cout << "nvme-tune: " << a.folders.size() << " folder(s) x " << io_size << " bytes, " << (gpu ? "GPU" : "CPU")
            << " buffers" << (a.gds ? " through GDS" : "") << ", " << a.loops << " loop(s) per run; sweep block_size "
            << list_string(bs_names) << ", queue_depth " << list_string(sweep.queue_depth) << ", io_parallel "
            << list_string(sweep.io_parallel) << ", single_submit " << list_string(ss) << ", overlap_events "
            << list_string(oe) << "; GB/sec = 1024^3 bytes per second\n";
  Point best[2];
  std::cout << std::fixed << std::setprecision(2);
  for (int read = 1; read >= 0; --read) {
    if ((read && a.no_read) || (!read && a.no_write)) continue;
    for (std::size_t bs : sweep.block_size)
      for (int qd : sweep.queue_depth)
        for (bool overlap : sweep.overlap_events)
          for (bool single : sweep.single_submit)
            for (int par : sweep.io_parallel) {
              IoJob job;
              job.folders = a.folders;
              job.gpus.assign(a.folders.size(), gpu ? 0 : -1);
              job.io_size = io_size;
              job.read = read;
              job.loops = a.loops;
              job.use_gds = a.gds;
              job.handle.block_size = bs;
              job.handle.queue_depth = qd;
              job.handle.overlap_events = overlap;
              job.handle.single_submit = single;
              job.handle.intra_op_parallelism = par;
              IoResult r = run_io_job(job);
              std::cout << (read ? "read  " : "write ") << describe(job.handle) << " -> "
                        << gb_per_s(r.task_bytes_per_s) << " GB/sec\n";
              if (!a.log_dir.empty()) {
                const auto path = std::filesystem::path(a.log_dir) / run_log_name(read, job.handle);
                std::ofstream log(path);
                const char* what = read ? "Read" : "Write";
                log << std::fixed << std::setprecision(2) << "cutrain nvme-tune run: " << (read ? "read " : "write ")
                    << describe(job.handle) << " io_size=" << io_size << " folders=" << list_string(a.folders)
                    << " buffers=" << (gpu ? "gpu" : "cpu") << " use_gds=" << a.gds << " loops=" << a.loops
                    << " backend=" << r.backend << "\n"
                    << "Task " << what << " Speed = " << gb_per_s(r.task_bytes_per_s) << " GB/sec\n"
                    << "E2E " << what << " Speed = " << gb_per_s(r.e2e_bytes_per_s) << " GB/sec\n";
                CUTRAIN_CHECK(log.good(), "--log_dir ", a.log_dir, ": expected to write ", path.string(),
                              ", found the write failed");
              }
              if (r.task_bytes_per_s > best[read].bytes_per_s) best[read] = {job.handle, r.task_bytes_per_s};
            }
  }
  if (!a.no_read)
    std::cout << "Best read:  " << gb_per_s(best[1].bytes_per_s) << " GB/sec with " << describe(best[1].h) << "\n";
  if (!a.no_write)
    std::cout << "Best write: " << gb_per_s(best[0].bytes_per_s) << " GB/sec with " << describe(best[0].h) << "\n";
  // The reads' settings when reads were measured (the optimizer swap-in is on the critical path).
  const aio::HandleOptions& h = a.no_read ? best[0].h : best[1].h;
  std::cout << "DeepSpeed config block (" << (a.no_read ? "best write" : "best read") << "):\n"
            << aio_config_json(h, a.gds) << "\n";
  return 0;
}

}  // namespace

CLI::App* setup_nvme_tune_command(CLI::App& parent, int& exit_code) {
  auto* a = new TuneArgs;
  CLI::App* sub = parent.add_subcommand(
      "nvme-tune", "Sweep the async I/O knobs and print the best {\"aio\": ...} block (DeepSpeed's ds_nvme_tune)");
  sub->add_option("--nvme_dir,--folder", a->folders, "Folder(s) on the NVMe drive(s) to tune (--folder: an alias)")
      ->required();
  sub->add_option("--sweep_config", a->sweep_config,
                  "JSON of lists: block_size, queue_depth, io_parallel, single_submit, overlap_events "
                  "(or sequential_requests); keys left out keep the default lists");
  sub->add_flag("--no_read", a->no_read, "Skip the read runs");
  sub->add_flag("--no_write", a->no_write, "Skip the write runs");
  sub->add_option("--io_size", a->io_size, "Bytes per file per run (K, M, G: powers of 1024)")->capture_default_str();
  sub->add_flag("--gpu", a->gpu, "GPU buffers");
  sub->add_flag("--gds", a->gds, "GPUDirect Storage (implies --gpu); the block's use_gds is then true");
  sub->add_option("--log_dir", a->log_dir, "Write one log per run here (created when missing)");
  sub->add_option("--loops", a->loops, "Repetitions per run (the median is kept)")->capture_default_str();
  sub->add_option("--block_size", a->block_sizes, "Block sizes to try (replaces the sweep's list)");
  sub->add_option("--queue_depth", a->queue_depths, "Queue depths to try (replaces the sweep's list)");
  sub->add_option("--io_parallel", a->parallelism, "Worker counts to try (replaces the sweep's list)");
  sub->callback([a, &exit_code] { exit_code = run_tune(*a); });
  return sub;
}

}  // namespace cutrain::tools
