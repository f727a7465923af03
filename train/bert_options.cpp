#include "train/bert_options.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "runtime/file_util.h"
#include "runtime/json_util.h"
#include "train/config.h"
#include "train/config_reader.h"

namespace cutrain::train {
namespace {

using config_detail::json;
using config_detail::Reader;

constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();

// bing_bert's top-level keys beside the model's, and why none of them changes a cutrain run.
struct Ignored {
  std::string_view key, why;
};
constexpr Ignored kBingIgnored[] = {
    {"name", "a label of the run"},
    {"bert_token_file", "the tokens are GPT-2's, from the token shards (--data)"},
    {"bert_model_file", "the model starts from its initializer; no pretrained BERT weights are loaded"},
    {"data", "the data are llm.c token shards (--data, --eval_data) or synthetic"},
    {"mixed_precision", "the precision comes from the DeepSpeed config (bf16.enabled)"},
    {"training", "the schedule, steps and learning rate come from the DeepSpeed config and the flags"},
    {"validation", "validation data are --eval_data"},
};

const std::vector<std::string_view> kBingModelKeys = {
    "vocab_size_or_config_json_file", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
    "max_position_embeddings", "type_vocab_size", "initializer_range"};

const std::vector<std::string_view> kTransformerKeys = {
    "batch_size", "hidden_size", "intermediate_size", "heads", "attn_dropout_ratio", "hidden_dropout_ratio",
    "num_hidden_layers", "initializer_range", "layer_norm_eps", "local_rank", "seed", "fp16", "pre_layer_norm",
    "normalize_invertible", "gelu_checkpoint", "adjust_init_range", "attn_dropout_checkpoint", "stochastic_mode",
    "return_tuple", "training"};

std::string not_acted(std::string_view why) { return detail::concat("read but not acted on (", why, ")"); }

// Field reads (the config reader's `read` is tied to the DeepSpeed key table; these files have their
// own keys): leave `out` untouched when `key` is absent.
void get(const Reader& r, const json& obj, const std::string& path, std::string_view key, int& out, std::int64_t lo,
         std::int64_t hi) {
  if (const json* v = Reader::find(obj, key)) out = int(r.as_int(*v, config_detail::join_path(path, key), lo, hi));
}
void get(const Reader& r, const json& obj, const std::string& path, std::string_view key, float& out, double lo,
         double hi, bool lo_open, bool hi_open) {
  if (const json* v = Reader::find(obj, key))
    out = float(r.as_number(*v, config_detail::join_path(path, key), lo, hi, lo_open, hi_open));
}
void get(const Reader& r, const json& obj, const std::string& path, std::string_view key, bool& out) {
  if (const json* v = Reader::find(obj, key)) out = r.as_bool(*v, config_detail::join_path(path, key));
}

// A ratio in [0, 1): dropout keeps some of every tensor.
float read_ratio(Reader& r, const json& obj, const std::string& path, std::string_view key, float fallback) {
  float v = fallback;
  get(r, obj, path, key, v, 0.0, 1.0, false, true);
  return v;
}

// Hugging Face BertConfig's keys under bert_model_config (its defaults for keys left out).
void parse_bing(Reader& r, const json& root, BertSetup& s, int& positions) {
  for (const Ignored& ig : kBingIgnored)
    if (Reader::find(root, ig.key)) r.warn(std::string(ig.key), not_acted(ig.why));
  const std::string path = "bert_model_config";
  const json& m = root.at(path);
  r.check_object(m, path, kBingModelKeys, /*unknown_is_error=*/true);
  model::ModelDims& d = s.dims;
  model::BertConfig& b = d.bert;
  d.hidden = 768, d.layers = 12, d.heads = 12, d.intermediate = 3072;
  get(r, m, path, "hidden_size", d.hidden, 1, kMaxInt);
  get(r, m, path, "num_hidden_layers", d.layers, 1, kMaxInt);
  get(r, m, path, "num_attention_heads", d.heads, 1, kMaxInt);
  get(r, m, path, "intermediate_size", d.intermediate, 1, kMaxInt);
  if (const json* v = Reader::find(m, "hidden_act"); v && r.as_string(*v, path + ".hidden_act") != "gelu")
    r.fail_expected(path + ".hidden_act", "\"gelu\" (the only activation the BERT layer has)", *v);
  b.hidden_dropout_ratio = read_ratio(r, m, path, "hidden_dropout_prob", 0.1f);
  b.attn_dropout_ratio = read_ratio(r, m, path, "attention_probs_dropout_prob", 0.1f);
  positions = 512;
  get(r, m, path, "max_position_embeddings", positions, 1, kMaxInt);
  int type_vocab = 2;
  get(r, m, path, "type_vocab_size", type_vocab, 1, kMaxInt);
  if (type_vocab > 1)
    r.warn(path + ".type_vocab_size",
           not_acted(detail::concat(type_vocab, " segment types; every sample is one segment (no sentence pairs), so "
                                                "no token-type embedding is built")));
  if (const json* v = Reader::find(m, "initializer_range"))
    b.initializer_range = r.as_number(*v, path + ".initializer_range", 0.0, 1.0, true, false);
  for (const char* key : {"vocab_size_or_config_json_file", "vocab_size"}) {
    const json* v = Reader::find(m, key);
    if (!v) continue;
    const std::string p = path + "." + key;
    if (v->is_string() && std::string_view(key) == "vocab_size_or_config_json_file") {
      r.warn(p, not_acted("a vocabulary file; the vocabulary is GPT-2's"));
      continue;
    }
    const std::int64_t n = r.as_int(*v, p, 1, kMaxInt);
    if (n != kBertVocab)
      r.warn(p, not_acted(detail::concat(n, " tokens; the vocabulary is GPT-2's ", kBertRealTokens,
                                         " tokens + [MASK] + [PAD] = ", kBertVocab)));
  }
  // bing_bert's Pre-LN model (nvidia/modelingpreln.py) with DeepSpeed's layer defaults.
  b.pre_layer_norm = true;
  b.adjust_init_range = true;
}

// DeepSpeedTransformerConfig's fields (DeepSpeed's -1 stands for "not set" where it has a use).
void parse_transformer(Reader& r, const json& root, BertSetup& s, std::uint64_t& ds_seed_out, bool& has_seed) {
  r.check_object(root, "", kTransformerKeys, /*unknown_is_error=*/true);
  model::ModelDims& d = s.dims;
  model::BertConfig& b = d.bert;
  auto required_int = [&](const char* key, int& out) {
    const json* v = Reader::find(root, key);
    if (!v) r.fail_missing(key, "a positive integer", "DeepSpeedTransformerConfig has no usable default (-1)");
    out = int(r.as_int(*v, key, 1, kMaxInt));
  };
  required_int("hidden_size", d.hidden);
  required_int("heads", d.heads);
  required_int("num_hidden_layers", d.layers);
  // -1 (DeepSpeed's default): 4 x hidden_size, as DeepSpeed sets it.
  d.intermediate = 4 * d.hidden;
  if (const json* v = Reader::find(root, "intermediate_size"); v && !(v->is_number_integer() && *v == -1))
    d.intermediate = int(r.as_int(*v, "intermediate_size", 1, kMaxInt));
  for (const char* key : {"attn_dropout_ratio", "hidden_dropout_ratio", "initializer_range"})
    if (!Reader::find(root, key))
      r.fail_missing(key, "a number", "DeepSpeedTransformerConfig has no usable default (-1)");
  b.attn_dropout_ratio = read_ratio(r, root, "", "attn_dropout_ratio", 0.f);
  b.hidden_dropout_ratio = read_ratio(r, root, "", "hidden_dropout_ratio", 0.f);
  b.initializer_range = r.as_number(root.at("initializer_range"), "initializer_range", 0.0, 1.0, true, false);
  get(r, root, "", "layer_norm_eps", b.layer_norm_eps, 0.0, 1.0, true, false);
  get(r, root, "", "pre_layer_norm", b.pre_layer_norm);
  get(r, root, "", "adjust_init_range", b.adjust_init_range);
  get(r, root, "", "normalize_invertible", b.normalize_invertible);
  get(r, root, "", "gelu_checkpoint", b.gelu_checkpoint);
  get(r, root, "", "attn_dropout_checkpoint", b.attn_dropout_checkpoint);
  get(r, root, "", "stochastic_mode", b.stochastic_mode);
  if (const json* v = Reader::find(root, "batch_size"); v && !(v->is_number_integer() && *v == -1))
    s.batch_size = int(r.as_int(*v, "batch_size", 1, kMaxInt));
  if (const json* v = Reader::find(root, "seed"); v && !(v->is_number_integer() && *v == -1)) {
    ds_seed_out = std::uint64_t(r.as_int(*v, "seed", 0, std::numeric_limits<std::int64_t>::max()));
    has_seed = true;
  }
  get(r, root, "", "fp16", s.fp16);  // true selects fp16 training (train_loop.cpp)
  bool training = true;
  get(r, root, "", "training", training);
  if (!training)
    r.fail("training", "expected true (cutrain train trains the layers; DeepSpeed's training: false is the "
                       "inference mode), found false");
  if (const json* v = Reader::find(root, "return_tuple"); v && r.as_bool(*v, "return_tuple"))
    r.warn("return_tuple", not_acted("no Python module returns the layer's output"));
  if (const json* v = Reader::find(root, "local_rank"); v && !(v->is_number_integer() && *v == -1)) {
    r.as_int(*v, "local_rank", 0, kMaxInt);
    r.warn("local_rank", not_acted("the launcher's LOCAL_RANK / --local_rank picks the GPU"));
  }
}

}  // namespace

const char* name(BertConfigFormat f) {
  return f == BertConfigFormat::BingBert ? "bing_bert's bert_model_config" : "DeepSpeedTransformerConfig";
}

BertSetup parse_bert_config(const std::string& json_text, const std::string& origin, const BertFlags& flags,
                            int default_seq_len, int pad_vocab_multiple) {
  json root;
  try {
    root = parse_json_strict(json_text, origin);
  } catch (const JsonSyntaxError& e) {
    throw ConfigError(e.message(), __FILE__, __LINE__);
  }
  BertSetup s;
  s.origin = origin;
  Reader r(origin, /*strict=*/true, &s.notes);
  if (!root.is_object()) r.fail_expected("(top level)", "an object", root);
  s.dims.arch = model::Arch::Bert;
  int positions = 0;  // rows of the position table (bing_bert: max_position_embeddings; else S)
  std::uint64_t ds_seed = 0;
  bool has_seed = false;
  if (Reader::find(root, "bert_model_config")) {
    s.format = BertConfigFormat::BingBert;
    std::vector<std::string_view> top = {"bert_model_config"};
    for (const Ignored& ig : kBingIgnored) top.push_back(ig.key);
    r.check_object(root, "", top, /*unknown_is_error=*/true);
    parse_bing(r, root, s, positions);
  } else {
    s.format = BertConfigFormat::TransformerConfig;
    parse_transformer(r, root, s, ds_seed, has_seed);
  }
  if (has_seed) s.seed = ds_seed;
  model::ModelDims& d = s.dims;
  const std::string heads_key = s.format == BertConfigFormat::BingBert ? "bert_model_config.num_attention_heads" : "heads";
  const std::string hidden_key = s.format == BertConfigFormat::BingBert ? "bert_model_config.hidden_size" : "hidden_size";
  if (d.hidden % d.heads != 0)
    r.fail(heads_key, detail::concat("expected a divisor of ", hidden_key, " ", d.hidden, " (each head takes hidden / heads "
                                     "channels), found ", d.heads));

  // bing_bert's flags over the file.
  model::BertConfig& b = d.bert;
  b.stochastic_mode = b.stochastic_mode || flags.stochastic_mode;
  b.normalize_invertible = b.normalize_invertible || flags.normalize_invertible;
  b.gelu_checkpoint = b.gelu_checkpoint || flags.gelu_checkpoint;
  b.attn_dropout_checkpoint = b.attn_dropout_checkpoint || flags.attention_dropout_checkpoint;
  if (flags.deepspeed_transformer_kernel)
    s.notes.push_back("--deepspeed_transformer_kernel: accepted; cutrain's BERT layer is always its fused kernel");
  s.seq_len = flags.max_seq_length.value_or(default_seq_len);
  CUTRAIN_CHECK(s.seq_len >= 1, "train: --max_seq_length: expected a sequence length >= 1, found ", s.seq_len);
  if (positions == 0) positions = s.seq_len;
  if (s.seq_len > positions)
    r.fail("bert_model_config.max_position_embeddings",
           detail::concat("expected at least the sequence length ", s.seq_len, " (",
                          flags.max_seq_length ? "--max_seq_length" : "--seq_length", "), found ", positions));
  d.max_seq = positions;
  s.max_predictions = flags.max_predictions_per_seq.value_or(std::max(1, (15 * s.seq_len + 99) / 100));
  CUTRAIN_CHECK(s.max_predictions >= 1 && s.max_predictions <= s.seq_len,
                "train: --max_predictions_per_seq: expected 1..", s.seq_len, " (the sequence length), found ",
                s.max_predictions);
  d.vocab = kBertVocab;
  d.padded_vocab = pad_vocab_multiple > 0 ? (kBertVocab + pad_vocab_multiple - 1) / pad_vocab_multiple * pad_vocab_multiple : 0;
  if (d.padded_vocab <= d.vocab) d.padded_vocab = 0;
  b.mask_id = kBertMaskId;
  b.pad_id = kBertPadId;
  return s;
}

BertSetup load_bert_config(const BertFlags& flags, int default_seq_len, int pad_vocab_multiple) {
  CUTRAIN_CHECK(!flags.config.empty(), "train: --model bert needs --bert_config FILE (bing_bert's config with a "
                                       "bert_model_config object, or DeepSpeedTransformerConfig's fields as JSON)");
  std::string text;
  try {
    text = read_text_file(flags.config);
  } catch (const Error& e) {
    throw ConfigError(detail::concat("--bert_config: cannot read ", flags.config.string(), ": ", e.message()), __FILE__,
                      __LINE__);
  }
  return parse_bert_config(text, flags.config.string(), flags, default_seq_len, pad_vocab_multiple);
}

void check_bert_batch(const BertSetup& s, int micro_batch, const std::string& micro_source) {
  if (!s.batch_size || *s.batch_size == micro_batch) return;
  throw ConfigError(detail::concat(s.origin, ": batch_size: expected the run's micro-batch ", micro_batch, " (",
                                   micro_source, "), found ", *s.batch_size),
                    __FILE__, __LINE__);
}

std::string describe_bert(const BertSetup& s) {
  const model::ModelDims& d = s.dims;
  const model::BertConfig& b = d.bert;
  std::ostringstream os;
  os << "BERT (" << (b.pre_layer_norm ? "Pre-LN" : "Post-LN") << ", " << d.layers << " layers, hidden " << d.hidden
     << ", " << d.heads << " heads, intermediate " << d.ffn() << ", dropout attention " << b.attn_dropout_ratio
     << " hidden " << b.hidden_dropout_ratio << ", layer_norm_eps " << b.layer_norm_eps << ", init range "
     << b.initializer_range << (b.adjust_init_range ? " (adjusted for the output projections)" : "") << ", "
     << d.max_seq << " positions, vocabulary " << d.vocab << " = " << kBertRealTokens << " GPT-2 tokens + [MASK] "
     << b.mask_id << " + [PAD] " << b.pad_id;
  if (d.padded_vocab > d.vocab) os << " in " << d.padded_vocab << " rows";
  os << "; seq " << s.seq_len << ", max_predictions_per_seq " << s.max_predictions;
  const char* sep = "; memory flags: ";
  for (auto [on, flag] : {std::pair{b.normalize_invertible, "normalize_invertible"},
                          std::pair{b.gelu_checkpoint, "gelu_checkpoint"},
                          std::pair{b.attn_dropout_checkpoint, "attn_dropout_checkpoint"},
                          std::pair{b.stochastic_mode, "stochastic_mode"}})
    if (on) {
      os << sep << flag;
      sep = ", ";
    }
  os << "; from " << name(s.format) << " " << s.origin << ")";
  return os.str();
}

int bert_padded_length(int longest, int bucket, int max_pred, int S) {
  CUTRAIN_CHECK(bucket > 0 && S > 0 && longest >= 0 && longest <= S && max_pred >= 0,
                "bert padding: expected 0 <= longest <= S and a positive bucket, found longest ", longest, ", S ", S,
                ", bucket ", bucket);
  const int want = std::max({longest, max_pred, 1});
  const long rounded = (long(want) + bucket - 1) / bucket * long(bucket);
  return int(std::min<long>(rounded, S));
}

}  // namespace cutrain::train
