#include "data/batch_sampler.h"

#include <glob.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "runtime/error.h"

namespace cutrain::data {

std::vector<std::string> expand_shard_patterns(const std::vector<std::string>& patterns) {
  CUTRAIN_CHECK(!patterns.empty(), "no data patterns given (expected at least one shard glob)");
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (const std::string& pattern : patterns) {
    glob_t g{};
    const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
    std::vector<std::string> matches;
    if (rc == 0)
      for (std::size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    CUTRAIN_CHECK(rc == 0 || rc == GLOB_NOMATCH, "data pattern '", pattern, "': glob failed (read error)");
    CUTRAIN_CHECK(!matches.empty(), "data pattern '", pattern, "': matches no file");
    std::sort(matches.begin(), matches.end());
    for (auto& m : matches)
      if (seen.insert(m).second) files.push_back(m);
  }
  return files;
}

int64_t padded_vocab_size(int64_t vocab_size, int64_t multiple) {
  CUTRAIN_CHECK(vocab_size > 0 && multiple > 0, "padded_vocab_size: expected positive sizes, found vocab ",
                vocab_size, " multiple ", multiple);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

int64_t windows_in_shard(int64_t tokens, int64_t seq_len, int64_t window_len) {
  return tokens >= window_len ? (tokens - window_len) / seq_len + 1 : 0;
}

BatchSampler::BatchSampler(SamplerOptions options) : options_(std::move(options)) {
  const SamplerOptions& o = options_;
  CUTRAIN_CHECK(o.batch_size > 0 && o.seq_len > 0, "data loader: batch size and sequence length must be positive, found B=",
                o.batch_size, " T=", o.seq_len);
  CUTRAIN_CHECK(o.world_size > 0 && o.rank >= 0 && o.rank < o.world_size, "data loader: rank ", o.rank,
                " is outside world size ", o.world_size);
  CUTRAIN_CHECK(o.vocab_size > 0 && o.vocab_size <= 65536, "data loader: vocab size ", o.vocab_size,
                " must be 1..65536 (uint16 shards)");
  window_len_ = o.seq_len + (o.labels == Labels::kNextToken ? 1 : 0);
  window_base_.push_back(0);
  for (const std::string& path : expand_shard_patterns(o.patterns)) {
    shards_.push_back(TokenShard::open(path, o.vocab_size));
    const auto n = static_cast<int64_t>(shards_.back().size());
    num_tokens_ += n;
    const int64_t windows = windows_in_shard(n, o.seq_len, window_len_);
    window_base_.push_back(window_base_.back() + static_cast<uint64_t>(windows));
  }
  if (o.order == DataOrder::Llmc) {
    CUTRAIN_CHECK(o.labels == Labels::kNextToken, "data loader: llm.c's data order reads B x T + 1 tokens and takes "
                  "the next token as the label: expected next-token labels, found labels = input ids");
    CUTRAIN_CHECK(!o.curriculum, "data loader: llm.c's data order and a curriculum's draw are two different orders: "
                  "expected one of them, found both");
    LlmcOrderOptions lo;
    const int64_t piece = int64_t(o.world_size) * o.batch_size * o.seq_len;
    for (const TokenShard& s : shards_) {
      const auto n = static_cast<int64_t>(s.size());
      CUTRAIN_CHECK(llmc_samples_in_shard(n, o.batch_size, o.seq_len, o.world_size) > 0, "data loader: shard ", s.path(),
                    " holds ", n, " tokens; llm.c's data order needs at least world_size x B x T + 1 = ", piece + 1,
                    " in every shard (llm.c asserts the same)");
      lo.shard_tokens.push_back(n);
    }
    lo.batch_size = o.batch_size;
    lo.seq_len = o.seq_len;
    lo.rank = o.rank;
    lo.world_size = o.world_size;
    lo.seed = o.seed;
    lo.shuffle = o.shuffle;
    llmc_ = std::make_unique<LlmcOrder>(std::move(lo));
    batches_per_epoch_ = llmc_->batches_per_epoch();
    return;
  }
  const auto windows = static_cast<int64_t>(window_base_.back());
  CUTRAIN_CHECK(windows < int64_t(UINT32_MAX), "data loader: ", windows, " windows are more than this loader indexes");
  batches_per_epoch_ = windows / (o.batch_size * o.world_size);
  CUTRAIN_CHECK(batches_per_epoch_ > 0, "data loader: the shards of '", o.patterns.front(), "'", (o.patterns.size() > 1 ? " (and more)" : ""),
                " hold ", num_tokens_, " tokens in ", shards_.size(), " file(s), which give ", windows,
                " windows of ", window_len_, " tokens; one batch needs B x world_size = ", o.batch_size * o.world_size);
}

void BatchSampler::build_order(int64_t epoch) {
  const auto n = static_cast<uint32_t>(window_base_.back());
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0u);
  if (options_.shuffle) {
    // Own Fisher-Yates over mt19937_64 (both fully specified), so an order depends only on
    // (seed, epoch), not on the standard library's shuffle or distributions.
    std::mt19937_64 rng(options_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
    for (uint32_t i = n; i > 1; --i) {
      // Uniform in [0, i) by rejection (no modulo bias).
      const uint64_t limit = UINT64_MAX - UINT64_MAX % i;
      uint64_t r;
      do r = rng(); while (r >= limit);
      std::swap(order_[i - 1], order_[r % i]);
    }
  }
  order_epoch_ = epoch;
}

void BatchSampler::fill(int64_t step, int32_t* inputs, int32_t* targets) {
  CUTRAIN_CHECK(step >= 0, "data loader: batch step ", step, " is negative");
  const int64_t B = options_.batch_size, T = options_.seq_len;
  if (llmc_) {
    // One run of B x T + 1 tokens: row b is tokens [b T, b T + T), its targets one token on (the
    // last row's last target is the run's extra token).
    const LlmcRead r = llmc_->at(step);
    const uint16_t* src = shards_[r.shard].tokens() + r.first_token;
    for (int64_t i = 0; i < B * T; ++i) {
      inputs[i] = src[i];
      targets[i] = src[i + 1];
    }
    return;
  }
  std::vector<uint32_t> windows;
  if (options_.curriculum) {
    windows = options_.curriculum->draw(step, options_.rank, options_.world_size, B);
  } else {
    const int64_t epoch = step / batches_per_epoch_;
    const int64_t in_epoch = step % batches_per_epoch_;
    if (epoch != order_epoch_) build_order(epoch);
    const int64_t first = (in_epoch * options_.world_size + options_.rank) * B;
    windows.assign(order_.begin() + first, order_.begin() + first + B);
  }
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t w = windows[static_cast<std::size_t>(b)];
    CUTRAIN_CHECK(w < window_base_.back(), "data loader: window ", w, " is outside the shards' ", window_base_.back(),
                  " windows");
    const auto s = static_cast<std::size_t>(
        std::upper_bound(window_base_.begin(), window_base_.end(), w) - window_base_.begin() - 1);
    const uint16_t* src = shards_[s].tokens() + (w - window_base_[s]) * static_cast<uint64_t>(T);
    int32_t* in = inputs + b * T;
    int32_t* tg = targets + b * T;
    const int64_t shift = options_.labels == Labels::kNextToken ? 1 : 0;
    for (int64_t t = 0; t < T; ++t) {
      in[t] = src[t];
      tg[t] = src[t + shift];
    }
  }
}

}  // namespace cutrain::data
