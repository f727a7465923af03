// `cutrain nvme-tune`: DeepSpeed's ds_nvme_tune equivalent. Sweeps the handle's knobs, prints the
// best read and write and a ready "aio" block with exactly the keys train/config reads.
#include <iomanip>
#include <iostream>
#include <sstream>

#include "runtime/error.h"
#include "tools/commands.h"
#include "tools/io_measure.h"

namespace cutrain::tools {
namespace {

struct TuneArgs {
  std::vector<std::string> folders;
  std::string io_size = "1G";
  std::vector<std::string> block_sizes = {"1M", "8M"};
  std::vector<int> queue_depths = {32, 128};
  std::vector<int> parallelism = {1, 2, 4, 8};
  int loops = 1;
  bool gpu = false;
};

struct Point {
  aio::HandleOptions h;
  double gbps = 0;
};

std::string describe(const aio::HandleOptions& h) {
  std::ostringstream os;
  os << "block_size=" << h.block_size << " queue_depth=" << h.queue_depth << " overlap_events=" << h.overlap_events
     << " single_submit=" << h.single_submit << " intra_op_parallelism=" << h.intra_op_parallelism;
  return os.str();
}

int run_tune(const TuneArgs& a) {
  CUTRAIN_CHECK(!a.folders.empty(), "give --folder");
  Point best[2];
  std::cout << std::fixed << std::setprecision(2);
  for (int read = 1; read >= 0; --read) {
    for (const auto& bs : a.block_sizes)
      for (int qd : a.queue_depths)
        for (bool overlap : {true, false})
          for (bool single : {true, false})
            for (int par : a.parallelism) {
              IoJob job;
              job.folders = a.folders;
              job.gpus.assign(a.folders.size(), a.gpu ? 0 : -1);
              job.io_size = parse_size(a.io_size);
              job.read = read;
              job.loops = a.loops;
              job.handle.block_size = parse_size(bs);
              job.handle.queue_depth = qd;
              job.handle.overlap_events = overlap;
              job.handle.single_submit = single;
              job.handle.intra_op_parallelism = par;
              IoResult r = run_io_job(job);
              std::cout << (read ? "read  " : "write ") << describe(job.handle) << " -> " << r.task_gbps
                        << " GB/s\n";
              if (r.task_gbps > best[read].gbps) best[read] = {job.handle, r.task_gbps};
            }
  }
  std::cout << "Best read:  " << best[1].gbps << " GB/s with " << describe(best[1].h) << "\n"
            << "Best write: " << best[0].gbps << " GB/s with " << describe(best[0].h) << "\n";
  // The reads usually matter more (optimizer swap-in is on the critical path): take their settings.
  const auto& h = best[1].h;
  std::cout << "\"aio\": {\n"
            << "  \"block_size\": " << h.block_size << ",\n"
            << "  \"queue_depth\": " << h.queue_depth << ",\n"
            << "  \"intra_op_parallelism\": " << h.intra_op_parallelism << ",\n"
            << "  \"single_submit\": " << (h.single_submit ? "true" : "false") << ",\n"
            << "  \"overlap_events\": " << (h.overlap_events ? "true" : "false") << ",\n"
            << "  \"use_gds\": false\n"
            << "}\n";
  return 0;
}

}  // namespace

CLI::App* setup_nvme_tune_command(CLI::App& parent, int& exit_code) {
  auto* a = new TuneArgs;
  CLI::App* sub = parent.add_subcommand("nvme-tune", "Sweep the async I/O knobs and print the best \"aio\" config");
  sub->add_option("--folder", a->folders, "Folder(s) on the device(s) to tune")->required();
  sub->add_option("--io_size", a->io_size, "Bytes per file per run")->capture_default_str();
  sub->add_option("--block_size", a->block_sizes, "Block sizes to try")->capture_default_str();
  sub->add_option("--queue_depth", a->queue_depths, "Queue depths to try")->capture_default_str();
  sub->add_option("--io_parallel", a->parallelism, "Worker counts to try")->capture_default_str();
  sub->add_option("--loops", a->loops, "Repetitions per point")->capture_default_str();
  sub->add_flag("--gpu", a->gpu, "GPU buffers");
  sub->callback([a, &exit_code] { exit_code = run_tune(*a); });
  return sub;
}

}  // namespace cutrain::tools
