// @brief The sequence-length curriculum (DeepSpeed's seqlen_truncate / seqlen_reshape metrics and
// the legacy top-level curriculum_learning "seqlen" warm-up): the sequence length L of each
// optimizer step from the pacing (train/curriculum_schedule.h), and each micro-batch of B samples
// of S (token, label) pairs rebuilt as rows x L, as Megatron-DeepSpeed's GPT example does it
// (pretrain_gpt.py's data_post_process on the sample's S + 1 tokens; its truncate also is the
// legacy curriculum's): pair j of a sample is (tokens[j], labels[j]), the window's tokens j and
// j + 1.
//   truncate: B rows, each sample's first L pairs.
//   reshape:  each sample cut into (S + 1) / (L + 1) windows of L + 1 tokens (pairs k(L+1) ..
//             k(L+1) + L - 1; the pair that straddles two windows is not trained), sample by
//             sample, then one more window per sample at its end (pairs S - L .. S - 1); the first
//             ceil(B (S + 1) / (L + 1)) of those rows are kept (at most all of them), one fewer
//             when that count is odd and above 1.
// L >= S trains the whole micro-batch unchanged. Pure functions of the step: a resumed run gets
// the same lengths. In cutrain_config (no CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/curriculum_schedule.h"

namespace cutrain::train {

// A micro-batch's shape: `rows` sequences of `seq` tokens.
struct SeqShape {
  int rows = 0, seq = 0;
  std::size_t tokens() const { return std::size_t(rows) * std::size_t(seq); }
  bool operator==(const SeqShape& o) const { return rows == o.rows && seq == o.seq; }
};

// One row of a rebuilt micro-batch: `seq` pairs of sample `sample` from pair `start` on.
struct SeqRow {
  int sample = 0, start = 0;
};

// The rows of metric `m` at length L for B samples of S pairs (L >= S: the B whole samples).
std::vector<SeqRow> seqlen_rows(CurriculumMetric m, int B, int S, int L);

// Rebuilds `accum` micro-batches of tokens and labels ([accum, B, S] each) at length L into
// `out_tokens` / `out_labels` ([accum, rows, min(L, S)], resized) by metric `m`'s rows. Truncate
// also cuts BERT's [PAD]-padded micro-batches down to their longest sample (train/bert_options.h).
void rebuild_micro_batches(CurriculumMetric m, int B, int S, int L, int accum, const std::int32_t* tokens,
                           const std::int32_t* labels, std::vector<std::int32_t>& out_tokens,
                           std::vector<std::int32_t>& out_labels);

class SeqlenCurriculum {
 public:
  // `metric`: SeqlenTruncate or SeqlenReshape; `source`: the config key the pacing came from
  // (named in the describe line). B, S: the run's micro-batch.
  SeqlenCurriculum(CurriculumMetric metric, const PacingConfig& pacing, int B, int S, std::string source);
  CurriculumMetric metric() const { return metric_; }
  // The sequence length of the 0-based optimizer step `step` (DeepSpeed's pacing at the 1-based
  // step about to run), at most S.
  int seqlen(std::int64_t step) const;
  // The micro-batch shape at length L.
  SeqShape shape(int L) const;
  // The largest micro-batch (in tokens) any length in [1, S] gives: what a backend allocates for
  // (reshape's last rows can hold a few tokens more than B x S).
  std::size_t max_tokens() const { return max_tokens_; }
  // Rebuilds `accum` micro-batches ([accum, B, S] each of tokens and labels) at length L into
  // `out_tokens` / `out_labels` ([accum, rows, L], resized).
  void apply(int L, int accum, const std::int32_t* tokens, const std::int32_t* labels,
             std::vector<std::int32_t>& out_tokens, std::vector<std::int32_t>& out_labels) const;
  // The tokens one optimizer step trains over the global batch: accum x world x rows x L (the
  // figure DeepSpeed's example adds to consumed_train_tokens).
  std::int64_t step_tokens(std::int64_t step, int accum, int world) const;
  // Tokens trained before step `step` (the sum of step_tokens over 0 .. step - 1): a resumed
  // run's starting count.
  std::int64_t tokens_before(std::int64_t step, int accum, int world) const;
  std::string describe() const;

 private:
  CurriculumMetric metric_;
  CurriculumPacing pacing_;
  int B_, S_;
  std::string source_;
  std::size_t max_tokens_ = 0;
};

// The run's sequence-length curriculum: data_efficiency's seqlen_truncate / seqlen_reshape metric
// when the curriculum's three switches are on, or the legacy curriculum_learning block when
// enabled; nullopt when neither. Checks against the run, each error naming the config file and the
// key: max_difficulty above --seq_length, a pacing whose min_difficulty is below its difficulty_step,
// both seqlen metrics at once, the legacy block together
// with a seqlen metric.
std::optional<SeqlenCurriculum> make_seqlen_curriculum(const TrainConfig& cfg, const std::string& config_path, int B,
                                                       int S);

}  // namespace cutrain::train
