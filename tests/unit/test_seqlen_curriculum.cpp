// CPU tests of the sequence-length curriculum (seqlen_truncate, seqlen_reshape, the legacy
// curriculum_learning block) and of BERT's padding to the longest sequence: the length of each step from the pacing, the rebuilt micro-batches
// against a literal transcription of Megatron-DeepSpeed's data_post_process on the samples' S + 1
// tokens, the capacity, the CPU backend at a length against a backend built at that shape (a ramp
// step by step, the same state and tokens), the token-based lr decay, and each config error named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/support/cpu_test_util.h"
#include "train/bert_options.h"
#include "train/config.h"
#include "train/cpu_backend.h"
#include "train/lr_schedule.h"
#include "train/seqlen_curriculum.h"

using namespace cutrain;

namespace {

constexpr const char* kMetrics = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics";

// A config with one curriculum metric `metric` {...`body`} and all three switches on.
std::string with_metric(const std::string& metric, const std::string& body, const std::string& extra = "") {
  return R"({"train_micro_batch_size_per_gpu": 2, "data_efficiency": {"enabled": true, "seed": 5, "data_sampling":
    {"enabled": true, "curriculum_learning": {"enabled": true, "curriculum_metrics": {")" +
         metric + R"(": {)" + body + "}}}}}" + extra + "}";
}
const std::string kLinear = R"("min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 8})";

std::string error_of(const std::string& json, int B, int S) {
  return test::message_of([&] {
    train::make_seqlen_curriculum(train::parse_config(json, "cl.json"), "cl.json", B, S);
  });
}

// Megatron-DeepSpeed's data_post_process, transcribed literally (text [B, S + 1]), then get_batch's
// tokens = text[:, :-1], labels = text[:, 1:].
void megatron_reference(bool reshape, int B, int S, int L, const std::vector<std::int32_t>& text,
                        std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& labels, int& rows_out) {
  const int W = S + 1;
  std::vector<std::vector<std::int32_t>> rows;
  if (L >= S) {
    for (int b = 0; b < B; ++b) rows.emplace_back(text.begin() + b * W, text.begin() + (b + 1) * W);
  } else if (!reshape) {
    for (int b = 0; b < B; ++b) rows.emplace_back(text.begin() + b * W, text.begin() + b * W + L + 1);
  } else {
    const long orig = long(B) * W;
    const int reshape_len = (W / (L + 1)) * (L + 1);
    // text[:, :reshape_len].contiguous().view(-1, L + 1): row-major over the [B, reshape_len] block.
    std::vector<std::int32_t> block;
    for (int b = 0; b < B; ++b) block.insert(block.end(), text.begin() + b * W, text.begin() + b * W + reshape_len);
    for (std::size_t i = 0; i < block.size(); i += std::size_t(L + 1))
      rows.emplace_back(block.begin() + long(i), block.begin() + long(i) + L + 1);
    for (int b = 0; b < B; ++b) rows.emplace_back(text.begin() + (b + 1) * W - (L + 1), text.begin() + (b + 1) * W);
    long num_row = (orig + L) / (L + 1);  // math.ceil(orig / (L + 1))
    num_row = std::min<long>(num_row, long(rows.size()));
    if (num_row > 1 && num_row % 2 != 0) num_row -= 1;
    rows.resize(std::size_t(num_row));
  }
  tokens.clear();
  labels.clear();
  for (const auto& r : rows) {
    tokens.insert(tokens.end(), r.begin(), r.end() - 1);
    labels.insert(labels.end(), r.begin() + 1, r.end());
  }
  rows_out = int(rows.size());
}

train::SeqlenCurriculum curriculum(train::CurriculumMetric m, int B, int S, int lo = 1, int hi = 0) {
  train::PacingConfig p;
  p.min_difficulty = lo;
  p.max_difficulty = hi ? hi : S;
  p.total_curriculum_step = 10;
  return train::SeqlenCurriculum(m, p, B, S, "test");
}

}  // namespace

TEST(SeqlenCurriculum, LengthPerStepFromThePacing) {
  const auto c = train::make_seqlen_curriculum(train::parse_config(with_metric("seqlen_truncate", kLinear), "cl.json"),
                                               "cl.json", 2, 64);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->metric(), train::CurriculumMetric::SeqlenTruncate);
  // DeepSpeed's pacing at the 1-based step s + 1: floor((s+1)/8 * 56 + 8), down to a multiple of 8.
  const int want[] = {8, 16, 24, 32, 40, 48, 56, 64, 64, 64};
  for (int s = 0; s < 10; ++s) EXPECT_EQ(c->seqlen(s), want[s]) << "step " << s;
  // Global tokens: accumulation x world x B x L; their running sum for a resume.
  EXPECT_EQ(c->step_tokens(2, 3, 2), 3 * 2 * 2 * 24);
  EXPECT_EQ(c->tokens_before(3, 1, 1), 2 * (8 + 16 + 24));
  EXPECT_EQ(c->tokens_before(0, 1, 1), 0);

  // The legacy block: a truncate warm-up with its own pacing (fixed_discrete here).
  const auto l = train::make_seqlen_curriculum(train::parse_config(R"({"train_micro_batch_size_per_gpu": 2,
    "curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 32,
    "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [8, 16, 32], "max_step": [2, 4]}}})", "cl.json"),
                                               "cl.json", 2, 32);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->metric(), train::CurriculumMetric::SeqlenTruncate);
  const int dis[] = {8, 8, 16, 16, 32, 32};  // 1-based steps 1-2, 3-4, then 32
  for (int s = 0; s < 6; ++s) EXPECT_EQ(l->seqlen(s), dis[s]) << "step " << s;

  // Off: no curriculum.
  EXPECT_FALSE(train::make_seqlen_curriculum(train::parse_config(R"({"train_micro_batch_size_per_gpu": 2})", "cl.json"),
                                             "cl.json", 2, 64));
  // A vocabularyrarity metric alone is not a sequence-length curriculum.
  EXPECT_FALSE(train::make_seqlen_curriculum(
      train::parse_config(with_metric("vocabularyrarity", R"("index_to_sample_path": "i.json", )" + kLinear), "cl.json"),
      "cl.json", 2, 64));
}

TEST(SeqlenCurriculum, BatchesMatchMegatronsDataPostProcess) {
  std::mt19937 rng(11);
  int checked = 0;
  for (bool reshape : {false, true})
    for (int B : {1, 2, 3, 5})
      for (int S : {7, 10, 16, 33, 64})
        for (int L = 1; L <= S; ++L) {
          // Samples of S + 1 tokens; the batch sampler's view: tokens = text[:-1], labels = text[1:].
          const int W = S + 1;
          std::vector<std::int32_t> text(std::size_t(B) * W);
          for (auto& t : text) t = std::int32_t(rng() % 50000);
          std::vector<std::int32_t> tokens, labels;
          for (int b = 0; b < B; ++b)
            for (int j = 0; j < S; ++j) {
              tokens.push_back(text[std::size_t(b) * W + j]);
              labels.push_back(text[std::size_t(b) * W + j + 1]);
            }
          std::vector<std::int32_t> want_t, want_l;
          int want_rows = 0;
          megatron_reference(reshape, B, S, L, text, want_t, want_l, want_rows);
          const auto c = curriculum(reshape ? train::CurriculumMetric::SeqlenReshape : train::CurriculumMetric::SeqlenTruncate,
                                    B, S);
          std::vector<std::int32_t> got_t(3, -7), got_l(5, -7);  // stale contents: resized and overwritten
          c.apply(L, 1, tokens.data(), labels.data(), got_t, got_l);
          const train::SeqShape sh = c.shape(L);
          SCOPED_TRACE(::testing::Message() << (reshape ? "reshape" : "truncate") << " B=" << B << " S=" << S << " L=" << L);
          EXPECT_EQ(sh.rows, want_rows);
          EXPECT_EQ(sh.seq, std::min(L, S));
          ASSERT_EQ(got_t, want_t);
          ASSERT_EQ(got_l, want_l);
          EXPECT_LE(sh.tokens(), c.max_tokens());
          ++checked;
        }
  EXPECT_GT(checked, 500);
}

TEST(SeqlenCurriculum, AccumulatedMicroBatchesAndCapacity) {
  // Each micro-batch of a step rebuilt on its own: [accum, B, S] -> [accum, rows, L].
  const int B = 2, S = 12, L = 5, accum = 3;
  const auto c = curriculum(train::CurriculumMetric::SeqlenReshape, B, S);
  std::vector<std::int32_t> t(std::size_t(accum) * B * S), l(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::int32_t(i), l[i] = std::int32_t(1000 + i);
  std::vector<std::int32_t> all_t, all_l, one_t, one_l;
  c.apply(L, accum, t.data(), l.data(), all_t, all_l);
  const std::size_t micro = c.shape(L).tokens();
  ASSERT_EQ(all_t.size(), accum * micro);
  for (int a = 0; a < accum; ++a) {
    c.apply(L, 1, t.data() + a * B * S, l.data() + a * B * S, one_t, one_l);
    EXPECT_TRUE(std::equal(one_t.begin(), one_t.end(), all_t.begin() + long(a * micro))) << a;
    EXPECT_TRUE(std::equal(one_l.begin(), one_l.end(), all_l.begin() + long(a * micro))) << a;
  }
  // Reshape's kept rows can hold more tokens than B x S: 1 sample of 10 (11 tokens), L = 6 -> a
  // window and the tail, 2 rows of 6; L = 9 -> 2 rows of 9, the largest.
  const auto small = curriculum(train::CurriculumMetric::SeqlenReshape, 1, 10);
  EXPECT_EQ(small.shape(6).rows, 2);
  EXPECT_EQ(small.shape(9).rows, 2);
  EXPECT_EQ(small.max_tokens(), 18u);
  EXPECT_EQ(curriculum(train::CurriculumMetric::SeqlenTruncate, 4, 16).max_tokens(), 64u);
}

TEST(SeqlenCurriculum, ConfigErrorsNameTheKey) {
  const std::string mp = std::string(kMetrics);
  // max_difficulty above --seq_length.
  EXPECT_NE(error_of(with_metric("seqlen_reshape", kLinear), 2, 32)
                .find("cl.json: " + mp + ".seqlen_reshape.max_difficulty: expected a sequence length <= --seq_length 32, found 64"),
            std::string::npos);
  // A minimum below difficulty_step (every length is a multiple of it).
  EXPECT_NE(error_of(with_metric("seqlen_truncate", R"("min_difficulty": 5, "max_difficulty": 64, "schedule_type":
    "fixed_linear", "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 8})"), 2, 64)
                .find(mp + ".seqlen_truncate.min_difficulty: expected at least schedule_config.difficulty_step 8"),
            std::string::npos);
  // Percentiles have no meaning for a length.
  EXPECT_NE(error_of(with_metric("seqlen_truncate", R"("difficulty_type": "percentile", )" + kLinear), 2, 64)
                .find(mp + ".seqlen_truncate.difficulty_type: expected \"value\""),
            std::string::npos);
  // Both metrics, or the legacy block with one.
  const std::string both = R"({"train_micro_batch_size_per_gpu": 2, "data_efficiency": {"enabled": true, "data_sampling":
    {"enabled": true, "curriculum_learning": {"enabled": true, "curriculum_metrics": {"seqlen_truncate": {)" + kLinear +
                           R"(}, "seqlen_reshape": {)" + kLinear + "}}}}}}";
  EXPECT_NE(error_of(both, 2, 64).find("expected one sequence-length metric, found both"), std::string::npos);
  const std::string legacy = R"(, "curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", )" + kLinear + "}";
  EXPECT_NE(error_of(with_metric("seqlen_truncate", kLinear, legacy), 2, 64)
                .find("cl.json: curriculum_learning.enabled: expected false with " + mp + ".seqlen_truncate"),
            std::string::npos);
  // The legacy block's own check, named by its path.
  EXPECT_NE(error_of(R"({"train_micro_batch_size_per_gpu": 2, "curriculum_learning": {"enabled": true,
    "curriculum_type": "seqlen", )" + kLinear + "}}", 2, 48)
                .find("cl.json: curriculum_learning.max_difficulty: expected a sequence length <= --seq_length 48, found 64"),
            std::string::npos);
  // An unknown metric: the config reader's error.
  EXPECT_NE(test::message_of([&] { train::parse_config(with_metric("seqlen_pad", kLinear), "cl.json"); })
                .find(mp + ".seqlen_pad: expected a metric, one of \"seqlen_truncate\", \"seqlen_reshape\", \"vocabularyrarity\""),
            std::string::npos);
  // Reshape needs no length that divides S (Megatron's rows of L + 1 tokens): L = 7 of 64 is fine.
  EXPECT_EQ(curriculum(train::CurriculumMetric::SeqlenReshape, 2, 64).shape(7).seq, 7);
}

// A ramp on the CPU backend (each step set to its length's shape) against backends built at each
// step's shape, started from the ramp's state before that step: the same loss, norm and params.
TEST(SeqlenCurriculum, CpuRampStepsEqualFixedShapeRuns) {
  for (auto metric : {train::CurriculumMetric::SeqlenTruncate, train::CurriculumMetric::SeqlenReshape})
    for (bool gpt2 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << name(metric) << (gpt2 ? " gpt2" : " simple causal"));
      const int B = 2, S = 16, accum = 2;
      train::TrainConfig cfg = train::parse_config(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}})", "cl.json");
      cfg.resolve_batch(1);
      train::BackendOptions bo;
      bo.dims = model::ModelDims{32, 2, 2, 61, S};
      bo.dims.arch = gpt2 ? model::Arch::Gpt2 : model::Arch::Simple;
      bo.causal = true;
      bo.batch = B;
      bo.seq = S;
      bo.seed = 9;
      const auto cl = curriculum(metric, B, S, 3, S);
      bo.max_tokens = cl.max_tokens();
      auto ramp = train::make_cpu_backend(bo, cfg);
      std::mt19937 rng(4);
      std::vector<std::int32_t> t(std::size_t(accum) * B * S), l(t.size()), ct, cll;
      int step = 1;
      for (int L : {3, 7, 7, 12, 16}) {
        for (auto& x : t) x = std::int32_t(rng() % 61);
        for (auto& x : l) x = std::int32_t(rng() % 61);
        const train::SeqShape sh = cl.shape(L);
        cl.apply(L, accum, t.data(), l.data(), ct, cll);
        train::BackendOptions fo = bo;
        fo.batch = sh.rows;
        fo.seq = sh.seq;
        fo.max_tokens = 0;
        auto fixed = train::make_cpu_backend(fo, cfg);
        fixed->load_state(ramp->save_state());
        ramp->set_seq_shape(sh.rows, sh.seq);
        const train::StepStats a = ramp->step(ct.data(), cll.data(), step, 1e-2f);
        const train::StepStats b = fixed->step(ct.data(), cll.data(), step, 1e-2f);
        SCOPED_TRACE(::testing::Message() << "L=" << L << " rows=" << sh.rows);
        EXPECT_TRUE(std::isfinite(a.loss));
        EXPECT_EQ(a.loss, b.loss);
        EXPECT_EQ(a.grad_norm, b.grad_norm);
        EXPECT_EQ(ramp->save_state().params, fixed->save_state().params);
        ++step;
      }
      // A shape past the capacity or the sequence length is refused, named.
      EXPECT_NE(test::message_of([&] { ramp->set_seq_shape(B, S + 1); }).find("outside the run's sequence length 16"),
                std::string::npos);
    }
}

TEST(SeqlenCurriculum, TokenBasedLrDecay) {
  const train::LrSchedule s = train::LrSchedule::from_config(train::parse_config(R"({"train_micro_batch_size_per_gpu": 1,
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 4,
    "warmup_type": "linear", "total_num_steps": 100}}})", "lr.json"));
  EXPECT_EQ(s.decay_start_step(), 5);
  // The warm-up is by steps, whatever the tokens.
  for (int step : {0, 1, 3, 4}) EXPECT_EQ(s.lr_by_tokens(step, 123456, 1000, 9000), s.lr(step)) << step;
  // Past it, the linear decay over the tokens from the warm-up's 1000 to 9000.
  EXPECT_NEAR(s.lr_by_tokens(5, 1000, 1000, 9000), 1e-3, 1e-9);
  EXPECT_NEAR(s.lr_by_tokens(9, 3000, 1000, 9000), 1e-3 * 0.75, 1e-9);
  EXPECT_NEAR(s.lr_by_tokens(50, 9000, 1000, 9000), 0.0, 1e-12);
  EXPECT_NEAR(s.lr_by_tokens(60, 20000, 1000, 9000), 0.0, 1e-12);
  const train::LrSchedule c = train::LrSchedule::from_config(train::parse_config(R"({"train_micro_batch_size_per_gpu": 1,
    "optimizer": {"params": {"lr": 2e-3}}, "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2,
    "total_num_steps": 100, "cos_min_ratio": 0.1}}})", "lr.json"));
  EXPECT_NEAR(c.lr_by_tokens(10, 5000, 1000, 9000), 2e-3 * (0.1 + 0.9 * 0.5), 1e-9);  // halfway: cos = 0
  // WarmupLR has no decay: its lr is the step's.
  const train::LrSchedule w = train::LrSchedule::from_config(train::parse_config(R"({"train_micro_batch_size_per_gpu": 1,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 3}}})", "lr.json"));
  EXPECT_FALSE(w.decays());
  EXPECT_EQ(w.lr_by_tokens(20, 5, 1, 9), w.lr(20));
}

// Issue #20's padding to the longest sequence (`--model bert --pad_to_longest BUCKET`): the length
// a step is cut to, and the CPU backend's BERT at that length equal to the full [PAD]-padded length
// (the key mask hides the [PAD] keys and the loss is over the labelled rows; dropout off, whose
// masks are keyed by the layout).
TEST(SeqlenCurriculum, BertPaddedLength) {
  EXPECT_EQ(train::bert_padded_length(9, 4, 3, 16), 12);
  EXPECT_EQ(train::bert_padded_length(12, 4, 3, 16), 12);
  EXPECT_EQ(train::bert_padded_length(2, 4, 6, 16), 8);     // at least the head's slots
  EXPECT_EQ(train::bert_padded_length(100, 64, 20, 128), 128);
  EXPECT_EQ(train::bert_padded_length(120, 64, 20, 120), 120);  // at most S
  EXPECT_EQ(train::bert_padded_length(0, 64, 0, 512), 64);
  EXPECT_NE(test::message_of([] { train::bert_padded_length(5, 0, 1, 16); }).find("a positive bucket"), std::string::npos);
}

TEST(SeqlenCurriculum, CpuBertPaddedToLongestEqualsFullLength) {
  model::ModelDims d{32, 2, 2, 40, 16};
  d.padded_vocab = 48;
  d.intermediate = 80;
  d.arch = model::Arch::Bert;
  d.bert.pre_layer_norm = true;
  d.bert.attn_dropout_ratio = 0.f;
  d.bert.hidden_dropout_ratio = 0.f;
  d.bert.mask_id = 38;
  d.bert.pad_id = 39;
  train::TrainConfig cfg = train::parse_config(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}})", "bert.json");
  cfg.resolve_batch(1);
  train::BackendOptions o;
  o.dims = d;
  o.batch = 2;
  o.seq = 16;
  o.seed = 17;
  auto full = train::make_cpu_backend(o, cfg), padded = train::make_cpu_backend(o, cfg);
  std::mt19937 rng(8);
  const int B = 2, S = 16, accum = 2;
  std::vector<std::int32_t> ct, cl;
  for (int step = 1; step <= 4; ++step) {
    // Samples of random lengths up to `longest`, [PAD] after, a label on every third real token.
    const int longest = 3 + int(rng() % 12);
    std::vector<std::int32_t> t(std::size_t(accum) * B * S, 39), l(t.size(), -100);
    int seen = 0;
    for (int r = 0; r < accum * B; ++r) {
      const int len = r == 0 ? longest : 1 + int(rng() % std::uint32_t(longest));
      seen = std::max(seen, len);
      for (int j = 0; j < len; ++j) {
        t[std::size_t(r) * S + j] = std::int32_t(rng() % 38);
        if (j % 3 == 0) l[std::size_t(r) * S + j] = std::int32_t(rng() % 38);
      }
    }
    const int L = train::bert_padded_length(seen, 4, 2, S);
    train::rebuild_micro_batches(train::CurriculumMetric::SeqlenTruncate, B, S, L, accum, t.data(), l.data(), ct, cl);
    padded->set_seq_shape(B, L);
    const train::StepStats a = full->step(t.data(), l.data(), step, 1e-2f);
    const train::StepStats b = padded->step(ct.data(), cl.data(), step, 1e-2f);
    SCOPED_TRACE(::testing::Message() << "step " << step << " longest " << seen << " padded to " << L);
    EXPECT_NEAR(b.loss, a.loss, 1e-5 * std::abs(a.loss));
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-5 * a.grad_norm);
  }
  const auto pa = full->save_state().params, pb = padded->save_state().params;
  double worst = 0;
  for (std::size_t i = 0; i < pa.size(); ++i) worst = std::max(worst, double(std::abs(pa[i] - pb[i])));
  EXPECT_LT(worst, 1e-5);
}
