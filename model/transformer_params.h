// @brief The parameter table of the BF16 example's SimpleTransformerModel: PyTorch state_dict
// names and shapes, offsets into one flat buffer (64-element aligned), and PyTorch's default init.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cutrain::model {

struct ModelDims {
  int hidden = 1024;
  int layers = 12;
  int heads = 16;
  int vocab = 50000;
  int max_seq = 512;  // rows of pos_embedding (the BF16 example uses max_seq_len = seq_length)
  // --pad_vocab: rows of the token embedding and the output projection (0: = vocab). Rows past
  // `vocab` are never a token, get no loss and no gradient: their logits never win.
  int padded_vocab = 0;
  int vocab_rows() const { return padded_vocab > vocab ? padded_vocab : vocab; }
  int head_dim() const { return hidden / heads; }
  int ffn() const { return 4 * hidden; }
  // Throws cutrain::Error naming the bad field (heads must divide hidden, all positive).
  void validate() const;
};

// Init rule of one tensor (PyTorch's defaults for the module that owns it).
enum class InitKind { Normal01, Uniform, Zeros, Ones };

struct ParamTensor {
  std::string name;                 // PyTorch state_dict name
  std::vector<std::int64_t> shape;  // PyTorch shape ([out, in] for Linear weights)
  std::size_t offset = 0;           // element offset into the flat buffer (multiple of kAlign)
  std::size_t count = 0;            // product of shape
  InitKind init = InitKind::Zeros;
  double bound = 0;                 // Uniform: U(-bound, bound)
};

// A contiguous run of whole tensors the model uses together: the embedding tables, one block,
// or the head (output projection). ZeRO stage 3 gathers parameters unit by unit.
struct ParamUnit {
  std::size_t begin = 0, end = 0;  // flat element range [begin, end), padding between tensors included
  int first = 0, last = 0;         // tensor indices [first, last)
};

// Tensor indices of one block, in PyTorch's order.
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
  int output_w() const { return output_w_; }
  int output_b() const { return output_b_; }
  // Units in flat-buffer order: embedding_unit() (token + position tables), layer_unit(l) for
  // each block, head_unit() (output projection weight and bias). They tile [0, flat_size()).
  const std::vector<ParamUnit>& units() const { return units_; }
  int embedding_unit() const { return 0; }
  int layer_unit(int l) const { return 1 + l; }
  int head_unit() const { return 1 + dims_.layers; }
  int unit_of(int tensor) const { return unit_of_.at(static_cast<std::size_t>(tensor)); }

  // PyTorch default init into `flat` (flat_size() floats; padding set to 0), seeded: same seed,
  // same values. nn.Embedding N(0,1); nn.Linear U(±1/sqrt(in)) weight and bias; MHA in_proj
  // xavier_uniform, its biases 0; LayerNorm 1/0.
  void init(float* flat, std::uint64_t seed) const;
  void init_tensor(float* flat, std::uint64_t seed, std::size_t index) const;  // one tensor of init()

 private:
  int add(std::string name, std::vector<std::int64_t> shape, InitKind init, double bound);
  ModelDims dims_;
  std::vector<ParamTensor> tensors_;
  std::vector<LayerIndex> layers_;
  std::vector<ParamUnit> units_;
  std::vector<int> unit_of_;  // per tensor
  int output_w_ = -1, output_b_ = -1;
  std::size_t num_params_ = 0, flat_size_ = 0;
};

}  // namespace cutrain::model
