// The data_efficiency section (curriculum learning's metrics and pacing, random-LTD's layers and
// schedule) and
// the legacy top-level curriculum_learning. The metric entries are keyed by name, so their keys are
// read here by hand with their real paths and checked against the table's <metric> entries.
#include <algorithm>
#include <cmath>
#include <limits>

#include "train/config.h"
#include "train/config_keys.h"
#include "train/config_reader.h"

namespace cutrain::train::config_detail {
namespace {

constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr std::int64_t kMaxI64 = std::numeric_limits<std::int64_t>::max();
constexpr std::string_view kMetricTable = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>";

const json* need(Reader& r, const json& obj, const std::string& path, std::string_view key,
                 const std::string& expected, const std::string& why) {
  const json* v = Reader::find(obj, key);
  if (!v) r.fail_missing(join_path(path, key), expected, why);
  return v;
}

std::vector<std::int64_t> int_list(Reader& r, const json& v, const std::string& path, std::int64_t lo) {
  if (!v.is_array()) r.fail_expected(path, "an array of integers", v);
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(r.as_int(v[i], detail::concat(path, "[", i, "]"), lo, kMaxI64));
  return out;
}

// min_difficulty, max_difficulty (each in [lo, hi]), schedule_type and schedule_config of `obj` at `path`.
void parse_pacing(Reader& r, const json& obj, const std::string& path, std::int64_t lo, std::int64_t hi,
                  PacingConfig& p) {
  const std::string why = "curriculum learning needs it";
  p.min_difficulty = r.as_int(*need(r, obj, path, "min_difficulty", "an integer", why), path + ".min_difficulty", lo, hi);
  p.max_difficulty = r.as_int(*need(r, obj, path, "max_difficulty", "an integer", why), path + ".max_difficulty", lo, hi);
  if (p.max_difficulty < p.min_difficulty)
    r.fail(path + ".max_difficulty", detail::concat("expected max_difficulty >= min_difficulty ", p.min_difficulty,
                                                    ", found ", p.max_difficulty));
  const json* t = need(r, obj, path, "schedule_type", choices_text(kCurriculumSchedules), why);
  if (t->is_string() && t->get<std::string>() == "custom")
    r.fail(path + ".schedule_type", "\"custom\" needs a Python function (DeepSpeed's set_custom_get_difficulty); use "
                                    "fixed_linear, fixed_root or fixed_discrete");
  const std::string tp = path + ".schedule_type";
  std::vector<std::string_view> names;
  for (const auto& c : kCurriculumSchedules) names.push_back(c.name);
  if (!t->is_string()) r.fail_expected(tp, choices_text(kCurriculumSchedules), *t);
  bool found = false;
  for (const auto& c : kCurriculumSchedules)
    if (t->get<std::string>() == c.name) p.type = c.value, found = true;
  if (!found) r.fail_expected(tp, choices_text(kCurriculumSchedules), *t,
                              "nearest: " + nearest(t->get<std::string>(), names));

  const std::string cp = path + ".schedule_config";
  const json* c = need(r, obj, path, "schedule_config", "an object", std::string(name(p.type)) + " needs its parameters");
  // A parameter of another schedule type is an error: it would be silently ignored.
  std::vector<std::string_view> keys;
  if (p.type == CurriculumSchedule::FixedDiscrete) keys = {"difficulty", "max_step"};
  else if (p.type == CurriculumSchedule::FixedRoot) keys = {"total_curriculum_step", "difficulty_step", "root_degree"};
  else keys = {"total_curriculum_step", "difficulty_step"};
  r.check_object(*c, cp, keys, true);
  const std::string needs = std::string(name(p.type)) + " needs it";
  if (p.type == CurriculumSchedule::FixedDiscrete) {
    p.difficulty = int_list(r, *need(r, *c, cp, "difficulty", "an array of integers", needs), cp + ".difficulty", lo);
    p.max_step = int_list(r, *need(r, *c, cp, "max_step", "an array of integers", needs), cp + ".max_step", 0);
    if (p.difficulty.size() != p.max_step.size() + 1)
      r.fail(cp + ".difficulty", detail::concat("expected one more difficulty than max_step entries (the last "
                                                "difficulty holds after the last max_step), found ", p.difficulty.size(),
                                                " difficulties and ", p.max_step.size(), " max_step entries"));
    for (std::size_t i = 0; i < p.difficulty.size(); ++i)
      if (p.difficulty[i] < p.min_difficulty || p.difficulty[i] > p.max_difficulty)
        r.fail(detail::concat(cp, ".difficulty[", i, "]"),
               detail::concat("expected a difficulty in [min_difficulty ", p.min_difficulty, ", max_difficulty ",
                              p.max_difficulty, "], found ", p.difficulty[i]));
    for (std::size_t i = 1; i < p.max_step.size(); ++i)
      if (p.max_step[i] <= p.max_step[i - 1])
        r.fail(detail::concat(cp, ".max_step[", i, "]"),
               detail::concat("expected increasing steps, found ", p.max_step[i], " after ", p.max_step[i - 1]));
  } else {
    p.total_curriculum_step =
        r.as_int(*need(r, *c, cp, "total_curriculum_step", "a positive integer", needs), cp + ".total_curriculum_step", 1, kMaxI64);
    p.difficulty_step =
        r.as_int(*need(r, *c, cp, "difficulty_step", "a positive integer", needs), cp + ".difficulty_step", 1, kMaxI64);
    if (p.type == CurriculumSchedule::FixedRoot)
      p.root_degree = r.as_number(*need(r, *c, cp, "root_degree", "a number > 0", needs), cp + ".root_degree", 0.0,
                                  std::numeric_limits<double>::infinity(), true);
  }
}

void parse_metric(Reader& r, const json& j, const std::string& path, CurriculumMetric metric, bool active,
                  CurriculumMetricConfig& m) {
  m.metric = metric;
  r.check_object(j, path, config_key_children(kMetricTable), false);
  if (const json* v = Reader::find(j, "index_to_sample_path")) m.index_to_sample_path = r.as_string(*v, path + ".index_to_sample_path");
  if (const json* v = Reader::find(j, "index_to_metric_path")) m.index_to_metric_path = r.as_string(*v, path + ".index_to_metric_path");
  const auto choice = [&](std::string_view key, auto& out, const auto& table) {
    const json* v = Reader::find(j, key);
    if (!v) return;
    const std::string kp = join_path(path, key);
    if (!v->is_string()) r.fail_expected(kp, choices_text(table), *v);
    for (const auto& c : table)
      if (v->get<std::string>() == c.name) {
        out = c.value;
        return;
      }
    r.fail_expected(kp, choices_text(table), *v);
  };
  choice("difficulty_type", m.difficulty_type, kDifficultyTypes);
  choice("clustering_type", m.clustering_type, kClusteringTypes);
  // The metric's keys are not walked by the key table's pass (a metric is named by the user):
  // the one read but not acted on says so here.
  if (Reader::find(j, "clustering_type")) {
    const std::string key = std::string(kMetricTable) + ".clustering_type";
    r.warn_text(not_acted_warning(path + ".clustering_type", find_config_key(key)->what));
  }
  const bool pct = m.difficulty_type == DifficultyType::Percentile;
  const bool seqlen = metric != CurriculumMetric::VocabularyRarity;
  parse_pacing(r, j, path, pct ? 0 : (seqlen ? 1 : 0), pct ? 100 : kMaxI64, m.pacing);
  if (active && metric == CurriculumMetric::VocabularyRarity && m.index_to_sample_path.empty())
    r.fail_missing(path + ".index_to_sample_path", "the index file of `cutrain analyze-data --metric vocabularyrarity`",
                   "the vocabularyrarity curriculum draws samples by it");
}

// data_routing.random_ltd: the layers, the model type and the schedule. What needs the model
// (total_layer_num, the ids, max_value against the sequence length) is checked where the run
// starts (train/random_ltd_schedule.h: check_random_ltd).
void parse_random_ltd(Reader& r, const json& j, const std::string& path, RandomLtdConfig& c) {
  r.check_object(j, path);
  r.read(j, path, "enabled", c.enabled);
  const std::string why = "random-LTD is enabled";
  const auto need_if = [&](std::string_view key, const std::string& expected) -> const json* {
    const json* v = Reader::find(j, key);
    if (!v && c.enabled) r.fail_missing(join_path(path, key), expected, why);
    return v;
  };
  if (const json* v = need_if("total_layer_num", "a positive integer (the model's layer count)"))
    c.total_layer_num = int(r.as_int(*v, path + ".total_layer_num", 1, kMaxInt));
  if (const json* v = need_if("random_ltd_layer_id", "an array of layer indices"))
    for (std::int64_t id : int_list(r, *v, path + ".random_ltd_layer_id", 0)) {
      const std::size_t i = c.layer_ids.size();
      if (c.total_layer_num > 0 && id >= c.total_layer_num)
        r.fail(detail::concat(path, ".random_ltd_layer_id[", i, "]"),
               detail::concat("expected a layer index in [0, total_layer_num ", c.total_layer_num, "), found ", id));
      for (std::size_t k = 0; k < i; ++k)
        if (c.layer_ids[k] == id)
          r.fail(detail::concat(path, ".random_ltd_layer_id[", i, "]"),
                 detail::concat("expected distinct layers, found ", id, " again (also at [", k, "])"));
      c.layer_ids.push_back(int(std::min<std::int64_t>(id, kMaxInt)));
    }
  if (const json* v = need_if("random_ltd_layer_num", "the number of entries of random_ltd_layer_id")) {
    c.layer_num = int(r.as_int(*v, path + ".random_ltd_layer_num", 0, kMaxInt));
    if (std::size_t(c.layer_num) != c.layer_ids.size())
      r.fail(path + ".random_ltd_layer_num",
             detail::concat("expected the length of random_ltd_layer_id (", c.layer_ids.size(), "), found ",
                            c.layer_num));
  } else {
    c.layer_num = int(c.layer_ids.size());
  }
  if (c.enabled && c.layer_ids.empty())
    r.fail(path + ".random_ltd_layer_id", "expected at least one layer, found none (random-LTD is enabled)");
  r.read(j, path, "model_mask_name", c.model_mask_name);
  r.read_choice(j, path, "model_type", c.model_type, kRandomLtdModelTypes);
  r.read_choice(j, path, "hidden_state_order", c.hidden_state_order, kHiddenStateOrders);
  if (const json* lr = Reader::find(j, "layer_token_lr_schedule")) {
    const std::string lp = path + ".layer_token_lr_schedule";
    r.check_object(*lr, lp);
    r.read(*lr, lp, "enabled", c.layer_token_lr_enabled);
    if (c.layer_token_lr_enabled)
      r.fail(lp + ".enabled", "expected false: the layer-token learning-rate schedule is not implemented (DeepSpeed "
                              "raises NotImplementedError for it too)");
  }
  const json* sch = need_if("random_ltd_schedule", "an object (min_value, max_value, schedule_type, schedule_config)");
  if (!sch) return;
  const std::string sp = path + ".random_ltd_schedule";
  r.check_object(*sch, sp, true);
  const std::string swhy = "the random-LTD schedule needs it";
  c.min_value = r.as_int(*need(r, *sch, sp, "min_value", "a positive integer", swhy), sp + ".min_value", 1, kMaxInt);
  c.max_value = r.as_int(*need(r, *sch, sp, "max_value", "a positive integer", swhy), sp + ".max_value", 1, kMaxInt);
  if (c.max_value < c.min_value)
    r.fail(sp + ".max_value", detail::concat("expected max_value >= min_value ", c.min_value, ", found ", c.max_value));
  const json* t = need(r, *sch, sp, "schedule_type", choices_text(kRandomLtdSchedules), swhy);
  if (!t->is_string() || t->get<std::string>() != "fixed_linear")
    r.fail_expected(sp + ".schedule_type", choices_text(kRandomLtdSchedules) + " (DeepSpeed's random-LTD has only it)",
                    *t);
  const std::string cp = sp + ".schedule_config";
  const json* cfg = need(r, *sch, sp, "schedule_config", "an object (require_steps, seq_per_step)", swhy);
  r.check_object(*cfg, cp, true);
  c.require_steps =
      r.as_int(*need(r, *cfg, cp, "require_steps", "a positive integer", swhy), cp + ".require_steps", 1, kMaxI64);
  c.seq_per_step =
      r.as_int(*need(r, *cfg, cp, "seq_per_step", "a positive integer", swhy), cp + ".seq_per_step", 1, kMaxInt);
}

}  // namespace

void parse_data_efficiency(Reader& r, const json& j, DataEfficiencyConfig& d) {
  const std::string path = "data_efficiency";
  r.check_object(j, path);
  r.read(j, path, "enabled", d.enabled);
  if (const json* v = Reader::find(j, "seed")) d.seed = static_cast<std::uint64_t>(r.as_int(*v, path + ".seed", 0, kMaxI64));
  if (const json* routing = Reader::find(j, "data_routing")) {
    const std::string rp = path + ".data_routing";
    r.check_object(*routing, rp);
    r.read(*routing, rp, "enabled", d.routing_enabled);
    if (const json* ltd = Reader::find(*routing, "random_ltd")) parse_random_ltd(r, *ltd, rp + ".random_ltd", d.random_ltd);
  }
  const json* s = Reader::find(j, "data_sampling");
  if (!s) return;
  const std::string sp = path + ".data_sampling";
  r.check_object(*s, sp);
  r.read(*s, sp, "enabled", d.sampling_enabled);
  r.read(*s, sp, "num_epochs", d.num_epochs, 1, kMaxInt);
  r.read(*s, sp, "num_workers", d.num_workers, 0, kMaxInt);
  const json* cl = Reader::find(*s, "curriculum_learning");
  if (!cl) return;
  const std::string cp = sp + ".curriculum_learning";
  r.check_object(*cl, cp);
  r.read(*cl, cp, "enabled", d.curriculum_enabled);
  r.read(*cl, cp, "data_cluster_path", d.data_cluster_path);
  const bool active = d.curriculum_active();
  const json* metrics = Reader::find(*cl, "curriculum_metrics");
  const std::string mp = cp + ".curriculum_metrics";
  if (!metrics) {
    if (active) r.fail_missing(mp, "an object of metrics (" + choices_text(kCurriculumMetrics) + ")", "the curriculum is enabled");
    return;
  }
  if (!metrics->is_object()) r.fail_expected(mp, "an object of metrics", *metrics);
  // An unknown metric is an error, strict or not: nothing could compute it.
  for (auto it = metrics->begin(); it != metrics->end(); ++it) {
    bool known = false;
    for (const auto& c : kCurriculumMetrics) known = known || it.key() == c.name;
    if (!known)
      r.fail(join_path(mp, it.key()), detail::concat("expected a metric, ", choices_text(kCurriculumMetrics), ", found \"",
                                                     it.key(), "\""));
  }
  if (active && metrics->empty()) r.fail(mp, "expected at least one metric, found none (the curriculum is enabled)");
  for (auto it = metrics->begin(); it != metrics->end(); ++it) {
    CurriculumMetricConfig m;
    const CurriculumMetric metric = parse_choice(kCurriculumMetrics, it.key(), mp);
    parse_metric(r, *it, join_path(mp, it.key()), metric, active, m);
    d.metrics.push_back(std::move(m));
  }
}

void parse_legacy_curriculum(Reader& r, const json& j, LegacyCurriculumConfig& c) {
  const std::string path = "curriculum_learning";
  r.check_object(j, path);
  r.read(j, path, "enabled", c.enabled);
  if (const json* t = Reader::find(j, "curriculum_type")) {
    if (!t->is_string() || t->get<std::string>() != "seqlen")
      r.fail_expected(path + ".curriculum_type", "\"seqlen\" (the legacy curriculum is a sequence-length warm-up)", *t);
  } else if (c.enabled) {
    r.fail_missing(path + ".curriculum_type", "\"seqlen\"", "the legacy curriculum needs it");
  }
  // Disabled and empty (DeepSpeed's {"enabled": false}) needs no pacing.
  if (c.enabled || Reader::find(j, "schedule_type")) parse_pacing(r, j, path, 1, kMaxI64, c.pacing);
}

}  // namespace cutrain::train::config_detail
