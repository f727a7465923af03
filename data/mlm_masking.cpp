#include "data/mlm_masking.h"

#include <algorithm>
#include <utility>

#include "runtime/error.h"

namespace cutrain::data {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t CounterRng::key(uint64_t seed, uint64_t stream, uint64_t number) {
  return mix(mix(seed + kGolden * (stream + 1)) ^ (number + kGolden));
}

uint64_t CounterRng::next() {
  state_ += kGolden;
  return mix(state_);
}

uint64_t CounterRng::below(uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
}

int mlm_num_predictions(const MlmRule& rule, int len) {
  const int rounded = (15 * len + 50) / 100;
  return std::min(rule.max_predictions, std::max(1, rounded));
}

int mask_sample(const MlmRule& rule, uint64_t seed, uint64_t sample, int32_t* tokens, int32_t* labels, int len,
                int row_len, int32_t* scratch) {
  CUTRAIN_CHECK(len >= 1 && len <= row_len, "masked LM: a sample of ", len, " tokens in a row of ", row_len,
                " (expected 1 <= length <= row)");
  CUTRAIN_CHECK(rule.max_predictions >= 1, "masked LM: max_predictions_per_seq must be >= 1, found ",
                rule.max_predictions);
  CUTRAIN_CHECK(rule.mask_id >= 0 && rule.pad_id >= 0 && rule.random_tokens >= 1,
                "masked LM: [MASK] and [PAD] ids and the random-token range must be set, found mask ", rule.mask_id,
                " pad ", rule.pad_id, " random range ", rule.random_tokens);
  std::fill(labels, labels + row_len, kIgnoreLabel);
  std::fill(tokens + len, tokens + row_len, rule.pad_id);
  const int n = mlm_num_predictions(rule, len);
  for (int i = 0; i < len; ++i) scratch[i] = i;
  CounterRng rng(CounterRng::key(seed, kStreamMask, sample));
  for (int i = 0; i < n; ++i) std::swap(scratch[i], scratch[i + int(rng.below(uint64_t(len - i)))]);
  for (int i = 0; i < n; ++i) {
    const int p = scratch[i];
    labels[p] = tokens[p];
    const uint64_t r = rng.below(10);
    if (r < 8) tokens[p] = rule.mask_id;
    else if (r == 8) tokens[p] = int32_t(rng.below(uint64_t(rule.random_tokens)));
  }
  return n;
}

}  // namespace cutrain::data
