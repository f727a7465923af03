// @brief CPU tests of the cross-entropy row kernel's cut of a row (kernels/cross_entropy_slice.h,
// the arithmetic the kernel runs) and of its cluster size: every element of every row, at every
// start alignment, is owned by exactly one CTA; vectors are 16-byte aligned; no CTA owns more
// vectors than its shared memory is sized for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cross_entropy.cuh"
#include "kernels/cross_entropy_slice.h"

namespace cutrain {
namespace {

TEST(CrossEntropyCtasPerRow, SlicesOfAtMost32KiBUpToEightCtas) {
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(1), 1);
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(16384), 1);
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(16385), 2);
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(30522), 2);
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(40961), 3);
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(50257), 4);
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(50304), 4);
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(131071), 8);
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(262144), 8);
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(2147483647), 8);
}

// Row r of a [rows, ld] bf16 array at `base` starts at base + 2 * r * ld bytes.
void check_cover(std::uintptr_t base, int vocab, int ld, int rows) {
  const int split = kernels::cross_entropy_ctas_per_row(vocab);
  const int cap = kernels::ce::slice_vecs(vocab, split);
  std::vector<int> owners(static_cast<std::size_t>(vocab));
  for (int row = 0; row < rows; ++row) {
    const std::uintptr_t addr = base + 2u * static_cast<std::uintptr_t>(row) * static_cast<std::uintptr_t>(ld);
    std::fill(owners.begin(), owners.end(), 0);
    for (int rank = 0; rank < split; ++rank) {
      const auto c = kernels::ce::row_slice(addr, vocab, split, rank);
      ASSERT_GE(c.head, 0);
      ASSERT_LT(c.head, 8);
      ASSERT_GE(vocab - c.tail_start, 0);
      ASSERT_LT(vocab - c.tail_start, 8);
      if (c.nvec > 0) {
        ASSERT_EQ((addr + 2u * static_cast<std::uintptr_t>(c.head)) % 16u, 0u) << "body misaligned";
      }
      ASSERT_LE(c.v_begin, c.v_end);
      ASSERT_LE(c.v_end - c.v_begin, cap) << "vocab " << vocab << " rank " << rank;
      for (int v = c.v_begin; v < c.v_end; ++v)
        for (int e = 0; e < 8; ++e) ++owners[static_cast<std::size_t>(c.head + v * 8 + e)];
      if (rank == 0) {
        for (int j = 0; j < c.head; ++j) ++owners[static_cast<std::size_t>(j)];
        for (int j = c.tail_start; j < vocab; ++j) ++owners[static_cast<std::size_t>(j)];
      }
    }
    for (int j = 0; j < vocab; ++j)
      ASSERT_EQ(owners[static_cast<std::size_t>(j)], 1) << "vocab " << vocab << " ld " << ld << " row " << row
                                                        << " element " << j;
  }
}

TEST(CrossEntropySlice, EveryElementOwnedOnceAtEveryAlignment) {
  std::vector<int> vocabs;
  for (int v = 1; v <= 70; ++v) vocabs.push_back(v);
  for (int v : {127, 128, 129, 2047, 16383, 16384, 16385, 16391, 32768, 32769, 40961, 49152, 49153, 50000, 50257,
                50304, 65536, 100003, 131071, 262144, 262147, 600001, 1000003})
    vocabs.push_back(v);
  for (int vocab : vocabs)
    for (int pad : {0, 1, 2, 3, 7, 47})
      for (std::uintptr_t base : {std::uintptr_t{0x10000}, std::uintptr_t{0x10002}, std::uintptr_t{0x1000e}})
        check_cover(base, vocab, vocab + pad, 8);
}

}  // namespace
}  // namespace cutrain
