// @brief CPU tests of the cross-entropy row kernel's cut of a row (kernels/cross_entropy_slice.h,
// the arithmetic the kernel runs) and of its cluster size: every element of every row, at every
// start alignment, is owned by exactly one CTA; vectors are 16-byte aligned; no CTA owns more
// vectors than its shared memory is sized for. And what a CTA parks (ce::park_vecs): whole slices
// at the training vocabularies within the device's budget, the long-row fallback past it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
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
  EXPECT_EQ(kernels::ce::kMaxSplit, 8);
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

namespace ce = kernels::ce;

constexpr int kH100Optin = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin on H100 / H200 (227 KiB)
constexpr int kSmPerSm = 233472;    // shared memory of one SM (228 KiB); 1 KiB of it reserved per CTA

int ctas_per_sm(std::size_t dynamic_bytes) {
  return static_cast<int>(kSmPerSm / (dynamic_bytes + ce::kStaticSmemBytes + 1024));
}

// Whole slices parked at the training vocabularies, within the opt-in budget less the static part;
// at GPT-2's 50304 columns (4 CTAs of 1572 vectors) the shared memory leaves room for 8 CTAs per
// SM (the registers allow 6).
TEST(CrossEntropyPark, WholeSlicesAtTrainingVocabularies) {
  for (int vocab : {1, 7, 1031, 16384, 16385, 30522, 40961, 50000, 50257, 50304, 65537, 131071, 262144}) {
    const int split = kernels::cross_entropy_ctas_per_row(vocab);
    const int slice = ce::slice_vecs(vocab, split);
    const int park = ce::park_vecs(slice, kH100Optin);
    EXPECT_EQ(park, slice) << "vocab " << vocab;
    EXPECT_LE(static_cast<std::size_t>(park) * 16u + ce::kStaticSmemBytes, static_cast<std::size_t>(kH100Optin))
        << "vocab " << vocab;
  }
  const int slice = ce::slice_vecs(50304, 4);
  EXPECT_EQ(slice, 1572);
  EXPECT_EQ(ctas_per_sm(static_cast<std::size_t>(ce::park_vecs(slice, kH100Optin)) * 16u), 8);
}

// Past what one CTA's shared memory holds (about 920k columns over 8 CTAs), a CTA parks the
// budget's worth and reads the rest from global memory; no budget parks 0.
TEST(CrossEntropyPark, LongRowFallbackStaysInBudget) {
  for (int vocab : {600001, 1000003, 4000037}) {
    const int split = kernels::cross_entropy_ctas_per_row(vocab);
    const int slice = ce::slice_vecs(vocab, split);
    const int park = ce::park_vecs(slice, kH100Optin);
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    EXPECT_LE(park, slice);
    EXPECT_LE(park * 16 + ce::kStaticSmemBytes, kH100Optin);
    // The budget is used: one more vector would not fit.
    if (park < slice) {
      EXPECT_GT((park + 1) * 16 + ce::kStaticSmemBytes, kH100Optin);
    }
  }
  EXPECT_LT(ce::park_vecs(ce::slice_vecs(1000003, 8), kH100Optin), ce::slice_vecs(1000003, 8));
  EXPECT_EQ(ce::park_vecs(ce::slice_vecs(600001, 8), kH100Optin), ce::slice_vecs(600001, 8));
  EXPECT_EQ(ce::park_vecs(100, 0), 0);
  EXPECT_EQ(ce::park_vecs(100, ce::kStaticSmemBytes), 0);
}

}  // namespace
}  // namespace cutrain
