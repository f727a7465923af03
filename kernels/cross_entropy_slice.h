// @brief Internal to the cross-entropy family: how a row is cut among the CTAs of its cluster and
// how much of its slice a CTA parks in shared memory. The kernel and the CPU tests share this
// arithmetic, so the tests check the kernel's own cut and budget.
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

// The cluster size is 1..kMaxSplit (cross_entropy_ctas_per_row; 8 is the portable cluster size);
// the row kernel's static shared memory is kept under kStaticSmemBytes (the launcher checks the
// compiled kernel's figure).
inline constexpr int kMaxSplit = 8;
inline constexpr int kStaticSmemBytes = 1024;

// The 16-byte vectors of its slice a CTA parks in shared memory: the whole slice (`slice_vecs`)
// unless the device's opt-in maximum (`smem_optin`: cudaDevAttrMaxSharedMemoryPerBlockOptin) less
// the static part cannot hold it; then its first park_vecs vectors, and the rest of the slice is
// read from global memory in every pass (the long-row fallback, past about 920k columns on an
// H100/H200). The row kernel's dynamic shared memory is park_vecs * 16 bytes.
constexpr int park_vecs(int slice_vecs, int smem_optin) {
  const int budget = smem_optin > kStaticSmemBytes ? (smem_optin - kStaticSmemBytes) / 16 : 0;
  return slice_vecs < budget ? slice_vecs : budget;
}

}  // namespace cutrain::kernels::ce

#undef CUTRAIN_CE_HD
