// @brief BERT's masked-LM rule on one sample (Google's create_pretraining_data, as DeepSpeed's
// bing_bert data uses it): 15% of the sample's real tokens chosen (at least 1, at most
// max_predictions_per_seq), of those 80% -> [MASK], 10% -> a random real token, 10% unchanged;
// labels = the original token at chosen positions, kIgnoreLabel elsewhere and on padding. Every
// draw comes from a counter-based generator keyed by (seed, stream, number), so a sample's tokens
// and masks are a pure function of the seed and the sample's number (a resumed run draws the same),
// and tests/scripts/mlm_reference.py reproduces them exactly in plain Python.
#pragma once

#include <cstdint>

namespace cutrain::data {

inline constexpr int32_t kIgnoreLabel = -100;  // the loss skips these rows (PyTorch's ignore_index)

// SplitMix64 (Steele, Lea, Flood 2014) from a key: small, fully specified, the same in Python.
class CounterRng {
 public:
  // The key of draw stream `stream` of item `number` under `seed` (streams below).
  static uint64_t key(uint64_t seed, uint64_t stream, uint64_t number);
  explicit CounterRng(uint64_t key) : state_(key) {}
  uint64_t next();
  // Uniform in [0, n) as (next() * n) >> 64 (n >= 1; the bias is below n / 2^64).
  uint64_t below(uint64_t n);

 private:
  uint64_t state_;
};

// The generator's streams: which draw a key is for.
enum MlmStream : uint64_t {
  kStreamMask = 1,       // the masking of sample number k
  kStreamSynthetic = 2,  // the tokens and length of synthetic sample number k
  kStreamEpoch = 3,      // the sample order of epoch e
};

struct MlmRule {
  int max_predictions = 20;      // max_predictions_per_seq (bing_bert's flag)
  int32_t mask_id = -1;          // [MASK]
  int32_t pad_id = -1;           // [PAD]
  int32_t random_tokens = 50256;  // a random replacement is uniform in [0, random_tokens) (the real tokens)
};

// The number of positions the rule chooses in a sample of `len` real tokens:
// min(max_predictions, max(1, round(0.15 * len))), rounding halves up ((15 len + 50) / 100).
int mlm_num_predictions(const MlmRule& rule, int len);

// Masks `tokens[0, len)` in place and writes labels[0, row_len): the original token at each chosen
// position, kIgnoreLabel elsewhere; tokens[len, row_len) become [PAD]. Draws from
// CounterRng(key(seed, kStreamMask, sample)): positions by a partial Fisher-Yates over [0, len)
// (position i swapped with i + below(len - i), the first n chosen), then per chosen position in
// that order r = below(10): r < 8 -> [MASK], r == 8 -> below(random_tokens), r == 9 -> unchanged.
// Returns the number of chosen positions. `scratch` holds at least len ints.
int mask_sample(const MlmRule& rule, uint64_t seed, uint64_t sample, int32_t* tokens, int32_t* labels, int len,
                int row_len, int32_t* scratch);

}  // namespace cutrain::data
