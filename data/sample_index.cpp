#include "data/sample_index.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/json_util.h"
#include "runtime/xxhash64.h"

namespace cutrain::data {
namespace {

constexpr const char* kFormat = "cutrain-curriculum-index";
constexpr int kVersion = 1;

}  // namespace

std::vector<ShardFingerprint> fingerprint_shards(const std::vector<std::string>& files) {
  std::vector<ShardFingerprint> out;
  for (const std::string& f : files) {
    const FileDigest d = xxh64_file(f);
    out.push_back({f, d.bytes, d.xxh64});
  }
  return out;
}

void sort_and_rank(SampleIndex& index) {
  const auto n = index.values.size();
  CUTRAIN_CHECK(n > 0 && n < std::size_t(UINT32_MAX), "curriculum index: ", n, " samples (expected 1..", UINT32_MAX - 1, ")");
  index.sorted.resize(n);
  std::iota(index.sorted.begin(), index.sorted.end(), 0u);
  std::stable_sort(index.sorted.begin(), index.sorted.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return index.values[a] < index.values[b]; });
  index.percentiles.resize(101);
  for (std::size_t p = 0; p <= 100; ++p) {
    // Nearest rank: the smallest value with at least p% of the samples at or below it.
    const std::size_t rank = static_cast<std::size_t>(std::ceil(static_cast<double>(p) * static_cast<double>(n) / 100.0));
    index.percentiles[p] = index.values[index.sorted[rank == 0 ? 0 : rank - 1]];
  }
}

void write_sample_index(const std::string& path, const SampleIndex& index) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["metric"] = index.metric;
  j["seq_len"] = index.seq_len;
  j["window_len"] = index.window_len;
  j["vocab_size"] = index.vocab_size;
  j["num_samples"] = index.values.size();
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& s : index.shards) shards.push_back({{"path", s.path}, {"bytes", s.bytes}, {"xxh64", xxh64_hex(s.xxh64)}});
  j["shards"] = shards;
  j["percentiles"] = index.percentiles;
  j["index_to_metric"] = index.values;
  j["index_to_sample"] = index.sorted;
  write_file_atomic(path, j.dump() + "\n");
}

SampleIndex read_sample_index(const std::string& path) {
  const nlohmann::json j = parse_json_strict(read_text_file(path), path);
  const auto field = [&](const char* key) -> const nlohmann::json& {
    CUTRAIN_CHECK(j.is_object() && j.contains(key), "curriculum index '", path, "': no field '", key,
                  "' (expected a file written by cutrain analyze-data)");
    return j.at(key);
  };
  CUTRAIN_CHECK(field("format") == kFormat && field("version") == kVersion, "curriculum index '", path,
                "': expected format ", kFormat, " version ", kVersion, ", found ", describe_json(j.at("format")), " version ",
                describe_json(j.at("version")));
  SampleIndex idx;
  try {
    idx.metric = field("metric").get<std::string>();
    idx.seq_len = field("seq_len").get<std::int64_t>();
    idx.window_len = field("window_len").get<std::int64_t>();
    idx.vocab_size = field("vocab_size").get<std::int32_t>();
    for (const auto& s : field("shards"))
      idx.shards.push_back({s.at("path").get<std::string>(), s.at("bytes").get<std::uint64_t>(),
                            std::stoull(s.at("xxh64").get<std::string>(), nullptr, 16)});
    idx.values = field("index_to_metric").get<std::vector<double>>();
    idx.sorted = field("index_to_sample").get<std::vector<std::uint32_t>>();
    idx.percentiles = field("percentiles").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::concat("curriculum index '", path, "': a field has the wrong type: ", e.what()), __FILE__, __LINE__);
  }
  const std::size_t n = idx.values.size();
  CUTRAIN_CHECK(field("num_samples").get<std::size_t>() == n && idx.sorted.size() == n && idx.percentiles.size() == 101,
                "curriculum index '", path, "': num_samples ", describe_json(j.at("num_samples")), ", ", n,
                " metric values, ", idx.sorted.size(), " sorted samples and ", idx.percentiles.size(),
                " percentiles do not agree (expected n, n, n and 101)");
  std::vector<bool> seen(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t s = idx.sorted[i];
    CUTRAIN_CHECK(s < n && !seen[s], "curriculum index '", path, "': index_to_sample[", i, "] = ", s,
                  " is out of range or repeated");
    seen[s] = true;
    CUTRAIN_CHECK(i == 0 || idx.values[idx.sorted[i - 1]] <= idx.values[s], "curriculum index '", path,
                  "': index_to_sample is not ordered by the metric at position ", i);
  }
  return idx;
}

void check_index_matches(const SampleIndex& index, const std::string& index_path, const std::vector<std::string>& files,
                         std::int64_t seq_len) {
  CUTRAIN_CHECK(index.seq_len == seq_len, "curriculum index '", index_path, "' was built for sequence length ",
                index.seq_len, ", this run's is ", seq_len, " (its samples are other windows): run cutrain analyze-data "
                "with --seq_length ", seq_len);
  CUTRAIN_CHECK(index.shards.size() == files.size(), "curriculum index '", index_path, "' is from another dataset: it was built from ",
                index.shards.size(), " shard(s), the data has ", files.size());
  const auto now = fingerprint_shards(files);
  for (std::size_t i = 0; i < files.size(); ++i)
    CUTRAIN_CHECK(now[i].bytes == index.shards[i].bytes && now[i].xxh64 == index.shards[i].xxh64, "curriculum index '",
                  index_path, "' is from another dataset: shard ", i, " '", files[i], "' has ", now[i].bytes,
                  " bytes, XXH64 ", xxh64_hex(now[i].xxh64), "; the index's '", index.shards[i].path, "' had ",
                  index.shards[i].bytes, " bytes, XXH64 ", xxh64_hex(index.shards[i].xxh64));
}

}  // namespace cutrain::data
