#include "data/data_analyzer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>

#include "runtime/error.h"

namespace cutrain::data {
namespace {

double seqlen_metric(const uint16_t*, int64_t n, const MetricContext&) { return static_cast<double>(n); }

double rarity_metric(const uint16_t* tokens, int64_t n, const MetricContext& ctx) {
  double sum = 0;  // in token order, so the value does not depend on the thread count
  for (int64_t t = 0; t < n; ++t) sum += ctx.neg_log_p[tokens[t]];
  return sum / static_cast<double>(n);
}

// Runs fn(begin, end) over [0, n) cut into `threads` contiguous ranges, reporting progress
// (an atomic count the workers bump) from this thread; rethrows a worker's error.
template <class Fn>
void parallel_ranges(std::size_t n, int threads, const std::function<void(std::size_t, std::size_t)>& progress,
                     std::atomic<std::size_t>& done, Fn fn) {
  const std::size_t k = std::max<std::size_t>(1, std::min<std::size_t>(static_cast<std::size_t>(threads), n));
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(k);
  std::atomic<std::size_t> finished{0};
  for (std::size_t w = 0; w < k; ++w)
    pool.emplace_back([&, w] {
      try {
        fn(n * w / k, n * (w + 1) / k);
      } catch (...) {
        errors[w] = std::current_exception();
      }
      finished.fetch_add(1);
    });
  while (progress && finished.load() < k) {
    progress(done.load(), n);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : pool) t.join();
  if (progress) progress(n, n);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

const std::vector<AnalyzerMetric>& analyzer_metrics() {
  static const std::vector<AnalyzerMetric> kMetrics = {
      {"seqlen", false, seqlen_metric},
      {"vocabularyrarity", true, rarity_metric},
  };
  return kMetrics;
}

const AnalyzerMetric& find_analyzer_metric(const std::string& name) {
  std::string known;
  for (const AnalyzerMetric& m : analyzer_metrics()) {
    if (name == m.name) return m;
    known += std::string(known.empty() ? "\"" : ", \"") + m.name + "\"";
  }
  throw Error(detail::concat("--metric: expected one of ", known, ", found \"", name, "\""), __FILE__, __LINE__);
}

SampleIndex analyze_shards(const AnalyzeOptions& o) {
  const AnalyzerMetric& metric = find_analyzer_metric(o.metric);
  CUTRAIN_CHECK(o.seq_len > 0, "--seq_length: expected a positive integer, found ", o.seq_len);
  CUTRAIN_CHECK(o.vocab_size > 0 && o.vocab_size <= 65536, "--vocab_size: expected 1..65536 (uint16 shards), found ",
                o.vocab_size);
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  SampleIndex idx;
  idx.metric = metric.name;
  idx.seq_len = o.seq_len;
  idx.window_len = o.seq_len + (o.labels == Labels::kNextToken ? 1 : 0);
  idx.vocab_size = o.vocab_size;

  const std::vector<std::string> files = expand_shard_patterns(o.patterns);
  std::vector<TokenShard> shards;
  std::vector<int64_t> base{0};  // prefix sums of windows per shard
  std::size_t tokens = 0;
  for (const std::string& f : files) {
    shards.push_back(TokenShard::open(f, o.vocab_size));  // checks the header and every token
    tokens += shards.back().size();
    base.push_back(base.back() + windows_in_shard(static_cast<int64_t>(shards.back().size()), o.seq_len, idx.window_len));
  }
  const auto n = static_cast<std::size_t>(base.back());
  CUTRAIN_CHECK(n > 0, "analyze-data: the ", files.size(), " shard(s) of '", o.patterns.front(), "' hold ", tokens,
                " tokens, fewer than one window of ", idx.window_len, " tokens (--seq_length ", o.seq_len, ")");
  idx.shards = fingerprint_shards(files);

  MetricContext ctx;
  if (metric.needs_counts) {
    // Map: per-thread token counts over ranges of the whole shards' tokens; reduce: their sum.
    std::vector<std::vector<uint64_t>> partial(static_cast<std::size_t>(threads));
    std::atomic<std::size_t> none{0};
    std::atomic<int> slot{0};
    for (const TokenShard& s : shards) {
      slot = 0;
      parallel_ranges(s.size(), threads, nullptr, none, [&](std::size_t b, std::size_t e) {
        auto& c = partial[static_cast<std::size_t>(slot.fetch_add(1))];
        c.resize(static_cast<std::size_t>(o.vocab_size), 0);
        for (std::size_t i = b; i < e; ++i) ++c[s.tokens()[i]];
      });
    }
    std::vector<uint64_t> counts(static_cast<std::size_t>(o.vocab_size), 0);
    for (const auto& c : partial)
      for (std::size_t v = 0; v < c.size(); ++v) counts[v] += c[v];
    ctx.neg_log_p.assign(counts.size(), 0.0);
    for (std::size_t v = 0; v < counts.size(); ++v)
      if (counts[v] > 0) ctx.neg_log_p[v] = -std::log(static_cast<double>(counts[v]) / static_cast<double>(tokens));
  }

  // Map: each thread computes the metric of a range of samples into its slots of `values`.
  idx.values.assign(n, 0.0);
  std::atomic<std::size_t> done{0};
  parallel_ranges(n, threads, o.progress, done, [&](std::size_t b, std::size_t e) {
    for (std::size_t w = b; w < e; ++w) {
      const auto s = static_cast<std::size_t>(
          std::upper_bound(base.begin(), base.end(), static_cast<int64_t>(w)) - base.begin() - 1);
      const uint16_t* src = shards[s].tokens() + (static_cast<int64_t>(w) - base[s]) * o.seq_len;
      idx.values[w] = metric.fn(src, o.seq_len, ctx);
      if ((w & 1023) == 0) done.fetch_add(std::min<std::size_t>(1024, e - w));
    }
  });
  // Reduce: the samples by difficulty and the percentiles.
  sort_and_rank(idx);
  return idx;
}

}  // namespace cutrain::data
