// @brief Tensor parallelism's plan (Megatron's layout), pure: which heads, FFN columns and
// vocabulary rows each rank of a tensor-parallel group owns, where those slices lie in the flat
// parameter buffer (the rest of the model is replicated on every rank of the group), and the
// communication of one micro-batch. The CPU backend computes with it (model/reference_tp.cpp);
// a GPU engine would read the same slices.
//   column-parallel: QKV (rows q | k | v of the rank's heads), FC1 (its FFN rows);
//   row-parallel:    the out-projection's and FC2's matching columns, their biases replicated;
//   vocabulary:      rows [vocab_begin, vocab_end) of the token embedding and of the head (GPT-2:
//                    the same tensor, tied) over vocab_rows();
//   replicated:      the LayerNorms, the position table, the row-parallel biases, GPT-2's ln_f.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model/tensor_parallel.h"
#include "model/transformer_params.h"
#include "parallel/partition.h"

namespace cutrain::parallel {

// This rank's slice (no reducer set). `flag` names the degree's source in errors
// ("--tensor_parallel_size" or "tensor_parallel.autotp_size"): the degree must divide the heads,
// the FFN width and the vocabulary rows; the model must be dense.
model::TpSlice make_tp_slice(const model::ModelDims& dims, int tp, int rank, const std::string& flag);

// Domino's pieces: `pieces` must divide the micro-batch (sequences) and needs tp > 1.
void check_domino(int pieces, int micro_batch, int tp, const std::string& flag);

// The flat buffer's elements as a tensor-parallel rank sees them.
struct TpLayout {
  std::vector<Range> sliced;      // this rank's slices of the split tensors (flat ranges, ascending)
  std::vector<Range> replicated;  // the tensors every rank of the group holds whole
  // Element masks over [0, flat_size()): `held` = sliced + replicated (the rest stays zero on this
  // rank); `counted` = sliced + (rank 0 of the group only) replicated: each element once over the
  // group (the gradient norm, the checkpoint's sum over the group).
  std::vector<unsigned char> held, counted;
};
TpLayout make_tp_layout(const model::TransformerParams& table, const model::TpSlice& slice);

// The all-reduces of one micro-batch of B x S tokens over `blocks` blocks (forward and backward),
// fp64 elements each.
struct TpCommPlan {
  int forward_all_reduces = 0, backward_all_reduces = 0;
  std::size_t forward_elems = 0, backward_elems = 0;
};
TpCommPlan tp_comm_plan(const model::ModelDims& dims, int B, int S, int pieces, bool embedding, int blocks, bool head);

// "tensor parallel: rank t of T: heads [a, b), FFN columns [c, d), vocabulary rows [e, f)".
std::string describe_tp_slice(const model::TpSlice& slice);

}  // namespace cutrain::parallel
