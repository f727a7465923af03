#include "data/curriculum_draw.h"

#include <algorithm>
#include <random>
#include <unordered_set>

#include "runtime/error.h"

namespace cutrain::data {

namespace {
// Uniform in [0, n) by rejection (no modulo bias; mt19937_64 is fully specified, so the draw does
// not depend on the standard library's distributions).
std::uint64_t below(std::mt19937_64& rng, std::uint64_t n) {
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  std::uint64_t r;
  do r = rng(); while (r >= limit);
  return r % n;
}
}  // namespace

std::pair<std::size_t, std::size_t> CurriculumDraw::eligible(std::int64_t max_d) const {
  const std::size_t n = sorted.size();
  if (percentile) {
    const auto at = [&](std::int64_t p) {
      return std::size_t(std::clamp<std::int64_t>(p, 0, 100) * std::int64_t(n) / 100);
    };
    return {at(min_difficulty), std::max(at(min_difficulty), at(max_d))};
  }
  const auto first = std::lower_bound(sorted_values.begin(), sorted_values.end(), double(min_difficulty));
  const auto last = std::upper_bound(first, sorted_values.end(), double(max_d));
  return {std::size_t(first - sorted_values.begin()), std::size_t(last - sorted_values.begin())};
}

std::vector<std::uint32_t> CurriculumDraw::draw(std::int64_t micro, int rank, int world, std::int64_t batch) const {
  const std::int64_t step = micro / accum;
  const std::int64_t d = difficulty(step);
  const auto [first, last] = eligible(d);
  CUTRAIN_CHECK(last > first, "curriculum: no sample is eligible at step ", step, ": difficulty ", (percentile ? "percentile " : "value "),
                "[", min_difficulty, ", ", d, "] selects none of the index's ", sorted.size(), " samples (values ",
                sorted_values.empty() ? 0.0 : sorted_values.front(), " .. ", sorted_values.empty() ? 0.0 : sorted_values.back(),
                "); raise min/max_difficulty or the schedule's start");
  const std::uint64_t n = last - first, global = std::uint64_t(batch) * std::uint64_t(world);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull ^ (std::uint64_t(micro) * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull));
  std::vector<std::uint64_t> picks;
  picks.reserve(global);
  if (n >= global) {
    // Distinct picks by rejection of repeats (global is small next to n in the usual case).
    std::unordered_set<std::uint64_t> seen;
    while (picks.size() < global) {
      const std::uint64_t p = below(rng, n);
      if (seen.insert(p).second) picks.push_back(p);
    }
  } else {
    for (std::uint64_t i = 0; i < global; ++i) picks.push_back(below(rng, n));
  }
  std::vector<std::uint32_t> out;
  for (std::int64_t b = 0; b < batch; ++b) out.push_back(sorted[first + picks[std::size_t(rank * batch + b)]]);
  return out;
}

}  // namespace cutrain::data
