// @brief The offline data analyzer of curriculum learning: a difficulty metric for each sample of
// a set of token shards (the batch sampler's windows: seq_len input tokens each), computed on
// several threads (map over shard ranges, then reduce), into a SampleIndex (data/sample_index.h).
// A metric is one small function of a sample's tokens; vocabulary rarity first reduces the
// corpus's token counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/batch_sampler.h"
#include "data/sample_index.h"

namespace cutrain::data {

// What a metric may read besides the sample's tokens.
struct MetricContext {
  std::vector<double> neg_log_p;  // -log p(token) from the corpus counts (vocabularyrarity)
};

struct AnalyzerMetric {
  const char* name;
  bool needs_counts;  // reduce the corpus's token counts first
  double (*fn)(const uint16_t* tokens, int64_t n, const MetricContext& ctx);
};

// The metrics by name: "seqlen" (the sample's token count; every window of the sampler is full,
// so it is seq_len throughout) and "vocabularyrarity" (mean -log p(token), p from the counts of
// every token of the shards).
const std::vector<AnalyzerMetric>& analyzer_metrics();
// The metric `name`, or an error naming the known ones.
const AnalyzerMetric& find_analyzer_metric(const std::string& name);

struct AnalyzeOptions {
  std::vector<std::string> patterns;  // shard globs, as --data
  std::string metric = "vocabularyrarity";
  int64_t seq_len = 1024;
  Labels labels = Labels::kNextToken;  // the window length, as the sampler's
  int32_t vocab_size = 50257;
  int threads = 0;  // 0: the hardware's
  // Called from the calling thread with (samples done, samples in all) while the threads work.
  std::function<void(std::size_t, std::size_t)> progress;
};

SampleIndex analyze_shards(const AnalyzeOptions& options);

}  // namespace cutrain::data
