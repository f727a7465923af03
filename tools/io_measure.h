// @brief Shared measurement of the I/O tools (io-bench, nvme-tune): one timed read or write of a
// file per folder through an AioHandle, and the two baselines of the same run.
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
  double task_gbps = 0;  // bytes / median time of the I/O call (the data in the buffer)
  double e2e_gbps = 0;   // the same including buffer allocation and, for writes, fdatasync
  std::string backend;
};

// Creates the files for a read job (written with the same handle settings) when missing or short.
void prepare_files(const IoJob& job);
IoResult run_io_job(const IoJob& job);

// Baselines on the same files: plain buffered read()/write() of one thread with the page cache
// dropped (posix_fadvise) before reads, and a simple multi-threaded O_DIRECT pread/pwrite loop
// (8 MiB blocks) whose best rate over 1, 2, 4, 8 threads is returned.
double buffered_baseline_gbps(const IoJob& job);
double odirect_threads_baseline_gbps(const IoJob& job, int* best_threads = nullptr);

std::string file_for(const std::string& folder, std::size_t index);
std::size_t parse_size(const std::string& s);  // "400M", "1G", "4096", "1.5G"

}  // namespace cutrain::tools
