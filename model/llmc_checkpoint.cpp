#include "model/llmc_checkpoint.h"

#include <cstring>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace cutrain::model {
namespace {

// The table tensors that make up llm.c's tensor i, in file order (one per layer for the stacked ones).
std::vector<int> parts_of(const TransformerParams& t, int i) {
  if (i == 0) return {t.embedding()};
  if (i == 1) return {t.pos_embedding()};
  if (i == 14) return {t.final_norm_w()};
  if (i == 15) return {t.final_norm_b()};
  std::vector<int> out;
  for (int l = 0; l < t.dims().layers; ++l) {
    const LayerIndex& L = t.layer(l);
    const int per[12] = {L.norm1_w, L.norm1_b, L.in_proj_w, L.in_proj_b, L.out_proj_w, L.out_proj_b,
                         L.norm2_w, L.norm2_b, L.ff0_w,     L.ff0_b,     L.ff2_w,      L.ff2_b};
    out.push_back(per[i - 2]);
  }
  return out;
}

std::string where(const std::filesystem::path& p) { return "llm.c checkpoint " + p.string(); }

}  // namespace

ModelDims llmc_dims(const LlmcHeader& h) {
  ModelDims d;
  d.hidden = h.channels;
  d.layers = h.layers;
  d.heads = h.heads;
  d.vocab = h.vocab;
  d.max_seq = h.max_seq;
  d.padded_vocab = h.padded_vocab > h.vocab ? h.padded_vocab : 0;
  d.arch = Arch::Gpt2;
  return d;
}

LlmcHeader llmc_header(const ModelDims& d, bool bf16) {
  LlmcHeader h;
  h.version = bf16 ? kLlmcVersionBf16 : kLlmcVersionFp32;
  h.max_seq = d.max_seq;
  h.vocab = d.vocab;
  h.layers = d.layers;
  h.heads = d.heads;
  h.channels = d.hidden;
  h.padded_vocab = d.vocab_rows();
  return h;
}

std::array<std::size_t, kLlmcTensors> llmc_tensor_sizes(const LlmcHeader& h) {
  const std::size_t Vp = std::size_t(h.padded_vocab), C = std::size_t(h.channels), T = std::size_t(h.max_seq),
                    L = std::size_t(h.layers);
  return {Vp * C,     T * C,         L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
          L * C,      L * C,         L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
}

LlmcHeader read_llmc_header(const std::filesystem::path& path) {
  const ReadOnlyFile f(path);
  const std::uint64_t header_bytes = kLlmcHeaderInts * sizeof(std::int32_t);
  CUTRAIN_CHECK(f.size() >= header_bytes, where(path), ": ", f.size(), " bytes is shorter than llm.c's ",
                header_bytes, "-byte header (truncated, or not an llm.c model file)");
  std::int32_t raw[kLlmcHeaderInts];
  f.read_at(0, raw, sizeof raw);
  if (raw[0] != kLlmcModelMagic) {
    const char* hint = raw[0] == 20240520   ? " (that is llm.c's token shard magic: a data file, not a model)"
                       : raw[0] == 20240527 ? " (that is llm.c's training-state magic: state_*.bin, not model_*.bin)"
                                            : "";
    CUTRAIN_FAIL(where(path), ": magic ", raw[0], " is not llm.c's model magic ", kLlmcModelMagic, hint);
  }
  LlmcHeader h;
  h.version = raw[1];
  CUTRAIN_CHECK(h.version == kLlmcVersionFp32 || h.version == kLlmcVersionBf16, where(path), ": version ", h.version,
                " is not supported (expected 3 = fp32 or 5 = bf16 parameters, padded vocabulary)");
  h.max_seq = raw[2];
  h.vocab = raw[3];
  h.layers = raw[4];
  h.heads = raw[5];
  h.channels = raw[6];
  h.padded_vocab = raw[7];
  const std::pair<const char*, std::int32_t> fields[] = {{"max_seq_len", h.max_seq}, {"vocab_size", h.vocab},
                                                         {"num_layers", h.layers},   {"num_heads", h.heads},
                                                         {"channels", h.channels},   {"padded_vocab_size", h.padded_vocab}};
  for (const auto& [name, v] : fields)
    CUTRAIN_CHECK(v > 0, where(path), ": header field ", name, " must be positive, found ", v);
  CUTRAIN_CHECK(h.channels % h.heads == 0, where(path), ": num_heads ", h.heads, " does not divide channels ",
                h.channels);
  CUTRAIN_CHECK(h.padded_vocab >= h.vocab, where(path), ": padded_vocab_size ", h.padded_vocab,
                " is smaller than vocab_size ", h.vocab);
  std::uint64_t elements = 0;
  for (std::size_t n : llmc_tensor_sizes(h)) elements += n;
  const std::uint64_t want = header_bytes + elements * h.element_bytes();
  CUTRAIN_CHECK(f.size() == want, where(path), ": the header (", h.layers, " layers, ", h.channels, " channels, ",
                h.padded_vocab, " padded vocabulary, ", h.max_seq, " positions, ",
                h.version == kLlmcVersionBf16 ? "bf16" : "fp32", ") implies ", want, " bytes, the file has ",
                f.size(), f.size() < want ? " (truncated)" : " (extra bytes after the parameters)");
  return h;
}

LlmcHeader load_llmc_checkpoint(const std::filesystem::path& path, const TransformerParams& table, float* flat) {
  const LlmcHeader h = read_llmc_header(path);
  const ModelDims& d = table.dims();
  CUTRAIN_CHECK(d.arch == Arch::Gpt2, where(path), ": an llm.c model loads into the gpt2 architecture only");
  std::string diff;
  auto same = [&](const char* name, long file, long model) {
    if (file != model) diff += std::string(diff.empty() ? "" : ", ") + name + " " + std::to_string(file) +
                               " in the file, " + std::to_string(model) + " in the model";
  };
  same("num_layers", h.layers, d.layers);
  same("channels", h.channels, d.hidden);
  same("num_heads", h.heads, d.heads);
  same("vocab_size", h.vocab, d.vocab);
  same("padded_vocab_size", h.padded_vocab, d.vocab_rows());
  same("max_seq_len", h.max_seq, d.max_seq);
  CUTRAIN_CHECK(diff.empty(), where(path), ": model size mismatch: ", diff);

  for (std::size_t i = 0; i < table.flat_size(); ++i) flat[i] = 0.f;
  const ReadOnlyFile f(path);
  std::uint64_t pos = kLlmcHeaderInts * sizeof(std::int32_t);
  const std::size_t es = h.element_bytes();
  std::vector<std::uint16_t> buf;
  for (int i = 0; i < kLlmcTensors; ++i)
    for (int t : parts_of(table, i)) {
      const ParamTensor& pt = table.tensor(t);
      float* dst = flat + pt.offset;
      if (es == 4) {
        f.read_at(pos, dst, pt.count * 4);
      } else {
        buf.resize(pt.count);
        f.read_at(pos, buf.data(), pt.count * 2);
        for (std::size_t k = 0; k < pt.count; ++k) dst[k] = bf16_bits_to_f32(buf[k]);
      }
      pos += pt.count * es;
    }
  return h;
}

void save_llmc_checkpoint(const std::filesystem::path& path, const TransformerParams& table, const float* flat,
                          bool bf16) {
  CUTRAIN_CHECK(table.dims().arch == Arch::Gpt2, where(path), ": only the gpt2 architecture has llm.c's layout");
  const LlmcHeader h = llmc_header(table.dims(), bf16);
  std::int32_t raw[kLlmcHeaderInts] = {};
  raw[0] = kLlmcModelMagic;
  raw[1] = h.version;
  raw[2] = h.max_seq;
  raw[3] = h.vocab;
  raw[4] = h.layers;
  raw[5] = h.heads;
  raw[6] = h.channels;
  raw[7] = h.padded_vocab;
  AtomicFileWriter w(path);
  w.write(raw, sizeof raw);
  std::vector<std::uint16_t> buf;
  for (int i = 0; i < kLlmcTensors; ++i)
    for (int t : parts_of(table, i)) {
      const ParamTensor& pt = table.tensor(t);
      const float* src = flat + pt.offset;
      if (!bf16) {
        w.write(src, pt.count * 4);
        continue;
      }
      buf.resize(pt.count);
      for (std::size_t k = 0; k < pt.count; ++k) buf[k] = f32_to_bf16_bits(src[k]);
      w.write(buf.data(), pt.count * 2);
    }
  w.commit();
}

}  // namespace cutrain::model
