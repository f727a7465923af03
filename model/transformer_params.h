// @brief The parameter tables of the two architectures: the BF16 example's SimpleTransformerModel
// (PyTorch state_dict names, PyTorch's default init) and GPT-2 as llm.c builds it (pre-LN blocks,
// final LayerNorm, output projection tied to the token embedding, GPT-2's init). Shapes, offsets
// into one flat buffer (64-element aligned) and the parameter units.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cutrain::model {

// Simple: the BF16 example's post-LN model (untied head with bias, exact GELU, attention mask as
// the caller says). Gpt2: pre-LN blocks, final LayerNorm, tied head without bias, tanh GELU,
// always causal.
enum class Arch { Simple, Gpt2 };

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
  int vocab_rows() const { return padded_vocab > vocab ? padded_vocab : vocab; }
  int head_dim() const { return hidden / heads; }
  int ffn() const { return 4 * hidden; }
  // Throws cutrain::Error naming the bad field (heads must divide hidden, all positive).
  void validate() const;
};

// Init rule of one tensor (PyTorch's defaults for the module that owns it).
// Init rule of one tensor. Normal: N(0, bound²) (GPT-2's 0.02, scaled for residual projections).
enum class InitKind { Normal01, Uniform, Zeros, Ones, Normal };

struct ParamTensor {
  std::string name;                 // PyTorch state_dict name
  std::vector<std::int64_t> shape;  // PyTorch shape ([out, in] for Linear weights)
  std::size_t offset = 0;           // element offset into the flat buffer (multiple of kAlign)
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
// (HF's c_attn), out_proj = attn.proj, norm2 = ln_2, ff0 = mlp.fc (c_fc), ff2 = mlp.proj).
struct LayerIndex {
  int in_proj_w, in_proj_b, out_proj_w, out_proj_b, norm1_w, norm1_b, ff0_w, ff0_b, ff2_w, ff2_b, norm2_w, norm2_b;
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
  const LayerIndex& layer(int i) const { return layers_.at(static_cast<std::size_t>(i)); }
  // The head's weight: its own tensor (Simple) or the token embedding (Gpt2, tied). Its bias:
  // -1 for Gpt2 (none). The final LayerNorm: Gpt2 only (-1 for Simple).
  int output_w() const { return output_w_; }
  int output_b() const { return output_b_; }
  bool tied_head() const { return dims_.arch == Arch::Gpt2; }
  int final_norm_w() const { return lnf_w_; }
  int final_norm_b() const { return lnf_b_; }
  // Units in flat-buffer order: embedding_unit() (token + position tables), layer_unit(l) for
  // each block, head_unit() (Simple: output projection weight and bias; Gpt2: the final
  // LayerNorm, the head's weight being in the embedding unit). They tile [0, flat_size()).
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
  // (0.02/sqrt(2·layers))²), biases 0, LayerNorm 1/0.
  void init(float* flat, std::uint64_t seed) const;
  void init_tensor(float* flat, std::uint64_t seed, std::size_t index) const;  // one tensor of init()

 private:
  int add(std::string name, std::vector<std::int64_t> shape, InitKind init, double bound);
  void build_simple();
  void build_gpt2();
  ModelDims dims_;
  std::vector<ParamTensor> tensors_;
  std::vector<LayerIndex> layers_;
  std::vector<ParamUnit> units_;
  std::vector<int> unit_of_;  // per tensor
  std::vector<int> layer_first_, layer_end_;  // per block: its tensor range [first, end)
  int output_w_ = -1, output_b_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  std::size_t num_params_ = 0, flat_size_ = 0;
};

}  // namespace cutrain::model
