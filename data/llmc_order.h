// @brief llm.c's DataLoader order (its llmc/dataloader.h as train_gpt2.cu uses it): which shard and
// which token a rank's batch number s reads. A shard of N tokens holds (N - 1) / (world x B x T)
// samples; sample i of rank r is the B x T + 1 tokens from token (i x world + r) x B x T (inputs
// the first B x T, targets the same one token on). Shuffled (llm.c's training loader): a 32-bit
// MT19937 seeded with seed + rank; each epoch first permutes the shard order in place (the
// previous epoch's order, not the identity: the first epoch is shuffled too), then every shard,
// when reached, gets a fresh permutation of its samples. Unshuffled (its validation loader, reset
// before each evaluation): shards in file order, samples in file order. After the last sample of
// the last shard the next epoch begins.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace cutrain::data {

// llm.c's permutation step: Fisher-Yates from the top, j = next() % (i + 1) (a modulo, not a
// rejection draw: llm.c's exact indices), applied to `v` as it is. Draws v.size() - 1 numbers.
// std::mt19937 is the standard's MT19937: the same seeding and outputs as llm.c's manual_seed /
// randint32 (tests/unit/test_llmc_order.cpp checks both against published values).
void llmc_permute(std::vector<int32_t>& v, std::mt19937& rng);

// Samples of rank-interleaved B x T pieces a shard of `tokens` tokens holds (llm.c's
// shard_num_samples: one token kept back for the last piece's last target).
int64_t llmc_samples_in_shard(int64_t tokens, int64_t batch_size, int64_t seq_len, int world_size);

struct LlmcOrderOptions {
  std::vector<int64_t> shard_tokens;  // each shard's token count, in file (glob) order
  int64_t batch_size = 1, seq_len = 1;
  int rank = 0, world_size = 1;
  std::uint64_t seed = 42;  // the generator's seed is seed + rank (llm.c: 42 + rank), < 2^32
  bool shuffle = true;      // false: llm.c's validation loader
};

struct LlmcRead {
  std::size_t shard;    // index into shard_tokens
  int64_t first_token;  // the rank's B x T + 1 tokens start here
};

class LlmcOrder {
 public:
  // Errors: sizes not positive, rank outside the world, no shard, a shard with fewer than
  // world x B x T + 1 tokens (llm.c asserts the same), a seed + rank beyond 32 bits.
  explicit LlmcOrder(LlmcOrderOptions options);

  // The read of batch `batch` (0, 1, ...: llm.c's successive dataloader_next_batch calls since
  // its init). Ascending calls cost O(1) each (a permutation when a shard or an epoch begins);
  // an earlier batch replays the generator from the seed.
  LlmcRead at(int64_t batch);

  int64_t samples_in_shard(std::size_t shard) const { return samples_[shard]; }
  int64_t batches_per_epoch() const { return per_epoch_; }
  const LlmcOrderOptions& options() const { return o_; }

 private:
  void restart();      // llm.c's dataloader_init: generator seeded, identity shard order, reset
  void begin_epoch();  // dataloader_reset: shard order permuted in place, its first shard entered
  void enter_shard();  // the current shard's samples: a fresh permutation when shuffled
  void advance();      // dataloader_advance_: the next shard, or the next epoch after the last
  int64_t current_samples() const { return samples_[std::size_t(shard_order_[pos_])]; }

  LlmcOrderOptions o_;
  std::vector<int64_t> samples_;
  int64_t per_epoch_ = 0;
  std::mt19937 rng_;
  std::vector<int32_t> shard_order_;  // llm.c's shard_indices
  std::vector<int32_t> in_shard_;     // llm.c's intra_shard_indices
  std::size_t pos_ = 0;               // current_shard_idx: position in shard_order_
  int64_t sample_ = 0;                // current_sample_idx
  int64_t next_batch_ = 0;            // the batch number the next draw returns
};

}  // namespace cutrain::data
