#include "data/llmc_order.h"

#include <algorithm>
#include <numeric>

#include "runtime/error.h"

namespace cutrain::data {

void llmc_permute(std::vector<int32_t>& v, std::mt19937& rng) {
  for (std::size_t i = v.size(); i-- > 1;) {
    const auto j = static_cast<std::size_t>(static_cast<std::uint32_t>(rng()) % static_cast<std::uint32_t>(i + 1));
    std::swap(v[i], v[j]);
  }
}

int64_t llmc_samples_in_shard(int64_t tokens, int64_t batch_size, int64_t seq_len, int world_size) {
  const int64_t piece = int64_t(world_size) * batch_size * seq_len;
  return tokens > 0 ? (tokens - 1) / piece : 0;
}

LlmcOrder::LlmcOrder(LlmcOrderOptions options) : o_(std::move(options)) {
  CUTRAIN_CHECK(o_.batch_size > 0 && o_.seq_len > 0,
                "llm.c data order: batch size and sequence length must be positive, found B=", o_.batch_size,
                " T=", o_.seq_len);
  CUTRAIN_CHECK(o_.world_size > 0 && o_.rank >= 0 && o_.rank < o_.world_size, "llm.c data order: rank ", o_.rank,
                " is outside world size ", o_.world_size);
  CUTRAIN_CHECK(!o_.shard_tokens.empty(), "llm.c data order: expected at least one shard, found none");
  CUTRAIN_CHECK(o_.shard_tokens.size() < std::size_t(INT32_MAX), "llm.c data order: ", o_.shard_tokens.size(),
                " shards are more than llm.c's int indices hold");
  CUTRAIN_CHECK(o_.seed <= std::uint64_t(UINT32_MAX) - std::uint64_t(o_.rank),
                "llm.c data order: its generator takes a 32-bit seed: expected seed + rank < 2^32, found seed ",
                o_.seed, " + rank ", o_.rank);
  const int64_t piece = int64_t(o_.world_size) * o_.batch_size * o_.seq_len;
  for (std::size_t s = 0; s < o_.shard_tokens.size(); ++s) {
    const int64_t n = llmc_samples_in_shard(o_.shard_tokens[s], o_.batch_size, o_.seq_len, o_.world_size);
    CUTRAIN_CHECK(n > 0, "llm.c data order: shard ", s, " holds ", o_.shard_tokens[s],
                  " tokens; llm.c needs at least world x B x T + 1 = ", piece + 1, " in every shard");
    CUTRAIN_CHECK(n < int64_t(INT32_MAX), "llm.c data order: shard ", s, " holds ", n,
                  " samples, more than llm.c's int indices hold");
    samples_.push_back(n);
    per_epoch_ += n;
  }
  restart();
}

void LlmcOrder::restart() {
  rng_.seed(static_cast<std::mt19937::result_type>(o_.seed + std::uint64_t(o_.rank)));
  shard_order_.resize(o_.shard_tokens.size());
  std::iota(shard_order_.begin(), shard_order_.end(), 0);
  next_batch_ = 0;
  begin_epoch();
}

void LlmcOrder::begin_epoch() {
  pos_ = 0;
  sample_ = 0;
  if (o_.shuffle) llmc_permute(shard_order_, rng_);
  enter_shard();
}

void LlmcOrder::enter_shard() {
  sample_ = 0;
  if (!o_.shuffle) return;
  in_shard_.resize(std::size_t(current_samples()));
  std::iota(in_shard_.begin(), in_shard_.end(), 0);
  llmc_permute(in_shard_, rng_);
}

void LlmcOrder::advance() {
  if (pos_ + 1 == shard_order_.size()) {
    begin_epoch();
    return;
  }
  ++pos_;
  enter_shard();
}

LlmcRead LlmcOrder::at(int64_t batch) {
  CUTRAIN_CHECK(batch >= 0, "llm.c data order: batch ", batch, " is negative");
  if (batch < next_batch_) restart();
  // Skip to `batch`: within a shard nothing is drawn, so whole runs of samples go at once.
  while (next_batch_ < batch) {
    if (sample_ >= current_samples()) advance();
    const int64_t k = std::min(batch - next_batch_, current_samples() - sample_);
    sample_ += k;
    next_batch_ += k;
  }
  if (sample_ >= current_samples()) advance();
  const int64_t idx = o_.shuffle ? in_shard_[std::size_t(sample_)] : sample_;
  ++sample_;
  ++next_batch_;
  const int64_t piece = o_.batch_size * o_.seq_len;
  return {std::size_t(shard_order_[pos_]), (idx * o_.world_size + o_.rank) * piece};
}

}  // namespace cutrain::data
