// @brief BERT's masked-LM batches (docs/bert.md, "Data"): samples cut from llm.c token shards (one
// document's contiguous tokens, at most S; documents are separated by the EOT token, longer ones
// split into S-token pieces, so lengths vary), or synthetic samples (random real tokens, lengths
// uniform in [S/2, S]); each masked by data/mlm_masking.h's rule and padded with [PAD] to the
// micro-batch's longest sample or to S. Sample number k's tokens and masks are a pure function of
// (seed, k): micro-batch m holds samples m*B .. m*B + B-1, so a resumed run draws the same batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/mlm_masking.h"
#include "data/token_shard.h"

namespace cutrain::data {

struct MlmOptions {
  std::vector<std::string> patterns;  // glob patterns of token shards; empty: synthetic samples
  int64_t batch_size = 1;             // B
  int seq_len = 128;                  // S: the longest sample (bing_bert's --max_seq_length)
  uint64_t seed = 0;
  bool shuffle = true;  // false: the samples in file order (validation)
  MlmRule rule;
  int32_t vocab_size = 50257;  // every shard token must be below it (GPT-2's tokenizer)
  int32_t eot = 50256;         // the document separator (GPT-2's <|endoftext|>); never inside a sample
  // true: rows padded to the micro-batch's longest sample (row length <= S); false: to S (the fixed
  // shape the GPU engine's CUDA graph and the training loop take).
  bool pad_to_longest = false;
};

// A real sample: `len` tokens of shard `shard` from token `start`.
struct MlmPiece {
  uint64_t start = 0;
  uint32_t shard = 0;
  uint32_t len = 0;
};

// The pieces of one shard's tokens: each maximal run between EOT tokens (or the shard's ends) cut
// into pieces of `seq_len` tokens, the last one shorter; empty runs give none. In file order.
// `documents` (may be null) gets the number of non-empty runs.
std::vector<MlmPiece> mlm_pieces(const uint16_t* tokens, std::size_t n, uint32_t shard, int seq_len, int32_t eot,
                                 int64_t* documents = nullptr);

struct MlmBatchInfo {
  int row_len = 0;   // the rows' length: S, or the longest sample with pad_to_longest
  int longest = 0;   // the micro-batch's longest sample
  int64_t real_tokens = 0;   // tokens that are not [PAD]
  int64_t predictions = 0;   // positions with a label
};

class MlmSampler {
 public:
  explicit MlmSampler(MlmOptions options);

  // Sample number k before masking: writes its tokens (at most S) and returns its length.
  // Real data: epoch e = k / num_samples() in that epoch's order (a Fisher-Yates shuffle drawn
  // from (seed, e), or file order without shuffle). Synthetic: length lo + below(S - lo + 1) with
  // lo = max(1, S / 2), then each token below(rule.random_tokens), from (seed, k).
  int raw_sample(int64_t k, int32_t* tokens);
  // Micro-batch m: rows b = 0..B-1 hold sample m*B + b masked by mask_sample(seed, m*B + b), padded
  // to row_len; tokens and labels hold B * row_len ints (room for B * S).
  MlmBatchInfo fill(int64_t micro_batch, int32_t* tokens, int32_t* labels);

  bool synthetic() const { return options_.patterns.empty(); }
  int64_t num_samples() const { return int64_t(pieces_.size()); }  // 0 for synthetic samples
  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return num_tokens_; }
  const std::vector<TokenShard>& shards() const { return shards_; }
  const MlmOptions& options() const { return options_; }

 private:
  void build_order(int64_t epoch);

  MlmOptions options_;
  std::vector<TokenShard> shards_;
  std::vector<MlmPiece> pieces_;
  int64_t num_documents_ = 0, num_tokens_ = 0;
  int64_t order_epoch_ = -1;
  std::vector<uint32_t> order_;
  std::vector<int32_t> rows_, scratch_;
  std::vector<int> lens_;
};

}  // namespace cutrain::data
