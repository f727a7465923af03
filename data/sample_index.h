// @brief The curriculum index `cutrain analyze-data` writes: a difficulty metric for each sample (a
// window of the batch sampler, data/batch_sampler.h), the samples sorted by it (difficulty ->
// samples), the metric's percentiles, and a fingerprint of the shards (each one's size and XXH64) so
// an index is never used with another dataset. One JSON file, written atomically.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cutrain::data {

struct ShardFingerprint {
  std::string path;  // as given (informational; the match is by size and hash, in order)
  std::uint64_t bytes = 0;
  std::uint64_t xxh64 = 0;
};

struct SampleIndex {
  std::string metric;  // "seqlen" or "vocabularyrarity"
  std::int64_t seq_len = 0, window_len = 0;
  std::int32_t vocab_size = 0;
  std::vector<ShardFingerprint> shards;
  std::vector<double> values;          // index_to_metric: the metric of sample (window) i
  std::vector<std::uint32_t> sorted;   // index_to_sample: samples by ascending value, ties by id
  std::vector<double> percentiles;     // 101 values: percentiles[p], nearest rank (p = 0: the minimum)
};

// The fingerprints of `files` (size + XXH64 of each whole file). Errors name the file.
std::vector<ShardFingerprint> fingerprint_shards(const std::vector<std::string>& files);

// Fills `sorted` and `percentiles` from `values`.
void sort_and_rank(SampleIndex& index);

void write_sample_index(const std::string& path, const SampleIndex& index);
// Reads and checks an index (format, sizes, that `sorted` is a permutation ordered by `values`).
// Errors name the file and the field.
SampleIndex read_sample_index(const std::string& path);
// An error unless `index` was built from exactly these shard files (sizes and hashes, in order),
// with this sequence length: the message names the index, the first shard that differs and how.
void check_index_matches(const SampleIndex& index, const std::string& index_path, const std::vector<std::string>& files,
                         std::int64_t seq_len);

}  // namespace cutrain::data
