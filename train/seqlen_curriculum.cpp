#include "train/seqlen_curriculum.h"

#include <algorithm>

#include "runtime/error.h"
#include "train/config.h"

namespace cutrain::train {

std::vector<SeqRow> seqlen_rows(CurriculumMetric m, int B, int S, int L) {
  CUTRAIN_CHECK(B > 0 && S > 0 && L > 0, "seqlen curriculum: B, S and L must be positive, got B=", B, " S=", S,
                " L=", L);
  CUTRAIN_CHECK(m == CurriculumMetric::SeqlenTruncate || m == CurriculumMetric::SeqlenReshape,
                "seqlen curriculum: metric ", name(m), " is not a sequence-length metric");
  std::vector<SeqRow> rows;
  if (L >= S || m == CurriculumMetric::SeqlenTruncate) {
    for (int b = 0; b < B; ++b) rows.push_back({b, 0});
    return rows;
  }
  // The S + 1 tokens of a sample viewed as windows of L + 1: (S + 1) / (L + 1) per sample, then
  // each sample's last window; the first ceil(B (S + 1) / (L + 1)) rows, made even.
  const std::int64_t window = std::int64_t(L) + 1, text = std::int64_t(S) + 1;
  const std::int64_t per = text / window;
  for (int b = 0; b < B; ++b)
    for (std::int64_t k = 0; k < per; ++k) rows.push_back({b, int(k * window)});
  for (int b = 0; b < B; ++b) rows.push_back({b, S - L});
  std::int64_t keep = (std::int64_t(B) * text + window - 1) / window;
  keep = std::min<std::int64_t>(keep, std::int64_t(rows.size()));
  if (keep > 1 && keep % 2 != 0) --keep;
  rows.resize(std::size_t(keep));
  return rows;
}

SeqlenCurriculum::SeqlenCurriculum(CurriculumMetric metric, const PacingConfig& pacing, int B, int S,
                                   std::string source)
    : metric_(metric), pacing_(pacing), B_(B), S_(S), source_(std::move(source)) {
  CUTRAIN_CHECK(B > 0 && S > 0, "seqlen curriculum: B and S must be positive, got B=", B, " S=", S);
  for (int L = 1; L <= S; ++L) max_tokens_ = std::max(max_tokens_, shape(L).tokens());
}

int SeqlenCurriculum::seqlen(std::int64_t step) const {
  const std::int64_t d = pacing_.difficulty(step + 1);  // DeepSpeed passes the 1-based step about to run
  CUTRAIN_CHECK(d >= 1, "seqlen curriculum: ", source_, " gives length ", d, " at step ", step,
                " (expected a length of at least 1)");
  return int(std::min<std::int64_t>(d, S_));
}

SeqShape SeqlenCurriculum::shape(int L) const {
  if (L >= S_) return {B_, S_};
  return {int(seqlen_rows(metric_, B_, S_, L).size()), L};
}

void rebuild_micro_batches(CurriculumMetric m, int B, int S, int L, int accum, const std::int32_t* tokens,
                           const std::int32_t* labels, std::vector<std::int32_t>& out_tokens,
                           std::vector<std::int32_t>& out_labels) {
  const int seq = std::min(L, S);
  const std::vector<SeqRow> rows = seqlen_rows(m, B, S, seq);
  const std::size_t in_micro = std::size_t(B) * S, out_micro = rows.size() * std::size_t(seq);
  out_tokens.resize(std::size_t(accum) * out_micro);
  out_labels.resize(std::size_t(accum) * out_micro);
  for (int a = 0; a < accum; ++a)
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const std::size_t from = a * in_micro + std::size_t(rows[r].sample) * S + std::size_t(rows[r].start);
      const std::size_t to = a * out_micro + r * std::size_t(seq);
      std::copy(tokens + from, tokens + from + seq, out_tokens.begin() + std::ptrdiff_t(to));
      std::copy(labels + from, labels + from + seq, out_labels.begin() + std::ptrdiff_t(to));
    }
}

void SeqlenCurriculum::apply(int L, int accum, const std::int32_t* tokens, const std::int32_t* labels,
                             std::vector<std::int32_t>& out_tokens, std::vector<std::int32_t>& out_labels) const {
  rebuild_micro_batches(metric_, B_, S_, L, accum, tokens, labels, out_tokens, out_labels);
}

std::int64_t SeqlenCurriculum::step_tokens(std::int64_t step, int accum, int world) const {
  return std::int64_t(shape(seqlen(step)).tokens()) * accum * world;
}

std::int64_t SeqlenCurriculum::tokens_before(std::int64_t step, int accum, int world) const {
  std::int64_t t = 0;
  for (std::int64_t s = 0; s < step; ++s) t += step_tokens(s, accum, world);
  return t;
}

std::string SeqlenCurriculum::describe() const {
  const PacingConfig& p = pacing_.config();
  std::string s = "curriculum: " + std::string(name(metric_)) + " from " + source_ + ", sequence length " +
                  std::to_string(p.min_difficulty) + " -> " + std::to_string(p.max_difficulty) + " of " +
                  std::to_string(S_) + " (" + std::string(name(p.type));
  if (p.type != CurriculumSchedule::FixedDiscrete)
    s += " over " + std::to_string(p.total_curriculum_step) + " steps, multiples of " + std::to_string(p.difficulty_step);
  s += metric_ == CurriculumMetric::SeqlenReshape ? "), each micro-batch's tokens reshaped to rows of the length"
                                                  : "), each sample truncated to the length";
  return s;
}

namespace {

// The pacing's checks against the run's sequence length, naming `path` in `config_path`.
void check_pacing(const PacingConfig& p, const std::string& config_path, const std::string& path, int S) {
  CUTRAIN_CHECK(p.max_difficulty <= S, config_path, ": ", path, ".max_difficulty: expected a sequence length <= "
                "--seq_length ", S, ", found ", p.max_difficulty);
  if (p.type != CurriculumSchedule::FixedDiscrete)
    CUTRAIN_CHECK(p.min_difficulty >= p.difficulty_step, config_path, ": ", path, ".min_difficulty: expected at least "
                  "schedule_config.difficulty_step ", p.difficulty_step, " (every length is a multiple of it, so the "
                  "first one would be ", p.difficulty_step, ", not the configured minimum), found ", p.min_difficulty);
}

}  // namespace

std::optional<SeqlenCurriculum> make_seqlen_curriculum(const TrainConfig& cfg, const std::string& config_path, int B,
                                                       int S) {
  const std::string mp = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics";
  const CurriculumMetricConfig* m = nullptr;
  if (cfg.data_efficiency.curriculum_active())
    for (const auto& c : cfg.data_efficiency.metrics) {
      if (c.metric == CurriculumMetric::VocabularyRarity) continue;
      CUTRAIN_CHECK(!m, config_path, ": ", mp, ": expected one sequence-length metric, found both seqlen_truncate "
                    "and seqlen_reshape");
      m = &c;
    }
  const LegacyCurriculumConfig& legacy = cfg.curriculum_learning;
  CUTRAIN_CHECK(!(m && legacy.enabled), config_path, ": curriculum_learning.enabled: expected false with ", mp, ".",
                m ? name(m->metric) : "", " (two sequence-length curricula), found true");
  if (m) {
    const std::string path = mp + "." + std::string(name(m->metric));
    CUTRAIN_CHECK(m->difficulty_type == DifficultyType::Value, config_path, ": ", path, ".difficulty_type: expected "
                  "\"value\" (the difficulty is the sequence length), found \"", name(m->difficulty_type), "\"");
    check_pacing(m->pacing, config_path, path, S);
    return SeqlenCurriculum(m->metric, m->pacing, B, S, path);
  }
  if (!legacy.enabled) return std::nullopt;
  check_pacing(legacy.pacing, config_path, "curriculum_learning", S);
  // DeepSpeed's legacy curriculum hands the model curriculum_seqlen, and Megatron truncates to it.
  return SeqlenCurriculum(CurriculumMetric::SeqlenTruncate, legacy.pacing, B, S, "curriculum_learning");
}

}  // namespace cutrain::train
