// @brief What the CPU reference model needs to compute one tensor-parallel rank's share of the
// model (Megatron's layout): which heads, FFN columns and vocabulary rows are this rank's, and the
// group's reductions. model/ knows no ranks: parallel/tensor_parallel_plan.h fills the slice and
// implements the reducer over a communicator.
#pragma once

#include <cstddef>

namespace cutrain::model {

// The tensor-parallel group's reductions, in fp64 (the partial sums of a split GEMM travel
// unrounded, so the sum of the ranks' parts rounds once, as the single process's dot product
// does). Every rank of the group calls each one with the same count, in the same order.
class TpReducer {
 public:
  virtual ~TpReducer() = default;
  virtual void sum(double* buf, std::size_t n) = 0;
  virtual void max(double* buf, std::size_t n) = 0;
};

// One rank's slice. size 1: the whole model (the reference model's own path).
struct TpSlice {
  int rank = 0, size = 1;
  int head_begin = 0, head_end = 0;    // attention heads (column-parallel QKV, row-parallel out-projection)
  int ffn_begin = 0, ffn_end = 0;      // FFN columns (column-parallel FC1, row-parallel FC2)
  int vocab_begin = 0, vocab_end = 0;  // rows of the token embedding and the head (vocab_rows())
  // Domino: each block's micro-batch split into `pieces` groups of whole sequences, each piece's
  // all-reduce issued after its own compute (the batch must divide).
  int pieces = 1;
  TpReducer* reducer = nullptr;  // the group's reductions (size > 1)
  bool active() const { return size > 1 || pieces > 1; }
};

}  // namespace cutrain::model
