// @brief Which tokens make batch number s: token shards cut into windows of T (+1) tokens,
// shuffled per epoch from a seed, dealt out to ranks; or, with DataOrder::Llmc, exactly the batches
// llm.c's DataLoader reads (data/llmc_order.h). Synchronous; DataLoader runs it on a background
// thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/curriculum_draw.h"
#include "data/data_order.h"
#include "data/llmc_order.h"
#include "data/token_shard.h"

namespace cutrain::data {

enum class Labels {
  kNextToken,  // targets[t] = inputs[t + 1] (windows of T + 1 tokens)
  kIdentity,   // targets == inputs (the DeepSpeed BF16 example's labels = input_ids; windows of T)
};

struct SamplerOptions {
  std::vector<std::string> patterns;  // glob patterns of shards; each must match at least one file
  int64_t batch_size = 1;             // B, per rank
  int64_t seq_len = 1;                // T
  int rank = 0, world_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;  // false: windows in file order (eval); with Llmc: llm.c's validation loader
  // Llmc: llm.c's DataLoader (next-token labels only, no curriculum): each batch one run of
  // B x T + 1 tokens, rows contiguous; its generator seeded with seed + rank (llm.c: 42 + rank).
  DataOrder order = DataOrder::Shuffled;
  Labels labels = Labels::kNextToken;
  int32_t vocab_size = 50257;  // every token must be below it (the tokenizer's, before padding)
  // Set: batch s holds the windows the curriculum draws for micro-batch s (the index must match
  // these shards: data/sample_index.h's check_index_matches); unset: the shuffled epochs.
  std::shared_ptr<const CurriculumDraw> curriculum;
};

// The files the patterns match, each pattern's matches sorted, duplicates dropped; an error names a
// pattern that matches nothing.
std::vector<std::string> expand_shard_patterns(const std::vector<std::string>& patterns);

// The windows of a shard of `tokens` tokens: they start every seq_len tokens, hold window_len
// (seq_len, + 1 with next-token labels) tokens and never cross the shard's end. The curriculum
// index (data/sample_index.h) numbers the same windows.
int64_t windows_in_shard(int64_t tokens, int64_t seq_len, int64_t window_len);

// The vocabulary size rounded up to a multiple (--pad_vocab: 50257 -> 50304).
int64_t padded_vocab_size(int64_t vocab_size, int64_t multiple = 64);

class BatchSampler {
 public:
  explicit BatchSampler(SamplerOptions options);

  // Writes batch `step` (0, 1, ... across epochs) of this rank: inputs and targets, B*T each.
  // Ascending steps are cheap in either order; with Llmc an earlier step replays its generator.
  void fill(int64_t step, int32_t* inputs, int32_t* targets);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t num_windows() const { return static_cast<int64_t>(window_base_.back()); }
  int64_t num_tokens() const { return num_tokens_; }
  const std::vector<TokenShard>& shards() const { return shards_; }
  const SamplerOptions& options() const { return options_; }

 private:
  void build_order(int64_t epoch);  // the window order of one epoch

  SamplerOptions options_;
  std::vector<TokenShard> shards_;
  std::vector<uint64_t> window_base_;  // prefix sums of windows per shard (size shards + 1)
  int64_t window_len_ = 0;
  int64_t num_tokens_ = 0;
  int64_t batches_per_epoch_ = 0;
  int64_t order_epoch_ = -1;
  std::vector<uint32_t> order_;  // window ids in this epoch's order
  std::unique_ptr<LlmcOrder> llmc_;  // DataOrder::Llmc
};

}  // namespace cutrain::data
