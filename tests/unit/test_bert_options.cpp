// --bert_config: bing_bert's file and DeepSpeedTransformerConfig's fields into the model, the
// flags over the file, the notes of keys read but not acted on, and every error naming the file,
// the JSON path, what was expected and what was found.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "train/bert_options.h"
#include "train/config.h"

namespace cutrain::train {
namespace {

using nlohmann::json;

json bing() {
  return json::parse(R"({
    "name": "bing_bert_large_lamb_seq",
    "bert_token_file": "bert-large-uncased",
    "bert_model_config": {
      "vocab_size_or_config_json_file": 119547, "hidden_size": 1024, "num_hidden_layers": 24,
      "num_attention_heads": 16, "intermediate_size": 4096, "hidden_act": "gelu",
      "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
      "type_vocab_size": 2, "initializer_range": 0.02
    },
    "data": {"flags": {"pretrain_dataset": true}},
    "mixed_precision": {"type": "fp16"}
  })");
}

json transformer() {
  return json::parse(R"({
    "batch_size": 8, "hidden_size": 64, "intermediate_size": 256, "heads": 4, "attn_dropout_ratio": 0.1,
    "hidden_dropout_ratio": 0.05, "num_hidden_layers": 2, "initializer_range": 0.02, "seed": 7, "fp16": false,
    "pre_layer_norm": false, "layer_norm_eps": 1e-5, "adjust_init_range": false, "stochastic_mode": true,
    "return_tuple": true, "training": true, "normalize_invertible": true, "gelu_checkpoint": false,
    "attn_dropout_checkpoint": true
  })");
}

BertSetup parse(const json& j, const BertFlags& flags = {}, int seq = 128, int pad = 128) {
  return parse_bert_config(j.dump(), "cfg.json", flags, seq, pad);
}

// The error's text; the test fails when there is none.
std::string error_of(const json& j, const BertFlags& flags = {}, int seq = 128) {
  try {
    parse(j, flags, seq);
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << j.dump();
  return "";
}

bool has_note(const BertSetup& s, const std::string& part) {
  return std::any_of(s.notes.begin(), s.notes.end(), [&](const std::string& n) { return n.find(part) != std::string::npos; });
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(BertOptions, BingBertLargeGivesTheModel) {
  const BertSetup s = parse(bing());
  EXPECT_EQ(s.format, BertConfigFormat::BingBert);
  const model::ModelDims& d = s.dims;
  EXPECT_EQ(d.arch, model::Arch::Bert);
  EXPECT_EQ(d.hidden, 1024);
  EXPECT_EQ(d.layers, 24);
  EXPECT_EQ(d.heads, 16);
  EXPECT_EQ(d.ffn(), 4096);
  EXPECT_EQ(d.max_seq, 512);
  EXPECT_EQ(d.vocab, 50259);
  EXPECT_EQ(d.vocab_rows(), 50304);
  EXPECT_EQ(d.bert.mask_id, 50257);
  EXPECT_EQ(d.bert.pad_id, 50258);
  EXPECT_TRUE(d.bert.pre_layer_norm);
  EXPECT_FLOAT_EQ(d.bert.hidden_dropout_ratio, 0.1f);
  EXPECT_FLOAT_EQ(d.bert.attn_dropout_ratio, 0.1f);
  EXPECT_DOUBLE_EQ(d.bert.initializer_range, 0.02);
  EXPECT_EQ(s.seq_len, 128);
  EXPECT_EQ(s.max_predictions, 20);  // ceil(0.15 x 128)
  // Read but not acted on: bing_bert's own keys, its WordPiece vocabulary size, two segment types.
  EXPECT_TRUE(has_note(s, "cfg.json: name: read but not acted on"));
  EXPECT_TRUE(has_note(s, "cfg.json: bert_token_file: read but not acted on"));
  EXPECT_TRUE(has_note(s, "cfg.json: data: read but not acted on"));
  EXPECT_TRUE(has_note(s, "cfg.json: mixed_precision: read but not acted on"));
  EXPECT_TRUE(has_note(s, "bert_model_config.vocab_size_or_config_json_file: read but not acted on (119547 tokens"));
  EXPECT_TRUE(has_note(s, "bert_model_config.type_vocab_size: read but not acted on"));
  EXPECT_EQ(s.notes.size(), 6u);
  EXPECT_HAS(describe_bert(s), "Pre-LN, 24 layers, hidden 1024, 16 heads, intermediate 4096");
}

TEST(BertOptions, TheRepositoryConfigsLoad) {
  BertFlags f;
  f.config = std::string(CUTRAIN_SOURCE_DIR) + "/configs/bert_large.json";
  const BertSetup large = load_bert_config(f, 128, 128);
  EXPECT_EQ(large.dims.layers, 24);
  EXPECT_EQ(large.dims.hidden, 1024);
  f.config = std::string(CUTRAIN_SOURCE_DIR) + "/configs/bert_tiny.json";
  const BertSetup tiny = load_bert_config(f, 32, 128);
  EXPECT_EQ(tiny.format, BertConfigFormat::TransformerConfig);
  EXPECT_EQ(tiny.dims.layers, 2);
  EXPECT_EQ(tiny.dims.hidden, 64);
  EXPECT_EQ(tiny.dims.max_seq, 32);
  for (const char* ds : {"bert_large_lamb_seq128.json", "bert_large_lamb_seq512.json", "bert_tiny_lamb.json"}) {
    const TrainConfig c = load_config(std::string(CUTRAIN_SOURCE_DIR) + "/configs/" + ds, {.strict = true});
    EXPECT_EQ(c.optimizer.type, OptimizerType::Lamb) << ds;
    EXPECT_TRUE(c.bf16.enabled) << ds;
    EXPECT_FALSE(c.fp16.enabled) << ds;
  }
}

TEST(BertOptions, TransformerConfigFieldsAndFlags) {
  BertSetup s = parse(transformer(), {}, 32);
  EXPECT_EQ(s.format, BertConfigFormat::TransformerConfig);
  const model::BertConfig& b = s.dims.bert;
  EXPECT_FALSE(b.pre_layer_norm);
  EXPECT_FLOAT_EQ(b.layer_norm_eps, 1e-5f);
  EXPECT_FALSE(b.adjust_init_range);
  EXPECT_TRUE(b.stochastic_mode);
  EXPECT_TRUE(b.normalize_invertible);  // with Post-LN too
  EXPECT_FALSE(b.gelu_checkpoint);
  EXPECT_TRUE(b.attn_dropout_checkpoint);
  EXPECT_FLOAT_EQ(b.hidden_dropout_ratio, 0.05f);
  EXPECT_EQ(s.dims.ffn(), 256);
  EXPECT_EQ(s.dims.max_seq, 32);
  EXPECT_EQ(s.batch_size, 8);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_TRUE(has_note(s, "cfg.json: return_tuple: read but not acted on"));
  // intermediate_size -1 (DeepSpeed's default): 4 x hidden.
  json j = transformer();
  j["intermediate_size"] = -1;
  EXPECT_EQ(parse(j).dims.ffn(), 256);
  // bing_bert's flags turn features on over the file; --max_seq_length and --max_predictions_per_seq.
  BertFlags f;
  f.gelu_checkpoint = true;
  f.max_seq_length = 64;
  f.max_predictions_per_seq = 9;
  f.deepspeed_transformer_kernel = true;
  s = parse(transformer(), f, 32);
  EXPECT_TRUE(s.dims.bert.gelu_checkpoint);
  EXPECT_EQ(s.seq_len, 64);
  EXPECT_EQ(s.dims.max_seq, 64);
  EXPECT_EQ(s.max_predictions, 9);
  EXPECT_TRUE(has_note(s, "--deepspeed_transformer_kernel"));
}

TEST(BertOptions, ErrorsNameFilePathExpectedAndFound) {
  json j = transformer();
  j["head"] = 4;  // a typo
  std::string e = error_of(j);
  EXPECT_HAS(e, "cfg.json: head: unknown key 'head' (nearest known key: 'heads')");
  j = bing();
  j["bert_model_config"]["num_heads"] = 16;
  EXPECT_HAS(error_of(j), "cfg.json: bert_model_config.num_heads: unknown key 'num_heads'");
  j = bing();
  j["bert_model_confg"] = json::object();
  EXPECT_HAS(error_of(j), "cfg.json: bert_model_confg: unknown key");
  j = transformer();
  j["fp16"] = true;  // selects fp16 training (train_loop.cpp); false by default
  EXPECT_TRUE(parse(j).fp16);
  EXPECT_FALSE(parse(transformer()).fp16);
  j["fp16"] = "yes";
  EXPECT_HAS(error_of(j), "cfg.json: fp16: expected a boolean");
  j = transformer();
  j["heads"] = 5;
  EXPECT_HAS(error_of(j), "cfg.json: heads: expected a divisor of hidden_size 64 (each head takes hidden / heads channels), found 5");
  j = bing();
  j["bert_model_config"]["num_attention_heads"] = 12;
  j["bert_model_config"]["hidden_size"] = 1000;
  EXPECT_HAS(error_of(j), "cfg.json: bert_model_config.num_attention_heads: expected a divisor of bert_model_config.hidden_size 1000");
  j = transformer();
  j["attn_dropout_ratio"] = 1.0;
  EXPECT_HAS(error_of(j), "cfg.json: attn_dropout_ratio: expected a number in [0, 1), found number 1");
  j = bing();
  j["bert_model_config"]["hidden_dropout_prob"] = -0.1;
  EXPECT_HAS(error_of(j), "cfg.json: bert_model_config.hidden_dropout_prob: expected a number in [0, 1)");
  j = transformer();
  j["hidden_size"] = "64";
  EXPECT_HAS(error_of(j), "cfg.json: hidden_size: expected a positive integer, found string \"64\"");
  j = transformer();
  j.erase("heads");
  EXPECT_HAS(error_of(j), "cfg.json: heads: expected a positive integer, found nothing");
  j = transformer();
  j["pre_layer_norm"] = 1;
  EXPECT_HAS(error_of(j), "cfg.json: pre_layer_norm: expected a boolean (true or false), found number 1");
  j = transformer();
  j["training"] = false;
  EXPECT_HAS(error_of(j), "cfg.json: training: expected true");
  j = bing();
  j["bert_model_config"]["hidden_act"] = "relu";
  EXPECT_HAS(error_of(j), "cfg.json: bert_model_config.hidden_act: expected \"gelu\" (the only activation the BERT layer has), found string \"relu\"");
  // The sequence against the position table.
  BertFlags f;
  f.max_seq_length = 1024;
  EXPECT_HAS(error_of(bing(), f), "cfg.json: bert_model_config.max_position_embeddings: expected at least the sequence length 1024 (--max_seq_length), found 512");
  f = {};
  f.max_predictions_per_seq = 200;
  EXPECT_HAS(error_of(bing(), f), "--max_predictions_per_seq: expected 1..128");
  EXPECT_HAS(error_of(json::array()), "cfg.json: (top level): expected an object");
}

TEST(BertOptions, BatchSizeAgainstTheMicroBatch) {
  const BertSetup s = parse(transformer());
  EXPECT_NO_THROW(check_bert_batch(s, 8, "train_micro_batch_size_per_gpu of ds.json"));
  try {
    check_bert_batch(s, 64, "train_micro_batch_size_per_gpu of ds.json");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_HAS(e.what(), "cfg.json: batch_size: expected the run's micro-batch 64 (train_micro_batch_size_per_gpu of ds.json), found 8");
  }
  EXPECT_NO_THROW(check_bert_batch(parse(bing()), 3, "--batch_size"));  // bing_bert's file has none
}

TEST(BertOptions, MissingFileNamed) {
  BertFlags f;
  EXPECT_THROW(load_bert_config(f, 128, 128), Error);
  f.config = "/nonexistent/bert.json";
  try {
    load_bert_config(f, 128, 128);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_HAS(e.what(), "--bert_config: cannot read /nonexistent/bert.json");
  }
}

}  // namespace
}  // namespace cutrain::train
