// @brief Internal to the cross-entropy family: how a row is cut among the CTAs of its cluster.
// The kernel and the CPU tests share this arithmetic, so the tests check the kernel's own cut.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define CUTRAIN_CE_HD __host__ __device__
#else
#define CUTRAIN_CE_HD
#endif

namespace cutrain::kernels::ce {

// A row of `vocab` bf16 at byte address `row_addr` (2-byte aligned): a scalar head up to the first
// 16-byte boundary (fewer than 8 elements), 16-byte vectors of 8 from there, a scalar tail of
// fewer than 8. The vectors are cut evenly over `split` CTAs; CTA `rank` owns [v_begin, v_end)
// (empty for trailing ranks of a short row); rank 0 also owns the head and the tail.
struct RowSlice {
  int head;        // elements [0, head) are the head
  int nvec;        // vectors of the body, which starts at element `head`
  int tail_start;  // elements [tail_start, vocab) are the tail
  int v_begin, v_end;
};

CUTRAIN_CE_HD inline RowSlice row_slice(std::uintptr_t row_addr, int vocab, int split, int rank) {
  RowSlice r;
  const int to_boundary = static_cast<int>(((16u - (row_addr & 15u)) & 15u) >> 1);
  r.head = to_boundary < vocab ? to_boundary : vocab;
  r.nvec = (vocab - r.head) / 8;
  r.tail_start = r.head + r.nvec * 8;
  const int per = (r.nvec + split - 1) / split;
  const int begin = rank * per;  // <= nvec + split: no overflow for any int vocab
  r.v_begin = begin < r.nvec ? begin : r.nvec;
  r.v_end = r.v_begin + per < r.nvec ? r.v_begin + per : r.nvec;
  return r;
}

// The most vectors any CTA of a row owns, whatever the row's alignment (a body has at most
// vocab / 8 vectors): the shared memory a CTA needs to park its whole slice.
CUTRAIN_CE_HD inline int slice_vecs(int vocab, int split) { return (vocab / 8 + split - 1) / split; }

}  // namespace cutrain::kernels::ce

#undef CUTRAIN_CE_HD
