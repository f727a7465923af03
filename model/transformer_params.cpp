#include "model/transformer_params.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include <cmath>
#include <string>
#include <random>

#include "runtime/error.h"

namespace cutrain::model {

void ModelDims::validate() const {
  CUTRAIN_CHECK(hidden > 0, "model: hidden_dim must be positive, got ", hidden);
  CUTRAIN_CHECK(layers >= 0, "model: num_layers must be >= 0, got ", layers);
  CUTRAIN_CHECK(heads > 0, "model: num_heads must be positive, got ", heads);
  CUTRAIN_CHECK(hidden % heads == 0, "model: num_heads must divide hidden_dim (hidden_dim ", hidden, " / num_heads ",
                heads, " leaves remainder ", hidden % heads, ")");
  CUTRAIN_CHECK(vocab > 0, "model: vocab_size must be positive, got ", vocab);
  CUTRAIN_CHECK(padded_vocab == 0 || padded_vocab >= vocab, "model: the padded vocabulary (", padded_vocab,
                ") must be 0 (no padding) or at least vocab_size (", vocab, ")");
  CUTRAIN_CHECK(max_seq > 0, "model: seq_length must be positive, got ", max_seq);
  CUTRAIN_CHECK(intermediate >= 0, "model: intermediate_size must be >= 0 (0: 4 x hidden_dim), got ", intermediate);
  if (arch == Arch::Bert) {
    const BertConfig& b = bert;
    CUTRAIN_CHECK(!moe.any(), "model: MoE blocks are not implemented for the bert architecture");
    CUTRAIN_CHECK(std::isfinite(b.layer_norm_eps) && b.layer_norm_eps > 0, "model: bert layer_norm_eps must be > 0, got ",
                  b.layer_norm_eps);
    CUTRAIN_CHECK(b.attn_dropout_ratio >= 0 && b.attn_dropout_ratio < 1, "model: bert attn_dropout_ratio must lie in [0, 1), got ",
                  b.attn_dropout_ratio);
    CUTRAIN_CHECK(b.hidden_dropout_ratio >= 0 && b.hidden_dropout_ratio < 1,
                  "model: bert hidden_dropout_ratio must lie in [0, 1), got ", b.hidden_dropout_ratio);
    CUTRAIN_CHECK(std::isfinite(b.initializer_range) && b.initializer_range > 0,
                  "model: bert initializer_range must be > 0, got ", b.initializer_range);
    CUTRAIN_CHECK(b.mask_id >= -1 && b.mask_id < vocab, "model: bert mask_id must be -1 (none) or a token in [0, ", vocab,
                  "), got ", b.mask_id);
    CUTRAIN_CHECK(b.pad_id >= -1 && b.pad_id < vocab, "model: bert pad_id must be -1 (none) or a token in [0, ", vocab,
                  "), got ", b.pad_id);
  }
  if (moe.experts.empty()) return;
  CUTRAIN_CHECK(int(moe.experts.size()) == layers, "model: the MoE blocks list ", moe.experts.size(),
                " entries (num_experts per block), the model has num_layers = ", layers);
  for (int l = 0; l < layers; ++l) {
    CUTRAIN_CHECK(moe.experts[std::size_t(l)] >= 0, "model: block ", l, "'s num_experts must be >= 0, got ",
                  moe.experts[std::size_t(l)]);
    if (moe.is_moe(l)) model::validate(moe.layer_config(l, hidden, ffn()), 0, "model: block " + std::to_string(l) + "'s MoE layer");
  }
  CUTRAIN_CHECK(std::isfinite(moe.loss_coeff) && moe.loss_coeff >= 0, "model: moe_loss_coeff must be a finite number >= 0, got ",
                moe.loss_coeff);
}

bool MoeDims::any() const {
  for (int e : experts)
    if (e > 0) return true;
  return false;
}

MoeConfig MoeDims::layer_config(int layer, int hidden, int ffn) const {
  MoeConfig c;
  c.hidden = hidden;
  c.ffn = ffn;
  c.experts = experts.at(std::size_t(layer));
  c.k = k;
  c.capacity_factor = capacity_factor;
  c.eval_capacity_factor = eval_capacity_factor;
  c.min_capacity = min_capacity;
  c.drop_tokens = drop_tokens;
  c.use_residual = use_residual;
  c.noisy_gate_policy = noisy_gate_policy;
  c.use_rts = use_rts;
  return c;
}

int TransformerParams::add(std::string name, std::vector<std::int64_t> shape, InitKind init, double bound, bool pad) {
  ParamTensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.count = 1;
  for (auto d : t.shape) t.count *= static_cast<std::size_t>(d);
  t.offset = flat_size_;
  t.init = init;
  t.bound = bound;
  num_params_ += t.count;
  flat_size_ += t.count;
  if (pad) flat_size_ = (flat_size_ + kAlign - 1) / kAlign * kAlign;
  tensors_.push_back(std::move(t));
  return static_cast<int>(tensors_.size()) - 1;
}

// DeepSpeed's MoE module names: deepspeed_moe.gate.wg (TopKGate's bias-free Linear),
// deepspeed_moe.experts.deepspeed_experts.<e>.<expert's own names> (bias-free fc1 / fc2 here),
// and with use_residual the dense mlp.<...> and coefficient (Linear(H, 2)). The order is
// moe_param_layout's: every expert's fc1, then every expert's fc2.
int TransformerParams::add_moe(const std::string& p, int layer, bool gpt2) {
  const MoeConfig c = dims_.moe.layer_config(layer, dims_.hidden, dims_.ffn());
  const std::int64_t H = c.hidden, F = c.ffn, E = c.experts;
  constexpr double kStd = 0.02;
  const double res_std = kStd / std::sqrt(2.0 * std::max(dims_.layers, 1));
  const double lin_h = 1.0 / std::sqrt(double(H)), lin_f = 1.0 / std::sqrt(double(F));
  // Simple: nn.Linear's default U(+-1/sqrt(in)); GPT-2: N(0, 0.02^2), the output projections scaled.
  auto in_w = [&](const std::string& n, std::vector<std::int64_t> shape) {
    return gpt2 ? add(n, std::move(shape), InitKind::Normal, kStd, false)
                : add(n, std::move(shape), InitKind::Uniform, lin_h, false);
  };
  auto out_w = [&](const std::string& n, std::vector<std::int64_t> shape) {
    return gpt2 ? add(n, std::move(shape), InitKind::Normal, res_std, false)
                : add(n, std::move(shape), InitKind::Uniform, lin_f, false);
  };
  const std::string m = p + "deepspeed_moe.";
  const int wg = in_w(m + "gate.wg.weight", {E, H});
  const std::string ex = m + "experts.deepspeed_experts.";
  for (std::int64_t e = 0; e < E; ++e) in_w(ex + std::to_string(e) + ".fc1.weight", {F, H});
  for (std::int64_t e = 0; e < E; ++e) out_w(ex + std::to_string(e) + ".fc2.weight", {H, F});
  if (c.use_residual) {
    in_w(p + "mlp.fc1.weight", {F, H});
    out_w(p + "mlp.fc2.weight", {H, F});
    in_w(p + "coefficient.weight", {2, H});
    const int cb = gpt2 ? add(p + "coefficient.bias", {2}, InitKind::Zeros, 0, false)
                        : add(p + "coefficient.bias", {2}, InitKind::Uniform, lin_h, false);
    tensors_[std::size_t(cb)].decay = !gpt2;  // GPT-2: no decay for biases
  }
  flat_size_ = (flat_size_ + kAlign - 1) / kAlign * kAlign;
  // The layer reads one buffer: the table's offsets are moe_param_layout's.
  const MoeParamLayout L = moe_param_layout(c);
  CUTRAIN_CHECK(flat_size_ - tensors_[std::size_t(wg)].offset >= L.total, "model: MoE layer table of block ", layer,
                " does not hold its layout");
  return wg;
}

TransformerParams::TransformerParams(const ModelDims& dims) : dims_(dims) {
  dims_.validate();
  if (dims_.arch == Arch::Gpt2) build_gpt2();
  else if (dims_.arch == Arch::Bert) build_bert();
  else build_simple();
  // Units: [embedding, pos_embedding], each block's 12 tensors, the head's tensors.
  auto unit = [&](int first, int last) {
    for (int t = first; t < last; ++t) unit_of_.push_back(static_cast<int>(units_.size()));
    const std::size_t end = last < static_cast<int>(tensors_.size()) ? tensors_[std::size_t(last)].offset : flat_size_;
    units_.push_back({tensors_[std::size_t(first)].offset, end, first, last});
  };
  unit(0, embedding_end_);
  for (int i = 0; i < dims_.layers; ++i) unit(layer_first_[std::size_t(i)], layer_end_[std::size_t(i)]);
  unit(layers_.empty() ? embedding_end_ : layer_end_.back(), static_cast<int>(tensors_.size()));
}

void TransformerParams::build_simple() {
  const ModelDims& dims = dims_;
  const std::int64_t h = dims.hidden, f = dims.ffn(), V = dims.vocab_rows(), S = dims.max_seq;
  const double lin_h = 1.0 / std::sqrt(double(h));  // kaiming_uniform(a=sqrt(5)) bound for fan_in h
  const double lin_f = 1.0 / std::sqrt(double(f));
  add("embedding.weight", {V, h}, InitKind::Normal01, 0);
  add("pos_embedding.weight", {S, h}, InitKind::Normal01, 0);
  for (int i = 0; i < dims.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerIndex L{};
    // xavier_uniform on [3h, h]: sqrt(6 / (fan_in + fan_out)).
    L.in_proj_w = add(p + "attention.in_proj_weight", {3 * h, h}, InitKind::Uniform, std::sqrt(6.0 / double(h + 3 * h)));
    layer_first_.push_back(L.in_proj_w);
    L.in_proj_b = add(p + "attention.in_proj_bias", {3 * h}, InitKind::Zeros, 0);
    L.out_proj_w = add(p + "attention.out_proj.weight", {h, h}, InitKind::Uniform, lin_h);
    L.out_proj_b = add(p + "attention.out_proj.bias", {h}, InitKind::Zeros, 0);
    L.norm1_w = add(p + "norm1.weight", {h}, InitKind::Ones, 0);
    L.norm1_b = add(p + "norm1.bias", {h}, InitKind::Zeros, 0);
    if (dims.moe.is_moe(i)) {  // the FFN is a MoE layer (DeepSpeed's MoE module in place of ff)
      L.ff0_w = L.ff0_b = L.ff2_w = L.ff2_b = -1;
      L.moe = add_moe(p + "ff.", i, false);
    } else {
      L.ff0_w = add(p + "ff.0.weight", {f, h}, InitKind::Uniform, lin_h);
      L.ff0_b = add(p + "ff.0.bias", {f}, InitKind::Uniform, lin_h);
      L.ff2_w = add(p + "ff.2.weight", {h, f}, InitKind::Uniform, lin_f);
      L.ff2_b = add(p + "ff.2.bias", {h}, InitKind::Uniform, lin_f);
    }
    L.norm2_w = add(p + "norm2.weight", {h}, InitKind::Ones, 0);
    L.norm2_b = add(p + "norm2.bias", {h}, InitKind::Zeros, 0);
    layer_end_.push_back(L.norm2_b + 1);
    layers_.push_back(L);
  }
  output_w_ = add("output_proj.weight", {V, h}, InitKind::Uniform, lin_h);
  output_b_ = add("output_proj.bias", {V}, InitKind::Uniform, lin_h);
}

// Weights in nn.Linear's [out, in] layout (what the GEMMs read): qkv is [3C, C]. The names are
// cutrain's own (attn.qkv, attn.proj, mlp.fc, mlp.proj), not HF's c_attn / c_proj / c_fc, whose
// Conv1D stores the transpose: model/gpt2_hf.h converts names and layout.
void TransformerParams::build_gpt2() {
  const ModelDims& dims = dims_;
  const std::int64_t C = dims.hidden, F = dims.ffn(), V = dims.vocab_rows(), T = dims.max_seq;
  constexpr double kStd = 0.02;
  const double res_std = kStd / std::sqrt(2.0 * std::max(dims.layers, 1));
  add("wte.weight", {V, C}, InitKind::Normal, kStd);
  add("wpe.weight", {T, C}, InitKind::Normal, kStd);
  for (int i = 0; i < dims.layers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    // The four matrices first, then the eight vectors: each block is two decay runs.
    LayerIndex L{};
    L.in_proj_w = add(p + "attn.qkv.weight", {3 * C, C}, InitKind::Normal, kStd);
    layer_first_.push_back(L.in_proj_w);
    L.out_proj_w = add(p + "attn.proj.weight", {C, C}, InitKind::Normal, res_std);
    const bool moe = dims.moe.is_moe(i);
    L.ff0_w = L.ff0_b = L.ff2_w = L.ff2_b = -1;
    if (moe) {
      L.moe = add_moe(p + "mlp.", i, true);  // DeepSpeed's MoE module in place of the MLP
    } else {
      L.ff0_w = add(p + "mlp.fc.weight", {F, C}, InitKind::Normal, kStd);
      L.ff2_w = add(p + "mlp.proj.weight", {C, F}, InitKind::Normal, res_std);
    }
    L.norm1_w = add(p + "ln_1.weight", {C}, InitKind::Ones, 0);
    L.norm1_b = add(p + "ln_1.bias", {C}, InitKind::Zeros, 0);
    L.in_proj_b = add(p + "attn.qkv.bias", {3 * C}, InitKind::Zeros, 0);
    L.out_proj_b = add(p + "attn.proj.bias", {C}, InitKind::Zeros, 0);
    L.norm2_w = add(p + "ln_2.weight", {C}, InitKind::Ones, 0);
    L.norm2_b = add(p + "ln_2.bias", {C}, InitKind::Zeros, 0);
    if (!moe) {
      L.ff0_b = add(p + "mlp.fc.bias", {F}, InitKind::Zeros, 0);
      L.ff2_b = add(p + "mlp.proj.bias", {C}, InitKind::Zeros, 0);
    }
    const int end = static_cast<int>(tensors_.size());
    for (int t = L.norm1_w; t < end; ++t) tensors_[std::size_t(t)].decay = false;
    layer_end_.push_back(end);
    layers_.push_back(L);
  }
  lnf_w_ = add("ln_f.weight", {C}, InitKind::Ones, 0);
  lnf_b_ = add("ln_f.bias", {C}, InitKind::Zeros, 0);
  tensors_[std::size_t(lnf_w_)].decay = tensors_[std::size_t(lnf_b_)].decay = false;
  output_w_ = 0;  // tied to wte
  output_b_ = -1;
}

// HF's BertForMaskedLM names (docs/bert.md), the fused QKV as the seed model's in-projection.
// Each block's four matrices first, then its vectors (two decay runs per block, as GPT-2): the
// matrices and embeddings decay, biases and LayerNorms do not (DeepSpeed's BERT example).
void TransformerParams::build_bert() {
  const ModelDims& dims = dims_;
  const BertConfig& b = dims.bert;
  const std::int64_t h = dims.hidden, F = dims.ffn(), V = dims.vocab_rows(), S = dims.max_seq;
  const double std0 = b.initializer_range;
  const double out_std = b.adjust_init_range ? std0 / std::sqrt(2.0 * std::max(dims.layers, 1)) : std0;
  auto vec = [&](const std::string& n, std::int64_t c, InitKind k) {
    const int i = add(n, {c}, k, 0);
    tensors_[std::size_t(i)].decay = false;
    return i;
  };
  add("bert.embeddings.word_embeddings.weight", {V, h}, InitKind::Normal, std0);
  add("bert.embeddings.position_embeddings.weight", {S, h}, InitKind::Normal, std0);
  emb_ln_w_ = vec("bert.embeddings.LayerNorm.weight", h, InitKind::Ones);
  emb_ln_b_ = vec("bert.embeddings.LayerNorm.bias", h, InitKind::Zeros);
  embedding_end_ = emb_ln_b_ + 1;
  for (int i = 0; i < dims.layers; ++i) {
    const std::string p = "bert.encoder.layer." + std::to_string(i) + ".";
    LayerIndex L{};
    L.in_proj_w = add(p + "attention.self.qkv.weight", {3 * h, h}, InitKind::Normal, std0);
    layer_first_.push_back(L.in_proj_w);
    L.out_proj_w = add(p + "attention.output.dense.weight", {h, h}, InitKind::Normal, out_std);
    L.ff0_w = add(p + "intermediate.dense.weight", {F, h}, InitKind::Normal, std0);
    L.ff2_w = add(p + "output.dense.weight", {h, F}, InitKind::Normal, out_std);
    L.in_proj_b = vec(p + "attention.self.qkv.bias", 3 * h, InitKind::Zeros);
    L.out_proj_b = vec(p + "attention.output.dense.bias", h, InitKind::Zeros);
    L.norm1_w = vec(p + "attention.output.LayerNorm.weight", h, InitKind::Ones);
    L.norm1_b = vec(p + "attention.output.LayerNorm.bias", h, InitKind::Zeros);
    L.ff0_b = vec(p + "intermediate.dense.bias", F, InitKind::Zeros);
    L.ff2_b = vec(p + "output.dense.bias", h, InitKind::Zeros);
    L.norm2_w = vec(p + "output.LayerNorm.weight", h, InitKind::Ones);
    L.norm2_b = vec(p + "output.LayerNorm.bias", h, InitKind::Zeros);
    layer_end_.push_back(L.norm2_b + 1);
    layers_.push_back(L);
  }
  head_dense_w_ = add("cls.predictions.transform.dense.weight", {h, h}, InitKind::Normal, std0);
  if (b.pre_layer_norm) {
    lnf_w_ = vec("bert.encoder.final_layernorm.weight", h, InitKind::Ones);
    lnf_b_ = vec("bert.encoder.final_layernorm.bias", h, InitKind::Zeros);
  }
  head_dense_b_ = vec("cls.predictions.transform.dense.bias", h, InitKind::Zeros);
  head_ln_w_ = vec("cls.predictions.transform.LayerNorm.weight", h, InitKind::Ones);
  head_ln_b_ = vec("cls.predictions.transform.LayerNorm.bias", h, InitKind::Zeros);
  output_b_ = vec("cls.predictions.bias", V, InitKind::Zeros);
  output_w_ = 0;  // the decoder is tied to the word embedding
}

std::vector<DecayRun> TransformerParams::decay_runs() const {
  std::vector<DecayRun> runs;
  for (const ParamTensor& t : tensors_) {
    if (!runs.empty() && runs.back().decay == t.decay) continue;
    if (!runs.empty()) runs.back().end = t.offset;
    runs.push_back({t.offset, flat_size_, t.decay});
  }
  return runs;
}

const ParamTensor& TransformerParams::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  CUTRAIN_FAIL("model: no parameter named '", name, "' (the model has ", tensors_.size(), " tensors, e.g. '",
               tensors_.front().name, "')");
}

void TransformerParams::init(float* flat, std::uint64_t seed) const {
  for (std::size_t i = 0; i < flat_size_; ++i) flat[i] = 0.f;
  // Tensors are independent (one generator each), so they are filled on several threads: the
  // values do not depend on the thread count. A 6.86B model takes seconds instead of a minute.
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t k; (k = next.fetch_add(1)) < tensors_.size();) init_tensor(flat, seed, k);
  };
  const unsigned nthreads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < nthreads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

void TransformerParams::init_tensor(float* flat, std::uint64_t seed, std::size_t k) const {
  {
    const ParamTensor& t = tensors_[k];
    // One generator per tensor (seed, index): a tensor's values do not depend on the others' sizes.
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + k + 1);
    float* p = flat + t.offset;
    switch (t.init) {
      case InitKind::Normal01: {
        std::normal_distribution<float> d(0.f, 1.f);
        for (std::size_t i = 0; i < t.count; ++i) p[i] = d(rng);
        break;
      }
      case InitKind::Uniform: {
        std::uniform_real_distribution<double> d(-t.bound, t.bound);
        for (std::size_t i = 0; i < t.count; ++i) p[i] = static_cast<float>(d(rng));
        break;
      }
      case InitKind::Normal: {
        std::normal_distribution<double> d(0.0, t.bound);
        for (std::size_t i = 0; i < t.count; ++i) p[i] = static_cast<float>(d(rng));
        break;
      }
      case InitKind::Zeros:
        break;
      case InitKind::Ones:
        for (std::size_t i = 0; i < t.count; ++i) p[i] = 1.f;
        break;
    }
  }
}

}  // namespace cutrain::model
