// `cutrain analyze-data`: the offline analyzer of curriculum learning. Token shards -> a difficulty
// metric per sample (the windows `cutrain train --use_real_data` draws) -> the index file
// (data/sample_index.h), on all cores, with a progress bar on a terminal.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "data/data_analyzer.h"
#include "runtime/error.h"
#include "tools/commands.h"

namespace cutrain::tools {
namespace {

struct AnalyzeArgs {
  data::AnalyzeOptions options;
  std::string labels = "next_token";
  std::string output;
};

void progress_line(std::size_t done, std::size_t total) {
  const double f = total ? double(done) / double(total) : 1.0;
  const int width = 40, filled = static_cast<int>(f * width);
  std::fprintf(stderr, "\ranalyze [%s%s] %5.1f%% %zu/%zu samples", std::string(filled, '#').c_str(),
               std::string(width - filled, ' ').c_str(), 100.0 * f, done, total);
  if (done >= total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

int run_analyze(AnalyzeArgs& a) {
  data::AnalyzeOptions& o = a.options;
  data::find_analyzer_metric(o.metric);  // a bad name before any work
  if (a.labels == "next_token") o.labels = data::Labels::kNextToken;
  else if (a.labels == "identity") o.labels = data::Labels::kIdentity;
  else throw Error(detail::concat("--labels: expected one of \"next_token\", \"identity\", found \"", a.labels, "\""), __FILE__, __LINE__);
  const std::filesystem::path parent = std::filesystem::absolute(a.output).parent_path();
  CUTRAIN_CHECK(std::filesystem::is_directory(parent), "--output '", a.output, "': expected a file in an existing folder, found ",
                "that '", parent.string(), "' is not a folder");
  CUTRAIN_CHECK(!std::filesystem::is_directory(a.output), "--output '", a.output, "': expected a file name, found a folder");
  if (::isatty(STDERR_FILENO) == 1) o.progress = progress_line;
  if (o.threads <= 0) o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  const auto t0 = std::chrono::steady_clock::now();
  const data::SampleIndex idx = data::analyze_shards(o);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  data::write_sample_index(a.output, idx);
  std::cout << "analyze-data: " << idx.metric << " over " << idx.values.size() << " samples of " << idx.seq_len
            << " tokens in " << idx.shards.size() << " shard(s), " << o.threads << " thread(s), " << secs << " s\n"
            << "analyze-data: min " << idx.percentiles[0] << ", p25 " << idx.percentiles[25] << ", median "
            << idx.percentiles[50] << ", p75 " << idx.percentiles[75] << ", max " << idx.percentiles[100] << "\n"
            << "wrote " << a.output << "\n";
  return 0;
}

}  // namespace

CLI::App* setup_analyze_data_command(CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<AnalyzeArgs>();
  CLI::App* sub = parent.add_subcommand(
      "analyze-data", "Curriculum learning's offline analyzer: a difficulty metric per sample of token shards, indexed");
  sub->add_option("--data", args->options.patterns, "Token shard globs (as cutrain train --data)")->required();
  sub->add_option("--output", args->output, "The index file (JSON, written atomically)")->required();
  sub->add_option("--metric", args->options.metric, "vocabularyrarity (mean -log p(token)) | seqlen");
  sub->add_option("--seq_length", args->options.seq_len, "Tokens per sample (as cutrain train --seq_length)");
  sub->add_option("--labels", args->labels, "next_token | identity: the windows' length, as cutrain train --labels");
  sub->add_option("--vocab_size", args->options.vocab_size, "Every token must be below it");
  sub->add_option("--threads", args->options.threads, "Worker threads (0: all cores)");
  sub->callback([args, &exit_code] { exit_code = run_analyze(*args); });
  return sub;
}

}  // namespace cutrain::tools
