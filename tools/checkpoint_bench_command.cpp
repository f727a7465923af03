// `cutrain checkpoint-bench`: the checkpoint files of a model's training state (254M parameters at
// the defaults, baseline layout: bf16 model file, fp32 master + moments in the optimizer file)
// written and read through each checkpoint I/O path (train/checkpoint_io.h: plain buffered I/O
// and the aio handle), GB/s for each, every read checked against what was written. The page cache
// of the files is dropped (posix_fadvise DONTNEED after the fsync) before each read.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "runtime/aio/aio_handle.h"
#include "runtime/error.h"
#include "runtime/file_util.h"
#include "tools/commands.h"
#include "train/checkpoint.h"
#include "train/checkpoint_io.h"

namespace cutrain::tools {
namespace {

struct CheckpointBenchArgs {
  std::string dir = "/tmp/cutrain_checkpoint_bench";
  int hidden = 1024, layers = 12, heads = 16, vocab = 50000, max_seq = 512;
  int reps = 1;
  std::vector<std::string> paths{"plain", "aio"};
  bool keep = false;
};

void drop_cache(const std::filesystem::path& p) {
  CUTRAIN_CHECK(drop_page_cache(p), "checkpoint-bench: cannot open ", p.string(), " to drop its page cache");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Reads every tensor of `path` through `files` into `dst` (the data section's size) at its offset.
void load_file(train::CheckpointFiles& files, const std::filesystem::path& path, std::vector<std::byte>& dst) {
  SafetensorsReader r(path);
  std::vector<train::TensorRead> reads;
  std::uint64_t total = 0;
  for (const auto& t : r.tensors()) {
    reads.push_back({t.name, dst.data() + t.begin, t.bytes()});
    total = std::max(total, t.end);
  }
  CUTRAIN_CHECK(total <= dst.size(), "checkpoint-bench: ", path.string(), " holds ", total, " data bytes, expected ",
                dst.size());
  files.read(r, reads);
}

// Every entry's bytes where the file's header puts them.
void verify(const std::filesystem::path& path, const std::vector<SafetensorsEntry>& entries,
            const std::vector<std::byte>& got) {
  SafetensorsReader r(path);
  for (const auto& e : entries) {
    const SafetensorsTensorInfo& t = r.tensor(e.name);
    CUTRAIN_CHECK(std::memcmp(got.data() + t.begin, e.data, t.bytes()) == 0, "checkpoint-bench: tensor '", e.name,
                  "' read back from ", path.string(), " differs from what was written");
  }
}

int run_checkpoint_bench(const CheckpointBenchArgs& a) {
  const model::TransformerParams T(model::ModelDims{a.hidden, a.layers, a.heads, a.vocab, a.max_seq});
  const std::size_t n = T.flat_size();
  train::HostState s;
  s.params.resize(n);
  s.master.resize(n);
  s.exp_avg.resize(n);
  s.exp_avg_sq.resize(n);
  for (std::size_t i = 0; i < n; ++i) {  // distinct, cheap, not compressible to a pattern the disk could dedupe
    const float x = float((i * 2654435761u) % 1000003u) * 1e-6f;
    s.params[i] = x - 0.5f;
    s.master[i] = x - 0.25f;
    s.exp_avg[i] = x * 1e-3f;
    s.exp_avg_sq[i] = x * x * 1e-6f;
  }
  train::StateSnapshot snap;
  train::snapshot_from_host_state(s, snap);
  train::CheckpointTensors ct;
  train::checkpoint_tensors(T, snap, ct);
  const SafetensorsMetadata md{{"format", "pt"}, {"producer", "cutrain"}};
  std::error_code ec;
  std::filesystem::create_directories(a.dir, ec);
  CUTRAIN_CHECK(!ec, "checkpoint-bench: cannot create ", a.dir, ": ", ec.message());
  const std::filesystem::path dir(a.dir);
  {
    aio::AioHandle probe;
    std::cout << "checkpoint-bench: " << T.num_params() << " params (baseline layout: bf16 model file, fp32 master + "
              << "exp_avg + exp_avg_sq), folder " << a.dir << ", aio backend " << aio::backend_name(probe.backend())
              << (probe.fallback_reason().empty() ? "" : " (" + probe.fallback_reason() + ")") << ", " << a.reps
              << " rep(s), best time reported\n";
  }
  std::uint64_t model_bytes = 0, optim_bytes = 0;
  std::vector<std::byte> model_dst, optim_dst;
  for (const auto& name : a.paths) {
    train::CheckpointFiles files(train::parse_checkpoint_io(name));
    const auto mp = dir / ("model." + name + ".safetensors"), op = dir / ("optimizer." + name + ".safetensors");
    double best_save = 1e30, best_load = 1e30;
    for (int rep = 0; rep < a.reps; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      files.write_safetensors(mp, ct.model, md);
      files.write_safetensors(op, ct.optim, md);
      best_save = std::min(best_save, seconds_since(t0));
      if (model_dst.empty()) {
        model_bytes = std::filesystem::file_size(mp);
        optim_bytes = std::filesystem::file_size(op);
        model_dst.resize(model_bytes);  // at least the data sections; touched once here, outside the timing
        optim_dst.resize(optim_bytes);
      }
      drop_cache(mp);
      drop_cache(op);
      t0 = std::chrono::steady_clock::now();
      load_file(files, mp, model_dst);
      load_file(files, op, optim_dst);
      best_load = std::min(best_load, seconds_since(t0));
      verify(mp, ct.model, model_dst);
      verify(op, ct.optim, optim_dst);
    }
    const double gb = double(model_bytes + optim_bytes) / 1e9;
    std::cout << std::fixed << std::setprecision(2) << std::left << std::setw(6) << name << " save " << gb << " GB in "
              << std::setprecision(3) << best_save << " s = " << std::setprecision(2) << gb / best_save << " GB/s"
              << " | load " << std::setprecision(3) << best_load << " s = " << std::setprecision(2) << gb / best_load
              << " GB/s (read back identical)\n";
    if (!a.keep) {
      std::filesystem::remove(mp, ec);
      std::filesystem::remove(op, ec);
    }
  }
  return 0;
}

}  // namespace

CLI::App* setup_checkpoint_bench_command(CLI::App& parent, int& exit_code) {
  auto* a = new CheckpointBenchArgs;  // lives for the process, like the CLI app
  CLI::App* sub = parent.add_subcommand("checkpoint-bench", "Checkpoint file save/load GB/s: plain I/O vs the aio handle");
  sub->add_option("--dir", a->dir, "Folder for the checkpoint files (put it on the drive to measure)")->capture_default_str();
  sub->add_option("--hidden_dim", a->hidden, "Model width")->capture_default_str();
  sub->add_option("--num_layers", a->layers, "Transformer layers")->capture_default_str();
  sub->add_option("--num_heads", a->heads, "Attention heads")->capture_default_str();
  sub->add_option("--vocab_size", a->vocab, "Vocabulary")->capture_default_str();
  sub->add_option("--seq_length", a->max_seq, "Positions (rows of the position embedding)")->capture_default_str();
  sub->add_option("--reps", a->reps, "Save+load repetitions per path (the best is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  sub->add_option("--io", a->paths, "Paths to measure, in order (plain, aio)")->capture_default_str();
  sub->add_flag("--keep", a->keep, "Keep the files");
  sub->callback([a, &exit_code] { exit_code = run_checkpoint_bench(*a); });
  return sub;
}

}  // namespace cutrain::tools
