// @brief The curriculum's draw: which windows make a micro-batch when only the samples whose
// difficulty lies in [min_difficulty, the pacing's difficulty at the step] are eligible. The index
// (data/sample_index.h) sorts the samples by difficulty, so the eligible set is one contiguous
// range of its sorted order. The draw is a pure function of (seed, micro-batch number): a resumed
// run draws the same batches.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace cutrain::data {

struct CurriculumDraw {
  std::vector<std::uint32_t> sorted;  // sample (window) ids by ascending difficulty (index_to_sample)
  std::vector<double> sorted_values;  // their difficulty values, same order
  bool percentile = false;            // difficulties are percentiles (0-100) of the sorted order
  std::int64_t min_difficulty = 0;
  std::function<std::int64_t(std::int64_t step)> difficulty;  // the pacing: difficulty at optimizer step
  std::int64_t accum = 1;  // micro-batches per optimizer step (micro m belongs to step m / accum)
  std::uint64_t seed = 0;

  // Positions [first, last) of `sorted` eligible at the difficulty ceiling `max_d`:
  // value: min_difficulty <= value <= max_d; percentile: positions N*min/100 <= i < N*max_d/100
  // (the samples of the lowest max_d percent, the lowest min percent left out).
  std::pair<std::size_t, std::size_t> eligible(std::int64_t max_d) const;
  // The windows of micro-batch `micro` for `rank`: B distinct windows of the global micro-batch's
  // B*world, drawn uniformly from the eligible set of its step (with replacement only when the set
  // holds fewer than B*world). An empty set is an error naming the step and the range.
  std::vector<std::uint32_t> draw(std::int64_t micro, int rank, int world, std::int64_t batch) const;
};

}  // namespace cutrain::data
