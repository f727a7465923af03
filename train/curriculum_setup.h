// @brief The vocabularyrarity curriculum of `cutrain train --use_real_data`: the index named by the
// config, checked against the training shards, and the draw (data/curriculum_draw.h) with the
// config's pacing (train/curriculum_schedule.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/curriculum_draw.h"
#include "train/config.h"

namespace cutrain::train {

struct CurriculumSetup {
  std::shared_ptr<const data::CurriculumDraw> draw;
  std::string index_path;  // as resolved
  std::string describe;    // one line for the log
};

// The curriculum when data_efficiency's three switches are on and a metric is vocabularyrarity,
// else nullopt. A relative index path is taken from the config file's folder. Errors (index missing,
// from other shards or another sequence length, index_to_metric_path naming another file) name the
// config key and the file, before any step.
std::optional<CurriculumSetup> make_curriculum(const TrainConfig& cfg, const std::filesystem::path& config_path,
                                               const std::vector<std::string>& shard_patterns, std::int64_t seq_len,
                                               std::int64_t window_len, std::int64_t accum);

}  // namespace cutrain::train
