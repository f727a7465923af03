// @brief A tensor-parallel rank's slices in the flat parameter layout as strided runs, pure: each
// split tensor's elements of the rank (parallel/tensor_parallel_plan.h's slices) as `height` runs
// of `width` elements, `pitch` apart. The GPU model copies the runs that are not one block (QKV's
// q, k, v rows, the out-projection's and FC2's columns) into packed scratch for its GEMMs, and the
// GPU engine packs every run of the rank for the gradient norm over the group (train/engine.cpp).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "model/tensor_parallel.h"
#include "model/transformer_params.h"

namespace cutrain::model {

struct SliceRuns {
  std::size_t offset = 0;  // the first element, from the tensor's first
  std::size_t width = 0, height = 1, pitch = 0;
  std::size_t count() const { return width * height; }
};

// A dense block's split tensors (the seed model's and GPT-2's; Megatron's layout): QKV's rows of
// the rank's heads (three runs: q, k, v) and their biases, the out-projection's matching columns,
// FC1's rows and bias, FC2's columns.
struct TpBlockRuns {
  SliceRuns qkv_w, qkv_b, out_proj_w, ff0_w, ff0_b, ff2_w;
};
TpBlockRuns tp_block_runs(const ModelDims& dims, const TpSlice& slice);

// Every split tensor's runs of the rank in the model (tensor index, runs): the token embedding's
// and the head's vocabulary rows (GPT-2: tied, once), each block's TpBlockRuns. The other tensors
// are replicated.
std::vector<std::pair<int, SliceRuns>> tp_sliced_runs(const TransformerParams& table, const TpSlice& slice);

}  // namespace cutrain::model
