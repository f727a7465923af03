// @brief A training backend's GPT-2 weights from and to llm.c's model file
// (model/llmc_checkpoint.h: `cutrain train --init_from_llmc` / `--save_llmc`) and Hugging Face's
// safetensors (model/gpt2_hf.h: `--init_from_hf` / `--save_hf`).
#pragma once

#include <filesystem>

#include "model/gpt2_hf.h"
#include "model/llmc_checkpoint.h"
#include "train/train_backend.h"

namespace cutrain::train {

// The backend's params (and fp32 master, where the layout has one) become the file's values; the
// optimizer moments are zeroed (llm.c's model file holds none). Errors name the file.
model::LlmcHeader init_from_llmc(TrainBackend& backend, const std::filesystem::path& path);

// The backend's params as llm.c's model file: bf16 (version 5, the params the model computes
// with) or fp32 (version 3, from the fp32 master where there is one). Collective under ZeRO
// (every rank calls it); only `write_file` ranks write.
void save_llmc(TrainBackend& backend, const std::filesystem::path& path, bool bf16, bool write_file = true);

// The same with HF's GPT-2 safetensors: F32 holding the params the model computes with (on the
// GPU the bf16 values, exactly), so PyTorch evaluates the same weights.
void init_from_hf(TrainBackend& backend, const std::filesystem::path& path);
void save_hf(TrainBackend& backend, const std::filesystem::path& path, bool write_file = true);

}  // namespace cutrain::train
