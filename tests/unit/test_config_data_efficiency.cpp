// CPU tests of the data_efficiency section and the legacy curriculum_learning section: every key
// read into its typed field, the warnings of what is not acted on, and each error naming the key,
// what was expected and what was found.
#include <gtest/gtest.h>

#include <algorithm>

#include <filesystem>
#include <initializer_list>
#include <string>

#include "train/config.h"
#include "train/config_keys.h"

using namespace cutrain;

namespace {

constexpr const char* kMetrics = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics";

// A config with data_efficiency.data_sampling.curriculum_learning = `curriculum` (all enabled).
std::string with_curriculum(const std::string& metrics, const std::string& extra = "") {
  return R"({"train_micro_batch_size_per_gpu": 1, "data_efficiency": {"enabled": true, "seed": 7,
    "data_sampling": {"enabled": true, "num_epochs": 3, "num_workers": 2, "curriculum_learning": {"enabled": true,)" +
         extra + R"( "curriculum_metrics": {)" + metrics + "}}}}}";
}

const std::string kRarity = R"("vocabularyrarity": {"index_to_sample_path": "idx/rarity.json",
    "index_to_metric_path": "idx/rarity.json", "difficulty_type": "percentile", "clustering_type": "single_cluster",
    "min_difficulty": 1, "max_difficulty": 100, "schedule_type": "fixed_root",
    "schedule_config": {"total_curriculum_step": 1000, "difficulty_step": 1, "root_degree": 2}})";

void expect_error(const std::string& text, std::initializer_list<std::string> parts) {
  try {
    train::parse_config(text, "de.json");
    ADD_FAILURE() << "no ConfigError for: " << text;
  } catch (const train::ConfigError& e) {
    for (const auto& p : parts) EXPECT_NE(e.message().find(p), std::string::npos) << "missing '" << p << "' in: " << e.message();
  }
}

bool has_warning(const train::TrainConfig& c, const std::string& part) {
  for (const auto& w : c.warnings)
    if (w.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(ConfigDataEfficiency, EveryKeyReadIntoItsField) {
  const train::TrainConfig c = train::parse_config(with_curriculum(kRarity, R"( "data_cluster_path": "clusters/",)"), "de.json");
  const auto& d = c.data_efficiency;
  EXPECT_TRUE(d.curriculum_active());
  EXPECT_EQ(d.seed, 7u);
  EXPECT_EQ(d.num_epochs, 3);
  EXPECT_EQ(d.num_workers, 2);
  EXPECT_EQ(d.data_cluster_path, "clusters/");
  ASSERT_EQ(d.metrics.size(), 1u);
  const auto& m = d.metrics[0];
  EXPECT_EQ(m.metric, train::CurriculumMetric::VocabularyRarity);
  EXPECT_EQ(m.index_to_sample_path, "idx/rarity.json");
  EXPECT_EQ(m.difficulty_type, train::DifficultyType::Percentile);
  EXPECT_EQ(m.clustering_type, train::ClusteringType::SingleCluster);
  EXPECT_EQ(m.pacing.type, train::CurriculumSchedule::FixedRoot);
  EXPECT_EQ(m.pacing.min_difficulty, 1);
  EXPECT_EQ(m.pacing.max_difficulty, 100);
  EXPECT_EQ(m.pacing.total_curriculum_step, 1000);
  EXPECT_EQ(m.pacing.root_degree, 2.0);
  // The curriculum's keys are acted on; exactly the ones cutrain's draw does not use warn.
  EXPECT_EQ(c.warnings.size(), 4u);
  for (const char* k : {"data_cluster_path", "data_sampling.num_epochs", "data_sampling.num_workers",
                        "curriculum_metrics.vocabularyrarity.clustering_type"})
    EXPECT_TRUE(has_warning(c, std::string(k) + " is read but not acted on")) << k;
}

TEST(ConfigDataEfficiency, DisabledSectionsAreSilent) {
  const train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1,
    "data_efficiency": {"enabled": false, "data_routing": {"enabled": false, "random_ltd": {"enabled": false}},
      "data_sampling": {"enabled": false, "curriculum_learning": {"enabled": false}}},
    "curriculum_learning": {"enabled": false}})", "de.json");
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.at(0);
  EXPECT_FALSE(c.data_efficiency.curriculum_active());
}

TEST(ConfigDataEfficiency, SeqlenMetricsAreActedOn) {
  const std::string seqlen = R"("seqlen_truncate": {"min_difficulty": 64, "max_difficulty": 1024, "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8}})";
  const train::TrainConfig s = train::parse_config(with_curriculum(seqlen), "de.json");
  EXPECT_EQ(s.data_efficiency.metrics.at(0).metric, train::CurriculumMetric::SeqlenTruncate);
  // The sequence-length curriculum (train/seqlen_curriculum.h) acts on it: no warning for the
  // metric (with_curriculum's num_epochs / num_workers warn on their own).
  EXPECT_FALSE(has_warning(s, "seqlen_truncate"));
  EXPECT_EQ(s.warnings.size(), 2u);
}

TEST(ConfigDataEfficiency, LegacyCurriculum) {
  const train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "curriculum_learning": {
    "enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 1024,
    "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [8, 64, 1024], "max_step": [10, 20]}}})", "de.json");
  EXPECT_TRUE(c.curriculum_learning.enabled);
  EXPECT_EQ(c.curriculum_learning.pacing.type, train::CurriculumSchedule::FixedDiscrete);
  EXPECT_EQ(c.curriculum_learning.pacing.difficulty, (std::vector<std::int64_t>{8, 64, 1024}));
  EXPECT_EQ(c.curriculum_learning.pacing.max_step, (std::vector<std::int64_t>{10, 20}));
  // The sequence-length warm-up acts on every key (train/seqlen_curriculum.h): no warning.
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.at(0);
  expect_error(R"({"curriculum_learning": {"enabled": true, "curriculum_type": "vocab"}})",
               {"de.json: curriculum_learning.curriculum_type: expected \"seqlen\"", "found string \"vocab\""});
  expect_error(R"({"curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", "max_difficulty": 10,
    "schedule_type": "fixed_linear", "schedule_config": {}}})",
               {"curriculum_learning.min_difficulty: expected an integer, found nothing"});
}

TEST(ConfigDataEfficiency, ErrorsNameKeyExpectedAndFound) {
  const std::string mp = std::string(kMetrics);
  // An unknown metric: an error even without strict (nothing could compute it).
  expect_error(with_curriculum(R"("perplexity": {})"), {mp + ".perplexity: expected a metric, one of \"seqlen_truncate\", \"seqlen_reshape\", \"vocabularyrarity\", found \"perplexity\""});
  // Unknown pacing, with the nearest name.
  const std::string rarity = mp + ".vocabularyrarity";
  const auto metric = [](const std::string& body) { return with_curriculum(R"("vocabularyrarity": {"index_to_sample_path": "i", )" + body); };
  expect_error(metric(R"("min_difficulty": 1, "max_difficulty": 9, "schedule_type": "fixed_linaer", "schedule_config": {}})"),
               {rarity + ".schedule_type: expected one of \"fixed_linear\", \"fixed_root\", \"fixed_discrete\"",
                "found string \"fixed_linaer\"", "nearest: fixed_linear"});
  expect_error(metric(R"("min_difficulty": 1, "max_difficulty": 9, "schedule_type": "custom", "schedule_config": {}})"),
               {rarity + ".schedule_type: \"custom\" needs a Python function"});
  // Inconsistent lists.
  expect_error(metric(R"("min_difficulty": 1, "max_difficulty": 9, "schedule_type": "fixed_discrete",
    "schedule_config": {"difficulty": [1, 9], "max_step": [5, 10]}})"),
               {rarity + ".schedule_config.difficulty: expected one more difficulty", "found 2 difficulties and 2 max_step"});
  expect_error(metric(R"("min_difficulty": 1, "max_difficulty": 9, "schedule_type": "fixed_discrete",
    "schedule_config": {"difficulty": [1, 5, 9], "max_step": [10, 10]}})"),
               {rarity + ".schedule_config.max_step[1]: expected increasing steps, found 10 after 10"});
  expect_error(metric(R"("min_difficulty": 1, "max_difficulty": 9, "schedule_type": "fixed_discrete",
    "schedule_config": {"difficulty": [1, 12], "max_step": [10]}})"),
               {rarity + ".schedule_config.difficulty[1]: expected a difficulty in [min_difficulty 1, max_difficulty 9], found 12"});
  // A parameter of another pacing is an error (it would be silently ignored).
  expect_error(metric(R"("min_difficulty": 1, "max_difficulty": 9, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 1, "root_degree": 2}})"),
               {rarity + ".schedule_config.root_degree: unknown key 'root_degree'"});
  expect_error(metric(R"("min_difficulty": 1, "max_difficulty": 9, "schedule_type": "fixed_root",
    "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 1}})"),
               {rarity + ".schedule_config.root_degree: expected a number > 0, found nothing (fixed_root needs it)"});
  expect_error(metric(R"("min_difficulty": 1, "max_difficulty": 9, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 0, "difficulty_step": 1}})"),
               {rarity + ".schedule_config.total_curriculum_step: expected a positive integer, found number 0"});
  expect_error(metric(R"("min_difficulty": 10, "max_difficulty": 9, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 1}})"),
               {rarity + ".max_difficulty: expected max_difficulty >= min_difficulty 10, found 9"});
  expect_error(metric(R"("difficulty_type": "percentile", "min_difficulty": 1, "max_difficulty": 101,
    "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 1}})"),
               {rarity + ".max_difficulty: expected an integer in [0, 100], found number 101"});
  expect_error(metric(R"("difficulty_type": "rank", "min_difficulty": 1, "max_difficulty": 9})"),
               {rarity + ".difficulty_type: expected one of \"value\", \"percentile\", found string \"rank\""});
  // The vocabularyrarity curriculum draws by an index: enabled without one is an error.
  expect_error(with_curriculum(R"("vocabularyrarity": {"min_difficulty": 1, "max_difficulty": 9, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 1}})"),
               {rarity + ".index_to_sample_path: expected the index file of `cutrain analyze-data", "found nothing"});
  expect_error(with_curriculum(""), {mp + ": expected at least one metric, found none"});
}

// The shipped example: strict, its keys acted on but num_workers (cutrain's draw has no workers).
TEST(ConfigDataEfficiency, ShippedCurriculumConfigLoads) {
  train::ConfigLoadOptions strict;
  strict.strict = true;
  const train::TrainConfig c = train::load_config(
      std::filesystem::path(CUTRAIN_SOURCE_DIR) / "configs" / "curriculum_vocabularyrarity.json", strict);
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_TRUE(has_warning(c, "data_efficiency.data_sampling.num_workers is read but not acted on"));
  EXPECT_TRUE(has_warning(c, "curriculum_metrics.vocabularyrarity.clustering_type is read but not acted on"));
  ASSERT_EQ(c.data_efficiency.metrics.size(), 1u);
  const auto& p = c.data_efficiency.metrics[0].pacing;
  EXPECT_EQ(p.type, train::CurriculumSchedule::FixedRoot);
  EXPECT_EQ(p.total_curriculum_step, 1000);
  EXPECT_FALSE(c.data_efficiency.random_ltd_active());
}
