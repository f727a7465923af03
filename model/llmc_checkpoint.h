// @brief llm.c's GPT-2 model file (`gpt2_write_to_checkpoint` / `gpt2_build_from_checkpoint`),
// both ways: a header of 256 int32 (magic 20240326, version 3 = fp32 or 5 = bf16 parameters,
// then max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size), then the
// 16 parameter tensors back to back in llm.c's order, each stacked over the layers: wte [Vp, C],
// wpe [maxT, C], ln1w, ln1b, qkvw [L, 3C, C], qkvb, attprojw [L, C, C], attprojb, ln2w, ln2b,
// fcw [L, 4C, C], fcb, fcprojw [L, C, 4C], fcprojb, lnfw, lnfb. cutrain's GPT-2 table keeps the
// same matrices (nn.Linear's [out, in]) but grouped by block: load and save move each layer's slice.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "model/transformer_params.h"

namespace cutrain::model {

constexpr std::int32_t kLlmcModelMagic = 20240326;
constexpr std::int32_t kLlmcVersionFp32 = 3;
constexpr std::int32_t kLlmcVersionBf16 = 5;
constexpr std::size_t kLlmcHeaderInts = 256;
constexpr int kLlmcTensors = 16;

struct LlmcHeader {
  std::int32_t version = kLlmcVersionBf16;
  std::int32_t max_seq = 0, vocab = 0, layers = 0, heads = 0, channels = 0, padded_vocab = 0;
  std::size_t element_bytes() const { return version == kLlmcVersionFp32 ? 4 : 2; }
};

// The GPT-2 dims a header describes (Arch::Gpt2; padded_vocab as in the file).
ModelDims llmc_dims(const LlmcHeader& h);
LlmcHeader llmc_header(const ModelDims& d, bool bf16);
// Elements of llm.c's 16 tensors, in its order.
std::array<std::size_t, kLlmcTensors> llmc_tensor_sizes(const LlmcHeader& h);

// Reads and validates the header: the magic, the version, positive sizes, heads dividing
// channels, padded_vocab >= vocab, and the file's size against what the header implies. Errors
// name the file and what was expected and found.
LlmcHeader read_llmc_header(const std::filesystem::path& path);

// Loads the file's parameters into `flat` (table.flat_size() floats, cutrain's GPT-2 layout;
// padding zeroed). The table must be GPT-2 with the file's sizes: a mismatch names each field
// that differs. Returns the header.
LlmcHeader load_llmc_checkpoint(const std::filesystem::path& path, const TransformerParams& table, float* flat);

// Writes `flat` (cutrain's GPT-2 layout) as llm.c's model file: bf16 (version 5, rounded to
// nearest even) or fp32 (version 3). Atomic: a temp name in the same folder, renamed at the end.
void save_llmc_checkpoint(const std::filesystem::path& path, const TransformerParams& table, const float* flat,
                          bool bf16);

}  // namespace cutrain::model
