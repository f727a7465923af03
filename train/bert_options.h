// @brief BERT pre-training's model config, DeepSpeed's way (docs/bert.md, "Configuration"):
// `--bert_config FILE` is either DeepSpeedExamples' bing_bert config (a `bert_model_config` object
// with Hugging Face BertConfig's keys beside bing_bert's own top-level keys) or a JSON of
// DeepSpeedTransformerConfig's fields; bing_bert's command-line flags override it. Strict: unknown
// keys, wrong types and ranges and inconsistent values are errors naming the file and the JSON path;
// keys read but not acted on come back as notes. The result is the model (arch Bert over GPT-2's
// tokens plus [MASK] and [PAD]) with the sequence length and the masked-LM prediction cap.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "model/transformer_params.h"

namespace cutrain::train {

// The vocabulary of BERT runs: GPT-2's 50257 tokens (the shards' tokenizer), then [MASK] and [PAD].
inline constexpr int kBertRealTokens = 50257;
inline constexpr int kBertMaskId = 50257;
inline constexpr int kBertPadId = 50258;
inline constexpr int kBertVocab = 50259;
inline constexpr int kBertEot = 50256;  // GPT-2's <|endoftext|>: separates documents, never a random replacement

// bing_bert's command-line flags on `cutrain train --model bert` (store_true flags there: given
// turns the feature on over the file's value).
struct BertFlags {
  std::filesystem::path config;  // --bert_config FILE (required with --model bert)
  bool deepspeed_transformer_kernel = false;  // accepted: cutrain's BERT layer is always its fused kernel
  bool stochastic_mode = false, normalize_invertible = false, gelu_checkpoint = false,
       attention_dropout_checkpoint = false;
  std::optional<int> max_seq_length;           // S (not given: --seq_length)
  std::optional<int> max_predictions_per_seq;  // not given: ceil(0.15 S)
};

enum class BertConfigFormat { BingBert, TransformerConfig };

struct BertSetup {
  model::ModelDims dims;  // arch Bert, vocab kBertVocab (+ padding rows), intermediate, bert fields
  int seq_len = 128;
  int max_predictions = 20;
  BertConfigFormat format = BertConfigFormat::BingBert;
  std::string origin;                 // the file
  std::optional<int> batch_size;      // DeepSpeedTransformerConfig's batch_size (checked against the micro-batch)
  std::optional<std::uint64_t> seed;  // DeepSpeedTransformerConfig's seed
  bool fp16 = false;                  // DeepSpeedTransformerConfig's fp16: true selects fp16 training
  std::vector<std::string> notes;     // keys read but not acted on, flags that change nothing: one line each
};

// Reads flags.config (its text from the file) and applies the flags. `default_seq_len`: S when
// --max_seq_length is not given; `pad_vocab_multiple`: the embedding's rows rounded up to it (0:
// none). Throws ConfigError naming the file, the JSON path, what was expected and what was found.
BertSetup load_bert_config(const BertFlags& flags, int default_seq_len, int pad_vocab_multiple);
// The same from a JSON text; `origin` names it in messages.
BertSetup parse_bert_config(const std::string& json_text, const std::string& origin, const BertFlags& flags,
                            int default_seq_len, int pad_vocab_multiple);

// DeepSpeedTransformerConfig's batch_size against the run's micro-batch (`micro_source` names where
// that came from): an error naming both when they differ.
void check_bert_batch(const BertSetup& setup, int micro_batch, const std::string& micro_source);

// Issue #20's padding to the longest sequence (`cutrain train --model bert --pad_to_longest
// BUCKET`): the length a step's micro-batches are cut to, the longest real sample of the step
// (`longest`) rounded up to a multiple of `bucket`, at least the masked-LM head's slots per
// sequence `max_pred` (its gather needs them) and at most S. One length per step (every
// micro-batch of it), from a few buckets: each one a CUDA graph of its own.
int bert_padded_length(int longest, int bucket, int max_pred, int S);

// "BERT (Pre-LN, 24 layers, hidden 1024, 16 heads, intermediate 4096, ...)": the run's model line.
std::string describe_bert(const BertSetup& setup);
const char* name(BertConfigFormat f);

}  // namespace cutrain::train
