#include "data/mlm_sampler.h"

#include <algorithm>
#include <numeric>

#include "data/batch_sampler.h"
#include "runtime/error.h"

namespace cutrain::data {

std::vector<MlmPiece> mlm_pieces(const uint16_t* tokens, std::size_t n, uint32_t shard, int seq_len, int32_t eot,
                                 int64_t* documents) {
  std::vector<MlmPiece> pieces;
  int64_t docs = 0;
  std::size_t begin = 0;
  for (std::size_t i = 0; i <= n; ++i) {
    if (i < n && int32_t(tokens[i]) != eot) continue;
    if (i > begin) ++docs;
    for (std::size_t s = begin; s < i; s += std::size_t(seq_len))
      pieces.push_back({s, shard, uint32_t(std::min<std::size_t>(std::size_t(seq_len), i - s))});
    begin = i + 1;
  }
  if (documents) *documents = docs;
  return pieces;
}

MlmSampler::MlmSampler(MlmOptions options) : options_(std::move(options)) {
  const MlmOptions& o = options_;
  CUTRAIN_CHECK(o.batch_size >= 1 && o.seq_len >= 1, "masked LM data: batch size and sequence length must be >= 1, found B=",
                o.batch_size, " S=", o.seq_len);
  CUTRAIN_CHECK(o.rule.random_tokens >= 1 && o.rule.random_tokens <= o.vocab_size,
                "masked LM data: random replacements are drawn below ", o.rule.random_tokens, ", expected 1..",
                o.vocab_size, " (the real tokens)");
  CUTRAIN_CHECK(o.rule.mask_id >= o.vocab_size && o.rule.pad_id >= o.vocab_size && o.rule.mask_id != o.rule.pad_id,
                "masked LM data: [MASK] (", o.rule.mask_id, ") and [PAD] (", o.rule.pad_id,
                ") must be two ids past the tokenizer's ", o.vocab_size, " tokens");
  CUTRAIN_CHECK(o.rule.max_predictions >= 1, "masked LM data: max_predictions_per_seq must be >= 1, found ",
                o.rule.max_predictions);
  rows_.resize(std::size_t(o.batch_size) * std::size_t(o.seq_len));
  scratch_.resize(std::size_t(o.seq_len));
  lens_.resize(std::size_t(o.batch_size));
  if (synthetic()) return;
  for (const std::string& path : expand_shard_patterns(o.patterns)) {
    shards_.push_back(TokenShard::open(path, o.vocab_size));
    const TokenShard& s = shards_.back();
    int64_t docs = 0;
    std::vector<MlmPiece> p = mlm_pieces(s.tokens(), s.size(), uint32_t(shards_.size() - 1), o.seq_len, o.eot, &docs);
    pieces_.insert(pieces_.end(), p.begin(), p.end());
    num_documents_ += docs;
    num_tokens_ += int64_t(s.size());
  }
  CUTRAIN_CHECK(pieces_.size() < std::size_t(UINT32_MAX), "masked LM data: ", pieces_.size(),
                " samples are more than this sampler indexes");
  CUTRAIN_CHECK(int64_t(pieces_.size()) >= o.batch_size, "masked LM data: the shards of '", o.patterns.front(), "'",
                (o.patterns.size() > 1 ? " (and more)" : ""), " hold ", num_tokens_, " tokens in ", num_documents_,
                " documents, which give ", pieces_.size(), " samples of at most ", o.seq_len,
                " tokens; one micro-batch needs ", o.batch_size);
}

void MlmSampler::build_order(int64_t epoch) {
  const auto n = uint32_t(pieces_.size());
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0u);
  if (options_.shuffle) {
    CounterRng rng(CounterRng::key(options_.seed, kStreamEpoch, uint64_t(epoch)));
    for (uint32_t i = n; i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
  }
  order_epoch_ = epoch;
}

int MlmSampler::raw_sample(int64_t k, int32_t* tokens) {
  CUTRAIN_CHECK(k >= 0, "masked LM data: sample number ", k, " is negative");
  const MlmOptions& o = options_;
  if (synthetic()) {
    CounterRng rng(CounterRng::key(o.seed, kStreamSynthetic, uint64_t(k)));
    const int lo = std::max(1, o.seq_len / 2);
    const int len = lo + int(rng.below(uint64_t(o.seq_len - lo + 1)));
    for (int t = 0; t < len; ++t) tokens[t] = int32_t(rng.below(uint64_t(o.rule.random_tokens)));
    return len;
  }
  const int64_t n = num_samples();
  if (k / n != order_epoch_) build_order(k / n);
  const MlmPiece& p = pieces_[order_[std::size_t(k % n)]];
  const uint16_t* src = shards_[p.shard].tokens() + p.start;
  for (uint32_t t = 0; t < p.len; ++t) tokens[t] = src[t];
  return int(p.len);
}

MlmBatchInfo MlmSampler::fill(int64_t micro_batch, int32_t* tokens, int32_t* labels) {
  CUTRAIN_CHECK(micro_batch >= 0, "masked LM data: micro-batch ", micro_batch, " is negative");
  const MlmOptions& o = options_;
  const int64_t B = o.batch_size;
  const int S = o.seq_len;
  MlmBatchInfo info;
  for (int64_t b = 0; b < B; ++b) {
    lens_[std::size_t(b)] = raw_sample(micro_batch * B + b, rows_.data() + b * S);
    info.longest = std::max(info.longest, lens_[std::size_t(b)]);
  }
  info.row_len = o.pad_to_longest ? info.longest : S;
  const int L = info.row_len;
  for (int64_t b = 0; b < B; ++b) {
    const int len = lens_[std::size_t(b)];
    int32_t* t = tokens + b * L;
    std::copy(rows_.data() + b * S, rows_.data() + b * S + len, t);
    info.predictions += mask_sample(o.rule, o.seed, uint64_t(micro_batch * B + b), t, labels + b * L, len, L,
                                    scratch_.data());
    info.real_tokens += len;
  }
  return info;
}

}  // namespace cutrain::data
