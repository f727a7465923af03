#include "model/gpt2_hf.h"

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace cutrain::model {
namespace {

constexpr const char* kPrefix = "transformer.";

bool transposed(const TransformerParams& t, int idx) {  // HF Conv1D: the four block matrices
  for (int l = 0; l < t.dims().layers; ++l) {
    const LayerIndex& L = t.layer(l);
    if (idx == L.in_proj_w || idx == L.out_proj_w || idx == L.ff0_w || idx == L.ff2_w) return true;
  }
  return false;
}

// HF's shape of table tensor idx.
std::vector<std::int64_t> hf_shape(const TransformerParams& t, int idx) {
  std::vector<std::int64_t> s = t.tensor(idx).shape;
  if (idx == t.embedding()) s[0] = t.dims().vocab;
  if (transposed(t, idx)) std::swap(s[0], s[1]);
  return s;
}

// HF's name of a table tensor (the table names the block's linear layers qkv / proj / fc / proj).
std::string hf_name(const std::string& name, bool prefixed) {
  std::string n = name;
  for (const auto& [ours, hf] : {std::pair<const char*, const char*>{".attn.qkv.", ".attn.c_attn."},
                                 {".attn.proj.", ".attn.c_proj."},
                                 {".mlp.fc.", ".mlp.c_fc."},
                                 {".mlp.proj.", ".mlp.c_proj."}}) {
    const std::size_t at = n.find(ours);
    if (at != std::string::npos) n.replace(at, std::string(ours).size(), hf);
  }
  return (prefixed ? kPrefix : "") + n;
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

void check_gpt2(const TransformerParams& t, const std::filesystem::path& path) {
  CUTRAIN_CHECK(t.dims().arch == Arch::Gpt2, "GPT-2 safetensors ", path.string(),
                ": Hugging Face's GPT-2 names need the gpt2 architecture (--model gpt2)");
}

}  // namespace

void save_gpt2_safetensors(const std::filesystem::path& path, const TransformerParams& t, const float* flat,
                           DType dtype) {
  check_gpt2(t, path);
  CUTRAIN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "GPT-2 safetensors ", path.string(),
                ": dtype must be F32 or BF16, got ", dtype_name(dtype));
  std::vector<std::vector<float>> f32(t.tensors().size());
  std::vector<std::vector<std::uint16_t>> b16(t.tensors().size());
  std::vector<SafetensorsEntry> entries;
  for (int i = 0; i < int(t.tensors().size()); ++i) {
    const ParamTensor& pt = t.tensor(i);
    const std::vector<std::int64_t> shape = hf_shape(t, i);
    std::size_t n = 1;
    for (auto d : shape) n *= std::size_t(d);
    std::vector<float>& v = f32[std::size_t(i)];
    v.resize(n);
    const float* src = flat + pt.offset;
    if (transposed(t, i)) {
      const std::size_t rows = std::size_t(pt.shape[0]), cols = std::size_t(pt.shape[1]);  // [out, in]
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) v[c * rows + r] = src[r * cols + c];
    } else {
      std::copy(src, src + n, v.begin());  // wte: its first `vocab` rows
    }
    const void* data = v.data();
    if (dtype == DType::BF16) {
      auto& b = b16[std::size_t(i)];
      b.resize(n);
      for (std::size_t k = 0; k < n; ++k) b[k] = f32_to_bf16_bits(v[k]);
      data = b.data();
    }
    entries.push_back({hf_name(pt.name, true), dtype, shape, data});
  }
  write_safetensors(path, entries, {{"format", "pt"}});
}

void load_gpt2_safetensors(const std::filesystem::path& path, const TransformerParams& t, float* flat) {
  check_gpt2(t, path);
  const SafetensorsReader r(path);
  const std::string where = "GPT-2 safetensors " + path.string();
  for (std::size_t i = 0; i < t.flat_size(); ++i) flat[i] = 0.f;
  const bool prefixed = r.contains(hf_name(t.tensor(0).name, true));
  std::set<std::string> used;
  for (int i = 0; i < int(t.tensors().size()); ++i) {
    const ParamTensor& pt = t.tensor(i);
    const std::string name = hf_name(pt.name, prefixed);
    CUTRAIN_CHECK(r.contains(name), where, ": no tensor '", name, "' (the model has ", t.dims().layers, " layers, ",
                  t.dims().hidden, " channels)");
    const SafetensorsTensorInfo& info = r.tensor(name);
    const std::vector<std::int64_t> want = hf_shape(t, i);
    CUTRAIN_CHECK(info.shape == want, where, ": tensor '", name, "' has shape ", shape_text(info.shape),
                  ", the model expects ", shape_text(want));
    CUTRAIN_CHECK(info.dtype == DType::F32 || info.dtype == DType::BF16, where, ": tensor '", name, "' is ",
                  info.dtype_name, "; expected F32 or BF16");
    const std::vector<std::byte> bytes = r.read(name);
    const std::size_t n = info.numel();
    std::vector<float> v(n);
    if (*info.dtype == DType::F32) {
      std::memcpy(v.data(), bytes.data(), n * 4);
    } else {
      const auto* b = reinterpret_cast<const std::uint16_t*>(bytes.data());
      for (std::size_t k = 0; k < n; ++k) v[k] = bf16_bits_to_f32(b[k]);
    }
    float* dst = flat + pt.offset;
    if (transposed(t, i)) {
      const std::size_t rows = std::size_t(pt.shape[0]), cols = std::size_t(pt.shape[1]);
      for (std::size_t r0 = 0; r0 < rows; ++r0)
        for (std::size_t c = 0; c < cols; ++c) dst[r0 * cols + c] = v[c * rows + r0];
    } else {
      std::copy(v.begin(), v.end(), dst);
    }
    used.insert(name);
  }
  for (const SafetensorsTensorInfo& info : r.tensors()) {
    if (used.count(info.name)) continue;
    const std::string& n = info.name;
    const bool mask_buffer = n.size() > 9 && (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias"));
    CUTRAIN_CHECK(mask_buffer || n == "lm_head.weight", where, ": tensor '", n,
                  "' is not a GPT-2 parameter of this model (expected names like '", prefixed ? kPrefix : "",
                  "h.0.attn.c_attn.weight')");
  }
}

}  // namespace cutrain::model
