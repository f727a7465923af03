// @brief CPU tests of the cross-entropy row kernel's cut of a row (kernels/cross_entropy_slice.h,
// the arithmetic the kernel runs) and of its cluster size: every element of every row, at every
// start alignment, is owned by exactly one CTA; vectors are 16-byte aligned; no CTA owns more
// vectors than its shared memory is sized for. And the host-side geometry of the row kernel's
// schedules (kernels/cross_entropy_schedule.h): slice buffers and their shared memory within the
// device's budget, the long-row fallback, the persistent grid and its rows, the ring of buffers
// (mbarrier parities, the bulk-store groups waited on), the production table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cross_entropy.cuh"
#include "kernels/cross_entropy_schedule.h"
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

namespace ce = kernels::ce;

constexpr int kH100Optin = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin on H100 / H200 (227 KiB)
constexpr int kSmPerSm = 233472;    // shared memory of one SM (228 KiB); 1 KiB of it reserved per CTA

int ctas_per_sm(std::size_t dynamic_bytes) {
  return static_cast<int>(kSmPerSm / (dynamic_bytes + ce::kStaticSmemBytes + 1024));
}

TEST(CrossEntropySchedule, BuffersAndNames) {
  EXPECT_EQ(ce::slice_buffers(ce::Schedule::PerRow), 1);
  EXPECT_EQ(ce::slice_buffers(ce::Schedule::Persistent), 2);
  EXPECT_EQ(ce::slice_buffers(ce::Schedule::PersistentBulkStore), 3);
  EXPECT_FALSE(ce::is_persistent(ce::Schedule::PerRow));
  EXPECT_TRUE(ce::is_persistent(ce::Schedule::Persistent));
  EXPECT_TRUE(ce::is_persistent(ce::Schedule::PersistentBulkStore));
  EXPECT_STREQ(ce::schedule_name(ce::Schedule::PerRow), "per_row");
  EXPECT_STREQ(ce::schedule_name(ce::Schedule::Persistent), "persistent");
  EXPECT_STREQ(ce::schedule_name(ce::Schedule::PersistentBulkStore), "persistent_bulk_store");
}

// Whole slices parked at the training vocabularies, within the opt-in budget less the static part;
// at GPT-2's 50304 columns (4 CTAs of 1572 vectors) the shared memory of PerRow, Persistent and
// PersistentBulkStore leaves room for 8 (its registers allow 6), 4 and 3 CTAs per SM.
TEST(CrossEntropySchedule, GeometryParksWholeSlicesAtTrainingVocabularies) {
  for (int vocab : {1, 7, 1031, 16384, 16385, 30522, 40961, 50000, 50257, 50304, 65537, 131071, 262144}) {
    const int split = kernels::cross_entropy_ctas_per_row(vocab);
    const int slice = ce::slice_vecs(vocab, split);
    for (ce::Schedule s : ce::kSchedules) {
      const ce::RowGeometry g = ce::row_geometry(slice, s, kH100Optin);
      SCOPED_TRACE(std::string(ce::schedule_name(s)) + " vocab " + std::to_string(vocab));
      EXPECT_EQ(g.buffers, ce::slice_buffers(s));
      EXPECT_EQ(g.park_vecs, slice);
      EXPECT_EQ(g.dynamic_smem_bytes, static_cast<std::size_t>(g.buffers) * slice * 16u);
      EXPECT_LE(g.dynamic_smem_bytes + ce::kStaticSmemBytes, static_cast<std::size_t>(kH100Optin));
    }
  }
  const int slice = ce::slice_vecs(50304, 4);
  EXPECT_EQ(slice, 1572);
  EXPECT_EQ(ctas_per_sm(ce::row_geometry(slice, ce::Schedule::PerRow, kH100Optin).dynamic_smem_bytes), 8);
  EXPECT_EQ(ctas_per_sm(ce::row_geometry(slice, ce::Schedule::Persistent, kH100Optin).dynamic_smem_bytes), 4);
  EXPECT_EQ(ctas_per_sm(ce::row_geometry(slice, ce::Schedule::PersistentBulkStore, kH100Optin).dynamic_smem_bytes),
            3);
}

// Past what the buffers hold (about 920k columns for PerRow's one buffer, less for two or three),
// each buffer parks the budget's share and the rest is read from global memory; no budget parks 0.
TEST(CrossEntropySchedule, GeometryLongRowFallbackStaysInBudget) {
  for (int vocab : {600001, 1000003, 4000037}) {
    const int split = kernels::cross_entropy_ctas_per_row(vocab);
    const int slice = ce::slice_vecs(vocab, split);
    for (ce::Schedule s : ce::kSchedules) {
      const ce::RowGeometry g = ce::row_geometry(slice, s, kH100Optin);
      SCOPED_TRACE(std::string(ce::schedule_name(s)) + " vocab " + std::to_string(vocab));
      EXPECT_LE(g.park_vecs, slice);
      EXPECT_LE(g.dynamic_smem_bytes + ce::kStaticSmemBytes, static_cast<std::size_t>(kH100Optin));
      // The budget is used: one more vector per buffer would not fit.
      if (g.park_vecs < slice) {
        EXPECT_GT((g.park_vecs + 1) * 16 * g.buffers + ce::kStaticSmemBytes, kH100Optin);
      }
    }
  }
  EXPECT_LT(ce::row_geometry(ce::slice_vecs(1000003, 8), ce::Schedule::PerRow, kH100Optin).park_vecs,
            ce::slice_vecs(1000003, 8));
  EXPECT_EQ(ce::row_geometry(ce::slice_vecs(600001, 8), ce::Schedule::PerRow, kH100Optin).park_vecs,
            ce::slice_vecs(600001, 8));
  EXPECT_LT(ce::row_geometry(ce::slice_vecs(600001, 8), ce::Schedule::Persistent, kH100Optin).park_vecs,
            ce::slice_vecs(600001, 8));
  for (ce::Schedule s : ce::kSchedules) {
    EXPECT_EQ(ce::row_geometry(100, s, 0).park_vecs, 0);
    EXPECT_EQ(ce::row_geometry(100, s, ce::kStaticSmemBytes).dynamic_smem_bytes, 0u);
  }
}

// The grid in clusters and the rows each cluster walks (row = cluster + k * clusters): every row
// exactly once, for rows below, at and past the resident clusters.
TEST(CrossEntropySchedule, PersistentGridCoversEveryRowOnce) {
  EXPECT_EQ(ce::grid_clusters(ce::Schedule::PerRow, 8192, 132), 8192);
  for (ce::Schedule s : {ce::Schedule::Persistent, ce::Schedule::PersistentBulkStore}) {
    EXPECT_EQ(ce::grid_clusters(s, 8192, 132), 132);
    EXPECT_EQ(ce::grid_clusters(s, 132, 132), 132);
    EXPECT_EQ(ce::grid_clusters(s, 5, 132), 5);
  }
  for (int active : {1, 7, 49, 132, 264})
    for (int rows : {1, 2, active - 1, active, active + 1, 2 * active + 3, 8192}) {
      if (rows < 1) continue;
      const int clusters = ce::grid_clusters(ce::Schedule::Persistent, rows, active);
      ASSERT_GE(clusters, 1);
      ASSERT_LE(clusters, rows);
      std::vector<int> seen(static_cast<std::size_t>(rows), 0);
      int total = 0;
      for (int c = 0; c < clusters; ++c) {
        int n = 0;
        for (int row = c; row < rows; row += clusters, ++n) ++seen[static_cast<std::size_t>(row)];
        EXPECT_EQ(n, ce::rows_of_cluster(rows, clusters, c));
        total += n;
      }
      EXPECT_EQ(total, rows);
      for (int r = 0; r < rows; ++r) ASSERT_EQ(seen[static_cast<std::size_t>(r)], 1) << "row " << r;
    }
}

// The ring the kernel walks: row k in buffer k % B with the parity of that buffer's fill count;
// row k + 1's copy goes into the buffer row k + 1 - B held (never the current row's for B >= 2);
// with one bulk group committed per row, the groups newer than that row's store when the copy
// starts are store_groups_after(B).
TEST(CrossEntropySchedule, RingBuffersParitiesAndBulkGroups) {
  for (int buffers : {1, 2, 3}) {
    std::vector<int> fills(static_cast<std::size_t>(buffers), 0);
    for (int k = 0; k < 40; ++k) {
      const int b = ce::ring_buffer(k, buffers);
      ASSERT_GE(b, 0);
      ASSERT_LT(b, buffers);
      EXPECT_EQ(ce::ring_parity(k, buffers), static_cast<unsigned>(fills[static_cast<std::size_t>(b)] & 1));
      EXPECT_EQ(ce::ring_fill(k, buffers), fills[static_cast<std::size_t>(b)]);
      ++fills[static_cast<std::size_t>(b)];
      if (buffers >= 2) {
        const int next = ce::ring_buffer(k + 1, buffers);
        EXPECT_NE(next, b) << "the next row's copy would overwrite the current row";
        const int previous = k + 1 - buffers;  // the row the next buffer last held
        if (previous >= 0) {
          EXPECT_EQ(ce::ring_buffer(previous, buffers), next);
          // Commits at the end of rows previous + 1 .. k - 1 came after that row's store.
          EXPECT_EQ(k - 1 - previous, ce::store_groups_after(buffers));
        }
      }
    }
  }
}

// The production pick: a schedule for every cluster size, a function of the vocabulary alone.
TEST(CrossEntropySchedule, ProductionTableCoversEveryClusterSize) {
  for (int split = 1; split <= ce::kMaxSplit; ++split) {
    const ce::Schedule s = ce::production_schedule(split);
    EXPECT_TRUE(s == ce::Schedule::PerRow || s == ce::Schedule::Persistent || s == ce::Schedule::PersistentBulkStore);
    EXPECT_EQ(s, ce::kProductionSchedule[split]);
  }
  EXPECT_EQ(ce::production_schedule(0), ce::kProductionSchedule[1]);
  EXPECT_EQ(ce::production_schedule(99), ce::kProductionSchedule[ce::kMaxSplit]);
  EXPECT_EQ(kernels::cross_entropy_ctas_per_row(2147483647), ce::kMaxSplit);
}

}  // namespace
}  // namespace cutrain
