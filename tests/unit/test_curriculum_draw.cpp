// The curriculum's draw (data/curriculum_draw.h): the eligible range for value and percentile
// difficulties, every drawn window inside it, distinct within a global micro-batch, the ranks'
// parts disjoint, the same windows for the same (seed, micro-batch) and different ones for another
// seed, and the empty-set error.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "data/curriculum_draw.h"
#include "runtime/error.h"

namespace cutrain {
namespace {

// N samples with random values, sorted as the index sorts them.
data::CurriculumDraw make_draw(std::size_t n, bool percentile, std::uint64_t seed) {
  std::mt19937_64 rng(99);
  std::vector<std::pair<double, std::uint32_t>> v;
  for (std::uint32_t i = 0; i < n; ++i) v.emplace_back(double(rng() % 1000) / 10.0, i);
  std::sort(v.begin(), v.end());
  data::CurriculumDraw d;
  for (auto& [val, id] : v) d.sorted.push_back(id), d.sorted_values.push_back(val);
  d.percentile = percentile;
  d.min_difficulty = percentile ? 10 : 20;
  d.difficulty = [](std::int64_t step) { return std::min<std::int64_t>(100, 30 + 10 * step); };
  d.accum = 2;
  d.seed = seed;
  return d;
}

TEST(CurriculumDraw, ValueRangeHoldsExactlyTheValuesWithinBounds) {
  const data::CurriculumDraw d = make_draw(301, false, 1);
  for (std::int64_t hi : {19, 20, 35, 57, 100}) {
    const auto [first, last] = d.eligible(hi);
    std::size_t want = 0;
    for (double v : d.sorted_values) want += v >= 20.0 && v <= double(hi);
    EXPECT_EQ(last - first, want) << hi;
    for (std::size_t i = first; i < last; ++i) EXPECT_TRUE(d.sorted_values[i] >= 20 && d.sorted_values[i] <= hi);
  }
}

TEST(CurriculumDraw, PercentileRangeIsTheRankRange) {
  const data::CurriculumDraw d = make_draw(301, true, 1);
  EXPECT_EQ(d.eligible(50), (std::pair<std::size_t, std::size_t>{30, 150}));
  EXPECT_EQ(d.eligible(100), (std::pair<std::size_t, std::size_t>{30, 301}));
  EXPECT_EQ(d.eligible(5).second - d.eligible(5).first, 0u);  // below min: empty
}

TEST(CurriculumDraw, WindowsAreEligibleDistinctAndSplitByRank) {
  for (bool pct : {false, true}) {
    const data::CurriculumDraw d = make_draw(301, pct, 5);
    for (std::int64_t micro = 0; micro < 20; ++micro) {
      const auto [first, last] = d.eligible(d.difficulty(micro / d.accum));
      const std::set<std::uint32_t> ok(d.sorted.begin() + first, d.sorted.begin() + last);
      std::set<std::uint32_t> all;
      for (int rank = 0; rank < 3; ++rank)
        for (std::uint32_t w : d.draw(micro, rank, 3, 4)) {
          EXPECT_TRUE(ok.count(w)) << "window " << w << " outside the eligible set at micro " << micro;
          all.insert(w);
        }
      EXPECT_EQ(all.size(), 12u) << "repeated window in a global micro-batch";
    }
  }
}

TEST(CurriculumDraw, PureFunctionOfSeedAndMicroBatch) {
  const data::CurriculumDraw a = make_draw(301, true, 5), b = make_draw(301, true, 5), c = make_draw(301, true, 6);
  int differ = 0;
  for (std::int64_t micro = 7; micro >= 0; --micro) {  // any order: no state between draws
    EXPECT_EQ(a.draw(micro, 1, 2, 4), b.draw(micro, 1, 2, 4));
    differ += a.draw(micro, 1, 2, 4) != c.draw(micro, 1, 2, 4);
  }
  EXPECT_GT(differ, 4);
  EXPECT_NE(a.draw(0, 0, 1, 4), a.draw(1 * a.accum, 0, 1, 4));
}

TEST(CurriculumDraw, SmallSetDrawsWithReplacementAndEmptySetIsAnError) {
  data::CurriculumDraw d = make_draw(20, true, 3);
  d.difficulty = [](std::int64_t) { return std::int64_t(20); };  // positions [2, 4): two samples
  const auto w = d.draw(0, 0, 1, 5);
  ASSERT_EQ(w.size(), 5u);
  for (std::uint32_t x : w) EXPECT_TRUE(x == d.sorted[2] || x == d.sorted[3]);
  d.difficulty = [](std::int64_t) { return std::int64_t(5); };
  try {
    d.draw(3, 0, 1, 2);
    FAIL() << "no error for an empty eligible set";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no sample is eligible at step 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cutrain
