// @brief Shared measurement of the I/O tools (io-bench, nvme-tune, file-access): one timed read or
// write of a file per folder through an AioHandle, the two baselines of the same run, the unit
// their figures are printed in, nvme-tune's sweep and the "aio" block it prints.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/aio/aio_handle.h"

namespace cutrain::tools {

struct IoJob {
  std::vector<std::string> folders;  // one file per folder, all driven at once
  std::vector<int> gpus;             // per folder: GPU index, or -1 for pinned host memory
  std::size_t io_size = 1u << 30;    // bytes per file
  bool read = true;
  int loops = 3;
  bool validate = false;
  bool use_gds = false;  // GPUDirect Storage through cuFile (device buffers only)
  aio::HandleOptions handle;
};

struct IoResult {
  double task_bytes_per_s = 0;  // bytes / median time of the I/O call (the data in the buffer)
  double e2e_bytes_per_s = 0;   // the same including buffer allocation and, for writes, fdatasync
  std::string backend;
};

// The tools' "GB/sec" is DeepSpeed's (ds_io, ds_nvme_tune, deepnvme/file_access): 1024^3 bytes
// per second.
constexpr double kBytesPerGB = 1024.0 * 1024.0 * 1024.0;
inline double gb_per_s(double bytes_per_s) { return bytes_per_s / kBytesPerGB; }

// Creates the files for a read job (written with the same handle settings) when missing or short.
void prepare_files(const IoJob& job);
IoResult run_io_job(const IoJob& job);

// Baselines on the same files: plain buffered read()/write() of one thread with the page cache
// dropped (posix_fadvise) before reads, and a simple multi-threaded O_DIRECT pread/pwrite loop
// (8 MiB blocks) whose best rate over 1, 2, 4, 8 threads is returned.
// Both in bytes per second.
double buffered_baseline_bytes_per_s(const IoJob& job);
double odirect_threads_baseline_bytes_per_s(const IoJob& job, int* best_threads = nullptr);

std::string file_for(const std::string& folder, std::size_t index);
std::size_t parse_size(const std::string& s);  // "400M", "1G", "4096", "1.5G" (K, M, G: powers of 1024)
std::string size_string(std::size_t bytes);
// parse_size for a flag's value: the error names the flag ("--io_size: expected ..., found '1X'").
std::size_t parse_size_flag(const std::string& flag, const std::string& s);    // 1048576 -> "1M", 131072 -> "128K", 1000 -> "1000"

// nvme-tune's search space: every combination is one run.
struct SweepConfig {
  std::vector<std::size_t> block_size = {1u << 20, 8u << 20};
  std::vector<int> queue_depth = {32, 128};
  std::vector<int> io_parallel = {1, 2, 4, 8};
  std::vector<bool> single_submit = {true, false};
  std::vector<bool> overlap_events = {true, false};
};
// A JSON object of lists, ds_nvme_tune's --sweep_config: "block_size" (sizes as "1M" strings or
// byte counts), "queue_depth", "io_parallel" (integers >= 1), "single_submit", "overlap_events"
// (booleans) or its inverse "sequential_requests" (ds_io's name; not both). A key left out keeps
// the default list. Unknown keys, scalars, empty lists and values of the wrong type are errors
// naming `origin` (the file), the key, what was expected and what was found.
SweepConfig parse_sweep_config(const std::string& text, const std::string& origin);
SweepConfig read_sweep_config(const std::string& path);

// The complete block DeepSpeed's config takes: {"aio": {"block_size": ..., "queue_depth": ...,
// "intra_op_parallelism": ..., "single_submit": ..., "overlap_events": ..., "use_gds": ...}}.
std::string aio_config_json(const aio::HandleOptions& h, bool use_gds);
// The per-run log's file name: read_single_overlap_p8_d32_bs1M.txt (op, single_submit as
// single|block, overlap_events as overlap|sequential, io_parallel, queue_depth, block size).
std::string run_log_name(bool read, const aio::HandleOptions& h);

}  // namespace cutrain::tools
