// @brief The typed data_efficiency section of the DeepSpeed config (curriculum learning's metrics
// and pacing; random-LTD's layers and schedule) and the legacy top-level curriculum_learning
// section. Parsed by train/config_data_efficiency.cpp; the pacing function is
// train/curriculum_schedule.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/choices.h"

namespace cutrain::train {

// schedule_type + schedule_config: difficulty as a function of the step.
struct PacingConfig {
  CurriculumSchedule type = CurriculumSchedule::FixedLinear;
  std::int64_t min_difficulty = 0, max_difficulty = 0;
  // fixed_linear / fixed_root
  std::int64_t total_curriculum_step = 0;
  std::int64_t difficulty_step = 1;
  double root_degree = 1;  // fixed_root only (fixed_linear is degree 1)
  // fixed_discrete: difficulty[i] up to step max_step[i], the last one after (one more difficulty)
  std::vector<std::int64_t> difficulty;
  std::vector<std::int64_t> max_step;
};

// One entry of curriculum_metrics.
struct CurriculumMetricConfig {
  CurriculumMetric metric = CurriculumMetric::VocabularyRarity;
  std::string index_to_sample_path, index_to_metric_path;
  DifficultyType difficulty_type = DifficultyType::Value;
  ClusteringType clustering_type = ClusteringType::ScheduleBased;
  PacingConfig pacing;
};

// data_routing.random_ltd (DeepSpeed's key names; docs/data-efficiency.md).
struct RandomLtdConfig {
  bool enabled = false;           // random_ltd.enabled
  int total_layer_num = 0;        // must be the model's block count (checked at the run's start)
  int layer_num = 0;              // random_ltd_layer_num: layer_ids.size()
  std::vector<int> layer_ids;     // random_ltd_layer_id: the blocks that drop tokens, as given
  std::string model_mask_name;    // read, warned: the mask is the model's own
  RandomLtdModelType model_type = RandomLtdModelType::Decoder;
  HiddenStateOrder hidden_state_order = HiddenStateOrder::BatchSeqDim;  // read, warned
  // random_ltd_schedule: the kept token count per sequence, min_value .. max_value over
  // require_steps, rounded down to a multiple of seq_per_step (train/random_ltd_schedule.h).
  RandomLtdSchedule schedule_type = RandomLtdSchedule::FixedLinear;
  std::int64_t min_value = 0, max_value = 0;
  std::int64_t require_steps = 1, seq_per_step = 1;
  bool layer_token_lr_enabled = false;  // layer_token_lr_schedule.enabled (true: an error)
};

struct DataEfficiencyConfig {
  bool enabled = false;
  std::uint64_t seed = 1234;
  bool sampling_enabled = false;  // data_sampling.enabled
  int num_epochs = 1000;
  int num_workers = 0;
  bool curriculum_enabled = false;  // data_sampling.curriculum_learning.enabled
  std::string data_cluster_path;
  std::vector<CurriculumMetricConfig> metrics;  // in the file's order
  bool routing_enabled = false;  // data_routing.enabled
  RandomLtdConfig random_ltd;
  // All three switches on: the curriculum applies (DeepSpeed's rule).
  bool curriculum_active() const { return enabled && sampling_enabled && curriculum_enabled; }
  // data_efficiency.enabled, data_routing.enabled and random_ltd.enabled: random-LTD applies.
  bool random_ltd_active() const { return enabled && routing_enabled && random_ltd.enabled; }
};

// The legacy top-level curriculum_learning: a sequence-length warm-up.
struct LegacyCurriculumConfig {
  bool enabled = false;
  CurriculumMetric curriculum_type = CurriculumMetric::SeqlenTruncate;  // "seqlen"
  PacingConfig pacing;
};

}  // namespace cutrain::train
