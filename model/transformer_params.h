// @brief The parameter tables of the three architectures: the BF16 example's SimpleTransformerModel
// (PyTorch state_dict names, PyTorch's default init), GPT-2 as llm.c builds it (pre-LN blocks,
// final LayerNorm, output projection tied to the token embedding, GPT-2's init) and BERT's encoder
// with its masked-LM head (HF's names, DeepSpeed's init; docs/bert.md). Shapes, offsets into one
// flat buffer (64-element aligned) and the parameter units.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/bert_config.h"
#include "model/moe_config.h"

namespace cutrain::model {

// Simple: the BF16 example's post-LN model (untied head with bias, exact GELU, attention mask as
// the caller says). Gpt2: pre-LN blocks, final LayerNorm, tied head without bias, tanh GELU,
// always causal. Bert: the bidirectional encoder of DeepSpeed's BERT pre-training (BertConfig:
// Pre-LN or Post-LN, dropout, padding masks) with the masked-LM head tied to the word embedding.
enum class Arch { Simple, Gpt2, Bert };

// The MoE blocks of a model (DeepSpeed's MoE in Megatron-DeepSpeed's GPT): the blocks whose FFN is
// a MoE layer, each with its expert count (the pyramid of PR-MoE: more experts in later blocks),
// and the routing options every MoE layer shares. Empty `experts`: a dense model.
struct MoeDims {
  std::vector<int> experts;  // per block: 0 = dense FFN, else that block's num_experts (empty: no MoE)
  int k = 1;
  double capacity_factor = 1.0, eval_capacity_factor = 1.0;
  int min_capacity = 4;
  bool drop_tokens = true;
  bool use_residual = false;  // --mlp_type residual (PR-MoE)
  MoeNoisyGate noisy_gate_policy = MoeNoisyGate::None;
  // Top-1's random token selection over capacity (DeepSpeed's use_rts; --moe_use_rts). Only ever
  // true with k = 1: DeepSpeed's top-2 has none.
  bool use_rts = false;
  double loss_coeff = 0.01;  // the objective is lm + loss_coeff * (sum of the layers' l_aux)
  // The run's expert-parallel degree (DeepSpeed's ep_size: experts split over that many
  // data-parallel ranks); the layer's math and the parameters' names do not depend on it.
  int ep_size = 1;
  bool any() const;
  bool is_moe(int layer) const { return layer < int(experts.size()) && experts[std::size_t(layer)] > 0; }
  // The MoE layer of block `layer` (is_moe(layer)) for a model of this hidden / ffn width.
  MoeConfig layer_config(int layer, int hidden, int ffn) const;
};

struct ModelDims {
  int hidden = 1024;
  int layers = 12;
  int heads = 16;
  int vocab = 50000;
  int max_seq = 512;  // rows of pos_embedding (the BF16 example uses max_seq_len = seq_length)
  // --pad_vocab: rows of the token embedding and the output projection (0: = vocab). Rows past
  // `vocab` are never a token, get no loss and no gradient: their logits never win.
  int padded_vocab = 0;
  Arch arch = Arch::Simple;
  MoeDims moe = {};
  int intermediate = 0;  // the FFN's width (0: 4 x hidden)
  BertConfig bert = {};  // Arch::Bert only
  int vocab_rows() const { return padded_vocab > vocab ? padded_vocab : vocab; }
  int head_dim() const { return hidden / heads; }
  int ffn() const { return intermediate > 0 ? intermediate : 4 * hidden; }
  // Throws cutrain::Error naming the bad field (heads must divide hidden, all positive; the MoE
  // blocks' entries one per block, each MoE layer's configuration valid; BERT: its config's
  // ratios, eps and range, its special tokens inside the vocabulary, no MoE blocks).
  void validate() const;
};

// Init rule of one tensor (PyTorch's defaults for the module that owns it).
// Init rule of one tensor. Normal: N(0, bound²) (GPT-2's 0.02, scaled for residual projections).
enum class InitKind { Normal01, Uniform, Zeros, Ones, Normal };

struct ParamTensor {
  std::string name;                 // PyTorch state_dict name
  std::vector<std::int64_t> shape;  // PyTorch shape ([out, in] for Linear weights)
  // Element offset into the flat buffer: a multiple of kAlign, except for the tensors of a MoE
  // layer after its gate, which follow each other without padding at moe_param_layout's offsets
  // (the MoE layer reads them as one buffer; aligned too when hidden is a multiple of 64).
  std::size_t offset = 0;
  std::size_t count = 0;            // product of shape
  InitKind init = InitKind::Zeros;
  double bound = 0;                 // Uniform: U(-bound, bound); Normal: the standard deviation
  // Whether optimizer.params.weight_decay applies: every tensor of the seed model (the BF16
  // example's AdamW over model.parameters()); GPT-2's matrices and embeddings only (llm.c's rule:
  // no decay for biases and LayerNorm).
  bool decay = true;
};

// A flat range whose tensors share the decay flag (runs tile [0, flat_size()), padding included).
struct DecayRun {
  std::size_t begin = 0, end = 0;
  bool decay = true;
};

// A contiguous run of whole tensors the model uses together: the embedding tables, one block,
// or the head (output projection). ZeRO stage 3 gathers parameters unit by unit.
struct ParamUnit {
  std::size_t begin = 0, end = 0;  // flat element range [begin, end), padding between tensors included
  int first = 0, last = 0;         // tensor indices [first, last)
};

// Tensor indices of one block (Simple: in PyTorch's order; Gpt2: norm1 = ln_1, in_proj = attn.qkv
// (HF's c_attn), out_proj = attn.proj, norm2 = ln_2, ff0 = mlp.fc (c_fc), ff2 = mlp.proj; Bert:
// in_proj = attention.self.qkv, out_proj = attention.output.dense, norm1 =
// attention.output.LayerNorm, ff0 = intermediate.dense, ff2 = output.dense, norm2 = output.LayerNorm).
// A MoE block (MoeDims::is_moe) has no ff0/ff2 tensors (-1): `moe` is its gate's weight, the first
// tensor of the MoE layer's parameters (moe_param_layout from its offset); -1 in a dense block.
struct LayerIndex {
  int in_proj_w, in_proj_b, out_proj_w, out_proj_b, norm1_w, norm1_b, ff0_w, ff0_b, ff2_w, ff2_b, norm2_w, norm2_b;
  int moe = -1;
};

class TransformerParams {
 public:
  static constexpr std::size_t kAlign = 64;  // elements: 128 B in bf16, 256 B in fp32

  explicit TransformerParams(const ModelDims& dims);

  const ModelDims& dims() const { return dims_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const ParamTensor& tensor(int i) const { return tensors_.at(static_cast<std::size_t>(i)); }
  const ParamTensor& find(const std::string& name) const;  // throws naming the unknown name
  std::size_t num_params() const { return num_params_; }   // real parameters (PyTorch's count)
  std::size_t flat_size() const { return flat_size_; }     // elements of the flat buffer (with padding)

  int embedding() const { return 0; }
  int pos_embedding() const { return 1; }
  // Bert only (-1 otherwise): the embeddings' LayerNorm (in the embedding unit), the masked-LM
  // head's transform (dense + GELU + LayerNorm, in the head unit).
  int embedding_norm_w() const { return emb_ln_w_; }
  int embedding_norm_b() const { return emb_ln_b_; }
  int head_dense_w() const { return head_dense_w_; }
  int head_dense_b() const { return head_dense_b_; }
  int head_norm_w() const { return head_ln_w_; }
  int head_norm_b() const { return head_ln_b_; }
  const LayerIndex& layer(int i) const { return layers_.at(static_cast<std::size_t>(i)); }
  // The head's weight: its own tensor (Simple) or the token embedding (Gpt2, Bert: tied). Its bias:
  // -1 for Gpt2 (none), Bert's cls.predictions.bias. The final LayerNorm: Gpt2 and Pre-LN Bert
  // (-1 otherwise).
  int output_w() const { return output_w_; }
  int output_b() const { return output_b_; }
  bool tied_head() const { return dims_.arch != Arch::Simple; }
  int final_norm_w() const { return lnf_w_; }
  int final_norm_b() const { return lnf_b_; }
  // Units in flat-buffer order: embedding_unit() (token + position tables; Bert: and their
  // LayerNorm), layer_unit(l) for each block, head_unit() (Simple: output projection weight and
  // bias; Gpt2: the final LayerNorm, the head's weight being in the embedding unit; Bert: the
  // final LayerNorm (Pre-LN), the head's transform and bias). They tile [0, flat_size()).
  const std::vector<ParamUnit>& units() const { return units_; }
  // Adjacent tensors with the same decay flag merged: one run for the seed model; for GPT-2
  // [wte, wpe, block 0's matrices], [block 0's vectors], [block 1's matrices], ... [the last
  // block's vectors, ln_f]: two runs per block (its matrices come first).
  std::vector<DecayRun> decay_runs() const;
  int embedding_unit() const { return 0; }
  int layer_unit(int l) const { return 1 + l; }
  int head_unit() const { return 1 + dims_.layers; }
  int unit_of(int tensor) const { return unit_of_.at(static_cast<std::size_t>(tensor)); }

  // Init into `flat` (flat_size() floats; padding set to 0), seeded: same seed, same values.
  // Simple, PyTorch's defaults: nn.Embedding N(0,1); nn.Linear U(±1/sqrt(in)) weight and bias;
  // MHA in_proj xavier_uniform, its biases 0; LayerNorm 1/0. Gpt2, llm.c's: every matrix and
  // both embeddings N(0, 0.02²), the residual projections (attn and mlp c_proj) N(0,
  // (0.02/sqrt(2·layers))²), biases 0, LayerNorm 1/0. Bert, DeepSpeed's: the same rule with
  // initializer_range, the output projections scaled only when adjust_init_range.
  void init(float* flat, std::uint64_t seed) const;
  void init_tensor(float* flat, std::uint64_t seed, std::size_t index) const;  // one tensor of init()

 private:
  // `pad`: the next tensor starts at the next kAlign multiple (false inside a MoE layer's block).
  int add(std::string name, std::vector<std::int64_t> shape, InitKind init, double bound, bool pad = true);
  // Block `layer`'s MoE layer under `prefix` (DeepSpeed's state_dict names), its tensors packed at
  // moe_param_layout's offsets; `gpt2`: GPT-2's init and decay rules. Returns the gate's index.
  int add_moe(const std::string& prefix, int layer, bool gpt2);
  void build_simple();
  void build_gpt2();
  void build_bert();
  ModelDims dims_;
  std::vector<ParamTensor> tensors_;
  std::vector<LayerIndex> layers_;
  std::vector<ParamUnit> units_;
  std::vector<int> unit_of_;  // per tensor
  std::vector<int> layer_first_, layer_end_;  // per block: its tensor range [first, end)
  int output_w_ = -1, output_b_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  int emb_ln_w_ = -1, emb_ln_b_ = -1, head_dense_w_ = -1, head_dense_b_ = -1, head_ln_w_ = -1, head_ln_b_ = -1;
  int embedding_end_ = 2;  // tensors [0, embedding_end_) form the embedding unit
  std::size_t num_params_ = 0, flat_size_ = 0;
};

}  // namespace cutrain::model
