#include "train/curriculum_setup.h"

#include "data/batch_sampler.h"
#include "data/sample_index.h"
#include "runtime/error.h"
#include "train/curriculum_schedule.h"

namespace cutrain::train {

namespace {
constexpr const char* kMetricPath = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.vocabularyrarity";

std::filesystem::path resolve(const std::filesystem::path& config_path, const std::string& p) {
  const std::filesystem::path f(p);
  return f.is_absolute() ? f : config_path.parent_path() / f;
}
}  // namespace

std::optional<CurriculumSetup> make_curriculum(const TrainConfig& cfg, const std::filesystem::path& config_path,
                                               const std::vector<std::string>& shard_patterns, std::int64_t seq_len,
                                               std::int64_t window_len, std::int64_t accum) {
  const DataEfficiencyConfig& de = cfg.data_efficiency;
  if (!de.curriculum_active()) return std::nullopt;
  const CurriculumMetricConfig* m = nullptr;
  for (const auto& c : de.metrics)
    if (c.metric == CurriculumMetric::VocabularyRarity) m = &c;
  if (!m) return std::nullopt;
  const std::filesystem::path index = resolve(config_path, m->index_to_sample_path);
  CUTRAIN_CHECK(std::filesystem::is_regular_file(index), config_path.string(), ": ", kMetricPath,
                ".index_to_sample_path: expected the index of `cutrain analyze-data --metric vocabularyrarity` (a path "
                "relative to the config's folder), found no file ", index.string());
  if (!m->index_to_metric_path.empty()) {
    const std::filesystem::path other = resolve(config_path, m->index_to_metric_path);
    std::error_code ec;
    CUTRAIN_CHECK(std::filesystem::equivalent(index, other, ec), config_path.string(), ": ", kMetricPath,
                  ".index_to_metric_path: expected the same file as index_to_sample_path (cutrain's index holds both "
                  "mappings), found ", other.string(), " against ", index.string());
  }
  const data::SampleIndex idx = data::read_sample_index(index.string());
  CUTRAIN_CHECK(idx.metric == "vocabularyrarity", index.string(), ": metric: expected \"vocabularyrarity\" (",
                kMetricPath, "), found \"", idx.metric, "\"");
  data::check_index_matches(idx, index.string(), data::expand_shard_patterns(shard_patterns), seq_len);
  CUTRAIN_CHECK(idx.window_len == window_len, index.string(), ": window_len: expected ", window_len,
                " (the run's labels: ", window_len > seq_len ? "next_token" : "identity", "), found ", idx.window_len,
                " (rebuild it with the run's --labels)");

  auto draw = std::make_shared<data::CurriculumDraw>();
  draw->sorted = idx.sorted;
  draw->sorted_values.reserve(idx.sorted.size());
  for (std::uint32_t s : idx.sorted) draw->sorted_values.push_back(idx.values[s]);
  draw->percentile = m->difficulty_type == DifficultyType::Percentile;
  draw->min_difficulty = m->pacing.min_difficulty;
  auto pacing = std::make_shared<CurriculumPacing>(m->pacing);
  // DeepSpeed passes the 1-based step about to run.
  draw->difficulty = [pacing](std::int64_t step) { return pacing->difficulty(step + 1); };
  draw->accum = accum;
  draw->seed = de.seed;

  CurriculumSetup s;
  s.draw = draw;
  s.index_path = index.string();
  s.describe = "curriculum: vocabularyrarity from " + index.string() + " (" + std::to_string(idx.sorted.size()) +
               " samples, difficulty " + name(m->difficulty_type) + " " + std::to_string(m->pacing.min_difficulty) +
               " -> " + std::to_string(m->pacing.max_difficulty) + ", " + name(m->pacing.type) + ", seed " +
               std::to_string(de.seed) + ")";
  return s;
}

}  // namespace cutrain::train
