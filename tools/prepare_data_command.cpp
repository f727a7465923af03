// `cutrain prepare-data`: text files -> GPT-2 tokens -> llm.c .bin shards (train, and val when
// --val_fraction > 0), with a throughput report and a progress bar on a terminal.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "data/documents.h"
#include "data/encode_documents.h"
#include "data/gpt2_tokenizer.h"
#include "data/token_shard.h"
#include "runtime/error.h"
#include "tools/commands.h"

namespace cutrain::tools {
namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string vocab, merges, output;
  double val_fraction = 0.0;
  int64_t shard_size = 100'000'000;  // tokens per shard, as llm.c's fineweb.py
  int threads = 0;
  std::string split = "auto";
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CUTRAIN_CHECK(in.good(), "--input '", path, "': cannot open (missing or unreadable)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void progress_bar(const char* what, std::size_t done, std::size_t total) {
  const double f = total ? double(done) / double(total) : 1.0;
  const int width = 40, filled = static_cast<int>(f * width);
  std::fprintf(stderr, "\r%-5s [%s%s] %5.1f%% %8.1f MB", what, std::string(filled, '#').c_str(),
               std::string(width - filled, ' ').c_str(), 100.0 * f, double(done) / 1e6);
  if (done >= total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

// Writes PREFIX_<split>_NNNNNN.bin shards of at most shard_size tokens; returns the paths.
std::vector<std::string> write_shards(const std::string& prefix, const char* split, const std::vector<int32_t>& tokens,
                                      int64_t shard_size) {
  std::vector<std::string> paths;
  for (std::size_t begin = 0, index = 0; begin < tokens.size(); ++index) {
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(shard_size), tokens.size() - begin);
    char name[48];
    std::snprintf(name, sizeof(name), "_%s_%06zu.bin", split, index);
    paths.push_back(prefix + name);
    data::write_shard(paths.back(), tokens.data() + begin, n);
    begin += n;
  }
  return paths;
}

int run_prepare(const PrepareArgs& a) {
  CUTRAIN_CHECK(a.val_fraction >= 0.0 && a.val_fraction < 1.0, "--val_fraction: expected 0 <= F < 1, found ",
                a.val_fraction);
  CUTRAIN_CHECK(a.shard_size > 0 && a.shard_size <= INT32_MAX, "--shard_size: expected 1..", INT32_MAX,
                " tokens, found ", a.shard_size);
  const data::SplitMode mode = data::parse_split_mode(a.split);
  const auto tok = data::Gpt2Tokenizer::from_files(a.vocab, a.merges);
  CUTRAIN_CHECK(tok.vocab_size() <= 65536, "--vocab '", a.vocab, "': ", tok.vocab_size(),
                " tokens do not fit the shards' uint16");

  std::vector<std::string> texts;
  std::vector<std::string_view> docs;
  std::size_t bytes = 0;
  for (const auto& path : a.inputs) {
    texts.push_back(read_file(path));
  }
  for (const auto& text : texts) {
    for (auto d : data::split_documents(text, mode)) docs.push_back(d);
    bytes += text.size();
  }
  CUTRAIN_CHECK(!docs.empty(), "--input: the ", a.inputs.size(), " file(s) hold no document (all blank)");
  std::size_t n_val = static_cast<std::size_t>(std::llround(a.val_fraction * double(docs.size())));
  if (a.val_fraction > 0 && n_val == 0) n_val = 1;
  CUTRAIN_CHECK(n_val < docs.size(), "--val_fraction ", a.val_fraction, " leaves no training document out of ",
                docs.size());

  data::EncodeOptions opt;
  opt.threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // A progress bar only where someone watches, and only when there is time to watch it.
  const bool show_progress = ::isatty(STDERR_FILENO) == 1 && bytes >= (16u << 20);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> val, train;
  if (n_val > 0) {
    if (show_progress) opt.progress = [](std::size_t d, std::size_t t) { progress_bar("val", d, t); };
    val = data::encode_documents(tok, {docs.begin(), docs.begin() + static_cast<std::ptrdiff_t>(n_val)}, opt);
  }
  if (show_progress) opt.progress = [](std::size_t d, std::size_t t) { progress_bar("train", d, t); };
  train = data::encode_documents(tok, {docs.begin() + static_cast<std::ptrdiff_t>(n_val), docs.end()}, opt);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const std::filesystem::path parent = std::filesystem::path(a.output).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::vector<std::string> files = write_shards(a.output, "val", val, a.shard_size);
  for (auto& f : write_shards(a.output, "train", train, a.shard_size)) files.push_back(f);

  const double mbps = double(bytes) / 1e6 / std::max(secs, 1e-9);
  std::cout << "prepare-data: " << a.inputs.size() << " file(s), " << bytes << " bytes, " << docs.size()
            << " documents (" << n_val << " val), " << val.size() << " val + " << train.size()
            << " train tokens (vocab " << tok.vocab_size() << ")\n"
            << "prepare-data: encoded in " << secs << " s on " << opt.threads << " thread(s): " << mbps << " MB/s, "
            << mbps / opt.threads << " MB/s per thread\n";
  for (auto& f : files) std::cout << "wrote " << f << "\n";
  return 0;
}

}  // namespace

CLI::App* setup_prepare_data_command(CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<PrepareArgs>();
  CLI::App* sub = parent.add_subcommand("prepare-data", "Tokenize text files (GPT-2 BPE) into llm.c .bin token shards");
  sub->add_option("--input", args->inputs, "Text files (UTF-8); documents split on WikiText headings or blank lines")
      ->required()->check(CLI::ExistingFile);
  sub->add_option("--vocab", args->vocab, "encoder.json / vocab.json")->required();
  sub->add_option("--merges", args->merges, "vocab.bpe / merges.txt")->required();
  sub->add_option("--output", args->output, "Output prefix: writes PREFIX_train_000000.bin, PREFIX_val_000000.bin, ...")
      ->required();
  sub->add_option("--val_fraction", args->val_fraction, "Fraction of documents (the first ones) for the val split");
  sub->add_option("--shard_size", args->shard_size, "Tokens per shard");
  sub->add_option("--threads", args->threads, "Encoding threads (0: all cores)");
  sub->add_option("--split", args->split, "Documents: auto | headings | paragraphs | none");
  sub->callback([args, &exit_code] { exit_code = run_prepare(*args); });
  return sub;
}

}  // namespace cutrain::tools
