// The CPU reference of the masked-LM head's plan (tests/reference/mlm_gather_ref.h) on hand-made
// labels: the slots in row order per sequence, the padding slots (position 0, label -100), the
// status word's three cases, and the scatter's zeros.
#include <gtest/gtest.h>

#include "tests/reference/mlm_gather_ref.h"

using namespace cutrain;

TEST(MlmGatherRef, SlotsInRowOrderPerSequence) {
  // B 2, S 5, K 3: sequence 0 labels rows 1 and 4, sequence 1 rows 0, 2 and 3.
  const std::vector<std::int32_t> lab{-100, 7, -100, -100, 9, 3, -100, 4, 5, -100};
  const ref::MlmGatherPlan p = ref::mlm_gather_plan(lab, 2, 5, 3, 10);
  EXPECT_EQ(p.status, 0);
  EXPECT_EQ(p.pos, (std::vector<std::int32_t>{1, 4, 0, 0, 2, 3}));
  EXPECT_EQ(p.glabels, (std::vector<std::int32_t>{7, 9, -100, 3, 4, 5}));
  EXPECT_EQ(p.slot, (std::vector<std::int32_t>{-1, 0, -1, -1, 1, 3, -1, 4, 5, -1}));
  const std::vector<double> g{1, 2, 3, 4, 5, 6};  // h 1
  EXPECT_EQ(ref::mlm_scatter_rows(g, p.slot, 10, 1), (std::vector<double>{0, 1, 0, 0, 2, 4, 0, 5, 6, 0}));
}

TEST(MlmGatherRef, StatusNamesTheFirstBadLabelThenTheFirstFullSequence) {
  // Sequence 1 has 3 labelled rows for K 2: -(1 + 1); its first two are gathered.
  std::vector<std::int32_t> lab{-100, 1, -100, 2, 3, 4};
  ref::MlmGatherPlan p = ref::mlm_gather_plan(lab, 2, 3, 2, 10);
  EXPECT_EQ(p.status, -2);
  EXPECT_EQ(p.pos, (std::vector<std::int32_t>{1, 0, 0, 1}));
  EXPECT_EQ(p.slot, (std::vector<std::int32_t>{-1, 0, -1, 2, 3, -1}));
  // A label outside [0, vocab) at row 2 comes first (row + 1), and is not gathered.
  lab[2] = 10;
  p = ref::mlm_gather_plan(lab, 2, 3, 2, 10);
  EXPECT_EQ(p.status, 3);
  EXPECT_EQ(p.slot[2], -1);
  lab[2] = -5;
  EXPECT_EQ(ref::mlm_gather_plan(lab, 2, 3, 2, 10).status, 3);
}
