// @brief BERT's encoder (Arch::Bert) as DeepSpeed's Transformer Kernel configures it: the model-side
// fields of DeepSpeedTransformerConfig (pre_layer_norm, layer_norm_eps, the dropout ratios, the
// init range, stochastic_mode and the three memory flags) and the special tokens BERT's
// masked-LM batches use. The reader of the config files (train/bert_options.*) fills it.
#pragma once

#include <cstdint>

namespace cutrain::model {

struct BertConfig {
  bool pre_layer_norm = true;       // Pre-LN (DeepSpeed's BERT-Large example) or Post-LN (original BERT)
  float layer_norm_eps = 1e-12f;
  float attn_dropout_ratio = 0.1f;  // on the attention probabilities
  float hidden_dropout_ratio = 0.1f;  // on the embeddings' and each sub-layer's output
  double initializer_range = 0.02;  // N(0, range^2) for matrices and embeddings
  // DeepSpeed's adjust_init_range: the output projections of each sub-layer (attention output and
  // FFN output) drawn with range / sqrt(2 * num_hidden_layers).
  bool adjust_init_range = true;
  // DeepSpeed's memory flags (docs/bert.md gives each one's bytes per layer):
  bool normalize_invertible = false;     // LayerNorm backward from its output; its input is not kept
  bool gelu_checkpoint = false;          // the GELU output not kept, recomputed in backward
  bool attn_dropout_checkpoint = false;  // the dropped attention probabilities not kept
  bool stochastic_mode = false;          // DeepSpeed's faster, not bit-reproducible mode
  // Token ids of the masked-LM batches: [MASK] replaces a chosen token, [PAD] fills a sequence to
  // the micro-batch's length (attention never attends to it). Both inside the model's vocabulary.
  std::int32_t mask_id = -1, pad_id = -1;
};

// The dropout sites of a BERT model with `layers` blocks (DropoutKey::layer; docs/bert.md): block
// l's attention probabilities 4l, its attention sub-layer's hidden dropout 4l + 1, its FFN's
// 4l + 2, the embeddings' 4·layers. Micro-batch `micro` of a step (gradient accumulation) draws
// its own masks: its sites are shifted by micro·(4·layers + 1), so micro-batch 0 uses the sites
// above as they are.
enum class BertDropoutSite { Attention = 0, AttentionOutput = 1, Output = 2 };
inline std::uint32_t bert_dropout_layer(int layers, int micro, int block, BertDropoutSite site) {
  return std::uint32_t(micro) * std::uint32_t(4 * layers + 1) + std::uint32_t(4 * block + int(site));
}
inline std::uint32_t bert_embedding_dropout_layer(int layers, int micro) {
  return std::uint32_t(micro) * std::uint32_t(4 * layers + 1) + std::uint32_t(4 * layers);
}

}  // namespace cutrain::model
