#include "tools/io_measure.h"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "runtime/aio/gds_handle.h"
#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/file_util.h"
#include "runtime/json_util.h"

namespace cutrain::tools {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Pinned memory where a GPU exists (what the handle's users pass); plain 4096-aligned memory on a
// machine without one, so the I/O path still runs there.
void* host_buffer(std::size_t n) {
  if (gpu_available()) return pinned_allocator().allocate(n);
  void* p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  CUTRAIN_CHECK(p, "cannot allocate ", n, " bytes of host memory");
  return p;
}
void free_host_buffer(void* p) {
  if (gpu_available())
    pinned_allocator().deallocate(p);
  else
    std::free(p);
}

// A buffer for one folder's file: pinned host memory or device memory; filled with random bytes.
struct JobBuffer {
  void* p = nullptr;
  int gpu = -1;
  std::size_t bytes = 0;
  JobBuffer(std::size_t n, int g) : gpu(g), bytes(n) {
    if (gpu >= 0) {
      CUTRAIN_CUDA_CHECK(cudaSetDevice(gpu));
      CUTRAIN_CUDA_CHECK(cudaMalloc(&p, n));
      CUTRAIN_CUDA_CHECK(cudaMemset(p, 0xA5, n));
    } else {
      p = host_buffer(n);
      auto* c = static_cast<unsigned char*>(p);
      std::mt19937 rng(12345);
      for (std::size_t i = 0; i < n; i += 4096) c[i] = static_cast<unsigned char>(rng());
    }
  }
  ~JobBuffer() {
    if (gpu >= 0)
      cudaFree(p);
    else
      free_host_buffer(p);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
}  // namespace

std::string file_for(const std::string& folder, std::size_t index) {
  return (std::filesystem::path(folder) / ("cutrain_io_" + std::to_string(index) + ".bin")).string();
}

std::size_t parse_size(const std::string& s) {
  CUTRAIN_CHECK(!s.empty(), "empty size");
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  double mult = 1;
  if (unit == "K" || unit == "k" || unit == "KB" || unit == "KiB") mult = 1024.0;
  else if (unit == "M" || unit == "m" || unit == "MB" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "g" || unit == "GB" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else CUTRAIN_CHECK(unit.empty(), "size '", s, "': expected a number with an optional K, M or G suffix");
  CUTRAIN_CHECK(v > 0 && std::isfinite(v), "size '", s, "' must be positive");
  return static_cast<std::size_t>(v * mult);
}

std::size_t parse_size_flag(const std::string& flag, const std::string& s) {
  try {
    return parse_size(s);
  } catch (const Error&) {
    CUTRAIN_FAIL(flag, ": expected a size in bytes with an optional K, M or G suffix (powers of 1024), such as 1M, ",
                 "found '", s, "'");
  }
}

std::string size_string(std::size_t bytes) {
  const char* units[] = {"G", "M", "K"};
  const std::size_t mult[] = {1u << 30, 1u << 20, 1u << 10};
  for (int i = 0; i < 3; ++i)
    if (bytes >= mult[i] && bytes % mult[i] == 0) return std::to_string(bytes / mult[i]) + units[i];
  return std::to_string(bytes);
}

SweepConfig parse_sweep_config(const std::string& text, const std::string& origin) {
  const nlohmann::json j = parse_json_strict(text, origin);
  CUTRAIN_CHECK(j.is_object(), origin, ": expected a JSON object of lists (ds_nvme_tune's sweep config), found ",
                describe_json(j));
  CUTRAIN_CHECK(!(j.contains("overlap_events") && j.contains("sequential_requests")), origin,
                ": expected one of overlap_events and sequential_requests (each is the other's inverse), found both");
  SweepConfig c;
  auto list_of = [&](const std::string& key, const nlohmann::json& v, const char* what) {
    CUTRAIN_CHECK(v.is_array() && !v.empty(), origin, ": ", key, ": expected a non-empty list of ", what, ", found ",
                  describe_json(v));
  };
  auto ints = [&](const std::string& key, const nlohmann::json& v) {
    list_of(key, v, "integers >= 1");
    std::vector<int> out;
    for (const auto& x : v) {
      CUTRAIN_CHECK(x.is_number_integer() && x.get<long long>() >= 1 && x.get<long long>() <= (1 << 20), origin, ": ",
                    key, ": expected integers >= 1, found ", describe_json(x));
      out.push_back(x.get<int>());
    }
    return out;
  };
  auto bools = [&](const std::string& key, const nlohmann::json& v, bool invert) {
    list_of(key, v, "booleans");
    std::vector<bool> out;
    for (const auto& x : v) {
      CUTRAIN_CHECK(x.is_boolean(), origin, ": ", key, ": expected true or false, found ", describe_json(x));
      out.push_back(x.get<bool>() != invert);
    }
    return out;
  };
  for (const auto& [key, v] : j.items()) {
    if (key == "block_size") {
      list_of(key, v, "sizes (\"1M\", \"128K\" or byte counts)");
      c.block_size.clear();
      for (const auto& x : v) {
        std::size_t b = 0;
        if (x.is_number_integer() && x.get<long long>() >= 1) {
          b = x.get<std::size_t>();
        } else if (x.is_string()) {
          try {
            b = parse_size(x.get<std::string>());
          } catch (const Error&) {
          }
        }
        CUTRAIN_CHECK(b >= 1, origin, ": block_size: expected a size such as \"1M\" or 1048576, found ",
                      describe_json(x));
        c.block_size.push_back(b);
      }
    } else if (key == "queue_depth") {
      c.queue_depth = ints(key, v);
    } else if (key == "io_parallel") {
      c.io_parallel = ints(key, v);
    } else if (key == "single_submit") {
      c.single_submit = bools(key, v, false);
    } else if (key == "overlap_events") {
      c.overlap_events = bools(key, v, false);
    } else if (key == "sequential_requests") {
      c.overlap_events = bools(key, v, true);
    } else {
      CUTRAIN_FAIL(origin, ": expected keys block_size, queue_depth, io_parallel, single_submit, overlap_events or ",
                   "sequential_requests, found '", key, "'");
    }
  }
  return c;
}

SweepConfig read_sweep_config(const std::string& path) {
  CUTRAIN_CHECK(std::filesystem::is_regular_file(path), "--sweep_config ", path,
                ": expected a JSON file of lists, found no such file");
  return parse_sweep_config(read_text_file(path), path);
}

std::string aio_config_json(const aio::HandleOptions& h, bool use_gds) {
  nlohmann::ordered_json aio;
  aio["block_size"] = h.block_size;
  aio["queue_depth"] = h.queue_depth;
  aio["intra_op_parallelism"] = h.intra_op_parallelism;
  aio["single_submit"] = h.single_submit;
  aio["overlap_events"] = h.overlap_events;
  aio["use_gds"] = use_gds;
  nlohmann::ordered_json block;
  block["aio"] = aio;
  return block.dump(2);
}

std::string run_log_name(bool read, const aio::HandleOptions& h) {
  return std::string(read ? "read" : "write") + (h.single_submit ? "_single" : "_block") +
         (h.overlap_events ? "_overlap" : "_sequential") + "_p" + std::to_string(h.intra_op_parallelism) + "_d" +
         std::to_string(h.queue_depth) + "_bs" + size_string(h.block_size) + ".txt";
}

void prepare_files(const IoJob& job) {
  for (std::size_t i = 0; i < job.folders.size(); ++i) {
    CUTRAIN_CHECK(std::filesystem::is_directory(job.folders[i]), "folder '", job.folders[i],
                  "' does not exist or is not a directory");
    const std::string f = file_for(job.folders[i], i);
    std::error_code ec;
    if (std::filesystem::file_size(f, ec) >= job.io_size && !ec) continue;
    JobBuffer b(job.io_size, -1);
    aio::AioHandle h(job.handle);
    h.sync_pwrite(b.p, job.io_size, f);
  }
}

IoResult run_io_job(const IoJob& job) {
  CUTRAIN_CHECK(!job.folders.empty(), "no folder given");
  CUTRAIN_CHECK(job.loops >= 1, "loops must be >= 1, got ", job.loops);
  if (job.read) prepare_files(job);
  const std::size_t nf = job.folders.size();
  std::vector<double> task_s, e2e_s;
  std::string backend;
  for (int loop = 0; loop < job.loops; ++loop) {
    if (job.read)
      for (std::size_t i = 0; i < nf; ++i) drop_page_cache(file_for(job.folders[i], i));
    std::vector<double> task(nf), e2e(nf);
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(nf);
    std::vector<std::string> names(nf);
    for (std::size_t i = 0; i < nf; ++i) {
      threads.emplace_back([&, i] {
        try {
          const int gpu = i < job.gpus.size() ? job.gpus[i] : -1;
          auto t0 = Clock::now();
          JobBuffer buf(job.io_size, gpu);
          const std::string f = file_for(job.folders[i], i);
          std::chrono::steady_clock::time_point t1;
          if (job.use_gds) {
            CUTRAIN_CHECK(gpu >= 0, "--use_gds needs GPU buffers (--gpu or --folder_to_device_mapping)");
            aio::GdsHandle g(job.handle.block_size, job.handle.intra_op_parallelism);
            names[i] = "gds (" + g.mode() + ")";
            t1 = Clock::now();
            if (job.read)
              g.sync_pread(buf.p, job.io_size, f);
            else
              g.sync_pwrite(buf.p, job.io_size, f);
          } else {
            aio::AioHandle h(job.handle);
            names[i] = aio::backend_name(h.backend());
            t1 = Clock::now();
            if (job.read)
              h.pread(buf.p, job.io_size, f, job.validate, false);
            else
              h.pwrite(buf.p, job.io_size, f, job.validate, false);
          }
          task[i] = seconds_since(t1);
          if (!job.read) {
            int fd = ::open(f.c_str(), O_RDONLY);
            if (fd >= 0) {
              ::fdatasync(fd);
              ::close(fd);
            }
          }
          e2e[i] = seconds_since(t0);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    task_s.push_back(*std::max_element(task.begin(), task.end()));
    e2e_s.push_back(*std::max_element(e2e.begin(), e2e.end()));
    backend = names[0];
  }
  const double total = static_cast<double>(job.io_size) * nf;
  return {total / median(task_s), total / median(e2e_s), backend};
}

double buffered_baseline_bytes_per_s(const IoJob& job) {
  if (job.read) prepare_files(job);
  std::vector<char> buf(job.io_size, 'b');
  std::vector<double> s;
  for (int loop = 0; loop < job.loops; ++loop) {
    const std::string f = file_for(job.folders[0], 0) + (job.read ? "" : ".buffered");
    if (job.read) drop_page_cache(f);
    auto t0 = Clock::now();
    if (job.read) {
      aio::buffered_read(buf.data(), job.io_size, f);
    } else {
      aio::buffered_write(buf.data(), job.io_size, f, 0, /*fsync=*/true);
    }
    s.push_back(seconds_since(t0));
    if (!job.read) std::filesystem::remove(f);
  }
  return job.io_size / median(s);
}

double odirect_threads_baseline_bytes_per_s(const IoJob& job, int* best_threads) {
  if (job.read) prepare_files(job);
  const std::size_t block = 8u << 20;
  const std::size_t n = job.io_size / 4096 * 4096;
  void* buf = host_buffer(n);
  std::memset(buf, 0x3C, n);
  double best = 0;
  for (int threads : {1, 2, 4, 8}) {
    std::vector<double> s;
    for (int loop = 0; loop < job.loops; ++loop) {
      const std::string f = file_for(job.folders[0], 0) + (job.read ? "" : ".odirect");
      if (job.read) drop_page_cache(f);
      int fd = ::open(f.c_str(), (job.read ? O_RDONLY : (O_WRONLY | O_CREAT)) | O_DIRECT, 0644);
      CUTRAIN_CHECK(fd >= 0, "O_DIRECT open of '", f, "' failed: ", std::strerror(errno));
      auto t0 = Clock::now();
      std::vector<std::thread> pool;
      std::atomic<bool> failed{false};
      const std::size_t per = (n / threads + block - 1) / block * block;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          for (std::size_t at = t * per; at < std::min(n, (t + 1) * per); at += block) {
            std::size_t len = std::min(block, n - at);
            ssize_t r = job.read ? ::pread(fd, static_cast<char*>(buf) + at, len, at)
                                 : ::pwrite(fd, static_cast<char*>(buf) + at, len, at);
            if (r != static_cast<ssize_t>(len)) failed = true;
          }
        });
      }
      for (auto& p : pool) p.join();
      if (!job.read) ::fdatasync(fd);
      s.push_back(seconds_since(t0));
      ::close(fd);
      if (!job.read) std::filesystem::remove(f);
      CUTRAIN_CHECK(!failed, "O_DIRECT baseline: a pread/pwrite on '", f, "' failed or was short");
    }
    double g = n / median(s);
    if (g > best) {
      best = g;
      if (best_threads) *best_threads = threads;
    }
  }
  free_host_buffer(buf);
  return best;
}

}  // namespace cutrain::tools
