// CPU benchmarks of the data path: GPT-2 encoding of WikiText-2 valid, on one thread (cold and
// warm word cache) and over documents on all cores, and the batch sampler. No GPU involved: these
// run on any machine. Target: >= 5 MB/s of text per core.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "data/documents.h"
#include "data/encode_documents.h"
#include "data/gpt2_tokenizer.h"

namespace {

using namespace cutrain::data;

std::string data_dir() {
  if (const char* env = std::getenv("CUTRAIN_DATA_DIR")) return env;
  return std::string(CUTRAIN_SOURCE_DIR) + "/../shared/data";
}

struct Inputs {
  bool ok = false;
  std::string why, text;
  Gpt2Tokenizer tok;
};

const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs i;
    const std::string d = data_dir();
    if (!std::filesystem::exists(d + "/gpt2/encoder.json") || !std::filesystem::exists(d + "/wikitext-2/valid.txt")) {
      i.why = "GPT-2 files / WikiText-2 not found under " + d + " (set CUTRAIN_DATA_DIR)";
      return i;
    }
    i.tok = Gpt2Tokenizer::from_files(d + "/gpt2/encoder.json", d + "/gpt2/vocab.bpe");
    std::ifstream f(d + "/wikitext-2/valid.txt", std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    i.text = ss.str();
    i.ok = true;
    return i;
  }();
  return in;
}

// cold: a new word cache per iteration (what one pass over a fresh file costs).
void encode_one_thread(benchmark::State& state, bool cold) {
  const Inputs& in = inputs();
  if (!in.ok) return state.SkipWithError(in.why.c_str());
  WordCache warm;
  std::vector<int32_t> ids;
  for (auto _ : state) {
    ids.clear();
    WordCache fresh;
    in.tok.encode(in.text, ids, cold ? &fresh : &warm);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(in.text.size()));
  state.counters["tokens"] = double(ids.size());
}

void BM_EncodeCold(benchmark::State& s) { encode_one_thread(s, true); }
void BM_EncodeWarm(benchmark::State& s) { encode_one_thread(s, false); }

void BM_EncodeDocumentsAllCores(benchmark::State& state) {
  const Inputs& in = inputs();
  if (!in.ok) return state.SkipWithError(in.why.c_str());
  // Four copies so every core gets chunks of documents.
  static const std::string text = in.text + in.text + in.text + in.text;
  const auto docs = split_documents(text, SplitMode::kAuto);
  EncodeOptions opt;
  opt.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (auto _ : state) benchmark::DoNotOptimize(encode_documents(in.tok, docs, opt).data());
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["threads"] = opt.threads;
  state.counters["bytes_per_second_per_thread"] =
      benchmark::Counter(double(text.size()) / opt.threads, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_EncodeCold)->Name("tokenizer/encode_cold/wikitext2_valid")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EncodeWarm)->Name("tokenizer/encode_warm/wikitext2_valid")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EncodeDocumentsAllCores)
    ->Name("tokenizer/encode_documents/wikitext2_valid_x4")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_MAIN();
