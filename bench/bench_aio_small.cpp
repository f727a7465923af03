// Small synchronous requests of the aio handle: run inline on the calling thread against handed
// to the workers (HandleOptions::inline_bytes 0) with intra_op_parallelism 1 and 4 (a request
// split into slices on 4 threads), per request size, reads and writes of a 4096-aligned
// buffer at offset 0 (the O_DIRECT body where the file system takes it). What sets the default
// inline threshold (docs/nvme.md). CPU only. The folder: CUTRAIN_BENCH_FOLDER (default /tmp).
//   bench_aio_small [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "runtime/aio/aio_handle.h"

namespace {

using namespace cutrain::aio;

std::string bench_file() {
  const char* env = std::getenv("CUTRAIN_BENCH_FOLDER");
  std::filesystem::path dir = env ? env : "/tmp";
  std::filesystem::create_directories(dir);
  return (dir / "cutrain_bench_aio_small.bin").string();
}

// Args: request bytes, workers (0: inline on the caller, else intra_op_parallelism), read (1) or
// write (0).
void BM_SyncRequest(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const bool run_inline = state.range(1) == 0, read = state.range(2) != 0;
  HandleOptions o;
  o.inline_bytes = run_inline ? bytes : 0;
  o.intra_op_parallelism = run_inline ? 1 : static_cast<int>(state.range(1));
  AioHandle h(o);
  std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(std::aligned_alloc(4096, bytes)), &std::free);
  std::memset(buf.get(), 7, bytes);
  const std::string path = bench_file();
  h.sync_pwrite(buf.get(), bytes, path);
  for (auto _ : state) {
    if (read)
      h.sync_pread(buf.get(), bytes, path);
    else
      h.sync_pwrite(buf.get(), bytes, path);
  }
  const RequestCounts c = h.request_counts();
  if (run_inline != (c.inline_requests > 0 && c.queued_requests == 0)) state.SkipWithError("the request took the other path");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetLabel(std::string(read ? "read " : "write ") +
                 (run_inline ? std::string("inline") : "workers " + std::to_string(o.intra_op_parallelism)) + " " +
                 backend_name(h.backend()));
  std::filesystem::remove(path);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t read : {1, 0})
    for (std::int64_t bytes : {4096, 16384, 65536, 262144, 1048576})
      for (std::int64_t workers : {0, 1, 4}) b->Args({bytes, workers, read});
}

}  // namespace

BENCHMARK(BM_SyncRequest)->Apply(sizes)->ArgNames({"bytes", "workers", "read"})->MinTime(0.2)->Repetitions(3)
    ->ReportAggregatesOnly(true)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
