// @brief GPT-2 as a safetensors file with Hugging Face's state-dict names (GPT2LMHeadModel:
// transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...), for PyTorch and transformers.
// HF's Conv1D keeps its weights as [in, out] (c_attn [C, 3C], c_proj [C, C], c_fc [C, 4C],
// mlp.c_proj [4C, C]): the transpose of the table's nn.Linear layout, converted both ways. HF's wte
// has the real vocabulary's rows only (50257): padded rows are dropped on save, zero on load. The
// head is tied, so lm_head.weight is not written (and, when a file has it, not read).
#pragma once

#include <filesystem>

#include "model/transformer_params.h"
#include "runtime/dtype.h"

namespace cutrain::model {

// `dtype`: F32 or BF16 (rounded to nearest even). Atomic (temp + rename).
void save_gpt2_safetensors(const std::filesystem::path& path, const TransformerParams& table, const float* flat,
                           DType dtype = DType::F32);

// Fills `flat` (table.flat_size() floats; padding and padded rows 0) from a file with or without
// the "transformer." prefix, F32 or BF16 tensors. HF's attention-mask buffers (attn.bias,
// attn.masked_bias) are skipped; any other unknown name, a missing one, a shape or dtype that does
// not fit is an error naming the file and the tensor.
void load_gpt2_safetensors(const std::filesystem::path& path, const TransformerParams& table, float* flat);

}  // namespace cutrain::model
