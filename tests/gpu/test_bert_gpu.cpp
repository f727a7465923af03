// BERT (Arch::Bert) on the GPU against the CPU reference model: the loss and every parameter
// gradient (the tied decoder's share in the word embedding included) of Pre-LN and Post-LN models
// on padded batches, dropout off and on (the same keys draw the same masks), with each memory flag,
// with activation checkpointing and with the fast attention backward; the evaluation forward (no
// dropout); each flag's workspace saving is exactly bert_flag_savings' and changes no result; in
// the engine with LAMB, two steps draw different masks while CUDA-graph replays (the step read from
// device memory) give the eager steps' losses, and activation checkpointing the same losses as
// none. The masked-LM head runs on the gathered labelled rows: with max_pred slots per sequence
// (labels capped to fit) and with 0 (S slots); a sequence with more labels than slots sets the
// label status (and the engine names it); the head's workspace shrinks to B x max_pred rows. fp16
// (GpuTransformerT<f16>): the same cases against the reference with the loss scale; in the engine,
// dynamic loss scaling trains and replays as eager steps do, an overflow skips the step (params and
// master unchanged) and halves the scale after the hysteresis, an overflow at min_loss_scale is an
// error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "model/reference_model.h"
#include "model/transformer_gpu.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "tests/support/test_support.h"
#include "train/config.h"
#include "train/engine.h"

using namespace cutrain;

namespace {

constexpr int kB = 2, kS = 64;

// vocab 1000: tokens 0..997, [MASK] 998, [PAD] 999; 1024 embedding rows. `attention_options`
// false: no pad token (no key mask) and no attention dropout, the plain attention path.
model::ModelDims bert_dims(bool pre_ln, bool dropout, bool attention_options = true) {
  model::ModelDims d{128, 2, 2, 1000, 64};
  d.padded_vocab = 1024;
  d.intermediate = 384;
  d.arch = model::Arch::Bert;
  d.bert.pre_layer_norm = pre_ln;
  d.bert.attn_dropout_ratio = dropout ? 0.1f : 0.f;
  d.bert.hidden_dropout_ratio = dropout ? 0.1f : 0.f;
  d.bert.initializer_range = 0.05;  // a little away from uniform outputs
  d.bert.mask_id = 998;
  d.bert.pad_id = 999;
  if (!attention_options) {
    d.bert.pad_id = -1;
    d.bert.attn_dropout_ratio = 0.f;
  }
  return d;
}

// Masked-LM batches: sequence b > 0 padded over its last 16·b positions; some real positions
// replaced by [MASK] with a label, about 15% of them labelled, -100 elsewhere. `max_pred` > 0: at
// most that many labels per sequence (the data's cap), the later ones left unlabelled.
struct Batch {
  std::vector<std::int32_t> tok, lab;
};
Batch mlm_batch(int micro_batches, std::mt19937_64& rng, bool pad = true, int max_pred = 0) {
  const int n = micro_batches * kB * kS;
  Batch b{test::random_ints(std::size_t(n), rng, 0, 997), std::vector<std::int32_t>(std::size_t(n), -100)};
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<int> word(0, 997);
  for (int m = 0; m < n; ++m) {
    const int seq = (m / kS) % kB, t = m % kS;
    if (pad && seq > 0 && t >= kS - 16 * seq) {
      b.tok[std::size_t(m)] = 999;
      continue;
    }
    if (u(rng) < 0.15) {
      b.lab[std::size_t(m)] = b.tok[std::size_t(m)];
      if (u(rng) < 0.8) b.tok[std::size_t(m)] = 998;
    }
  }
  b.lab[0] = 5;
  if (max_pred > 0)
    for (int q = 0; q < n / kS; ++q) {
      int count = 0;
      for (int t = 0; t < kS; ++t) {
        std::int32_t& l = b.lab[std::size_t(q) * kS + t];
        if (l != -100 && ++count > max_pred) l = -100;
      }
    }
  return b;
}

// Sequences with exactly this many labels (at its first `n` real positions).
int labels_in(const Batch& b, int seq) {
  int n = 0;
  for (int t = 0; t < kS; ++t) n += b.lab[std::size_t(seq) * kS + t] != -100;
  return n;
}

enum class Variant { Plain, NormalizeInvertible, GeluCheckpoint, AttnDropoutCheckpoint, Checkpointing };
const char* variant_name(Variant v) {
  switch (v) {
    case Variant::Plain: return "Plain";
    case Variant::NormalizeInvertible: return "NormalizeInvertible";
    case Variant::GeluCheckpoint: return "GeluCheckpoint";
    case Variant::AttnDropoutCheckpoint: return "AttnDropoutCheckpoint";
    case Variant::Checkpointing: return "Checkpointing";
  }
  return "?";
}
model::ModelDims with_variant(model::ModelDims d, Variant v) {
  d.bert.normalize_invertible = v == Variant::NormalizeInvertible;
  d.bert.gelu_checkpoint = v == Variant::GeluCheckpoint;
  d.bert.attn_dropout_checkpoint = v == Variant::AttnDropoutCheckpoint;
  return d;
}

// One forward_backward (fp32 gradients) and one forward_loss of GpuTransformer on bf16 params.
struct GpuRun {
  double loss = 0, eval_loss = 0;
  std::vector<float> grads;
  std::size_t workspace = 0;
};
// `max_pred`: the head's slots per sequence (0: S). `expect_status`: the label status both calls
// must report (0: valid).
// T: the compute dtype (bf16, or fp16 with its loss scale `loss_scale` (device word) multiplied into
// the gradients, `grad_type` F32 or fp16). `deterministic_attention` false: the fast attention backward.
template <typename T = bf16>
GpuRun run_gpu(const model::TransformerParams& table, bool checkpointing, const std::vector<float>& params,
               const Batch& b, std::uint64_t seed, std::uint32_t step, int max_pred = 0, int expect_status = 0,
               float loss_scale = 0.f, DType grad_type = DType::F32, bool deterministic_attention = true) {
  Stream stream;
  model::GpuTransformerT<T> m(table, kB, kS, checkpointing, false, device_allocator(), false, {}, max_pred, nullptr, 0,
                              deterministic_attention);
  m.set_dropout(seed, step);
  test::DeviceArray<T> dp(test::to_storage<T>(params));
  test::DeviceArray<float> dg(table.flat_size()), dloss(2), dscale(std::vector<float>{loss_scale});
  test::DeviceArray<T> dg16(grad_type == DType::F32 ? 0 : table.flat_size());
  test::DeviceArray<std::int32_t> dtok(b.tok), dlab(b.lab), dstatus(std::vector<std::int32_t>(4, 0));
  model::FlatParams flat(table, dp.get(), dtype_of<T>());
  void* grads = grad_type == DType::F32 ? static_cast<void*>(dg.get()) : static_cast<void*>(dg16.get());
  m.forward_backward(stream, flat, grads, grad_type, false, dtok.get(), dlab.get(), 1.f, dloss.get(), dstatus.get(),
                     loss_scale > 0.f ? dscale.get() : nullptr);
  m.forward_loss(stream, flat, dtok.get(), dlab.get(), dloss.get() + 1, dstatus.get() + 2);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<std::int32_t> status = dstatus.download();
  EXPECT_EQ(status, (std::vector<std::int32_t>{0, expect_status, 0, expect_status})) << "token and label status";
  GpuRun r;
  const std::vector<float> loss = dloss.download();
  r.loss = loss[0];
  r.eval_loss = loss[1];
  // The tensors' elements (the flat buffer's alignment padding is never written: 0 here).
  const std::vector<float> all = grad_type == DType::F32 ? dg.download() : test::download_float(dg16);
  r.grads.assign(all.size(), 0.f);
  for (const auto& t : table.tensors()) std::copy_n(all.begin() + t.offset, t.count, r.grads.begin() + t.offset);
  r.workspace = m.workspace_bytes();
  return r;
}

// The table's init, rounded to bf16 (what both models then compute with).
std::vector<float> bf16_params(const model::TransformerParams& table, std::uint64_t seed) {
  std::vector<float> p(table.flat_size());
  table.init(p.data(), seed);
  for (float& x : p) x = round_bf16(x);
  return p;
}

struct Case {
  bool pre_ln, dropout;
  Variant variant;
  bool attention_options = true;  // padding (key mask) and attention dropout
  int max_pred = 0;               // the head's slots per sequence (0: S); the batch's labels capped to fit
  bool fast_attention = false;    // the fast attention backward (dQ by fp32 reduce-adds)
};
class BertGpu : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(BertGpu, LossAndEveryGradientMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  const Case c = GetParam();
  auto rng = test::fresh_rng();
  const model::TransformerParams table(
      with_variant(bert_dims(c.pre_ln, c.dropout, c.attention_options), c.variant));
  const std::vector<float> p = bf16_params(table, rng());
  const Batch b = mlm_batch(1, rng, c.attention_options, c.max_pred);
  const std::uint64_t seed = rng();
  const GpuRun g = run_gpu(table, c.variant == Variant::Checkpointing, p, b, seed, 3, c.max_pred, 0, 0.f, DType::F32,
                           !c.fast_attention);
  EXPECT_EQ(test::count_nan(g.grads), 0u) << "gradient elements left unwritten (poison) or non-finite";

  std::vector<double> pd(p.begin(), p.end()), gd(p.size(), 0.0);
  model::ReferenceModel<double> ref(table);
  ref.set_dropout(seed, 3);
  const double ref_loss = ref.forward(pd.data(), b.tok.data(), b.lab.data(), kB, kS);
  ref.backward(pd.data(), gd.data());
  EXPECT_NEAR(g.loss, ref_loss, 1e-2 * ref_loss);
  for (const auto& t : table.tensors()) {
    std::vector<float> out(g.grads.begin() + t.offset, g.grads.begin() + t.offset + t.count);
    std::vector<double> want(gd.begin() + t.offset, gd.begin() + t.offset + t.count);
    EXPECT_LE(test::rel_error(out, want), 2e-2) << t.name;
  }
  const auto& wte = table.tensor(table.embedding());
  for (std::size_t i = std::size_t(table.dims().vocab) * table.dims().hidden; i < wte.count; ++i)
    ASSERT_EQ(g.grads[wte.offset + i], 0.f) << "padded row element " << i;
  ref.set_training(false);
  const double ref_eval = ref.forward(pd.data(), b.tok.data(), b.lab.data(), kB, kS);
  EXPECT_NEAR(g.eval_loss, ref_eval, 1e-2 * ref_eval) << "evaluation (no dropout)";
  if (c.dropout) {
    EXPECT_NE(g.loss, g.eval_loss) << "training dropped nothing";
  }
}

// The fp16 model (GpuTransformerT<f16>, fp16 training) on the same cases: fp16-rounded params, the
// loss gradient scaled by 1024 on the device (fp16 training's loss scale: without it the masked-LM
// head's gradients, ~p / n_labels, sit in fp16's subnormals), gradients in fp32 and in fp16. The
// loss within 3e-3 and every gradient (divided by the scale) within 1e-2 of the fp64 reference:
// looser than an fp32 model would need because every activation and activation gradient is
// rounded to fp16 (2^-11 relative each, over two layers' ~20 roundings per path), tighter than
// bf16's 1e-2 / 2e-2 because fp16 keeps 3 more bits.
TEST_P(BertGpu, Fp16LossAndEveryGradientMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  const Case c = GetParam();
  auto rng = test::fresh_rng();
  const model::TransformerParams table(
      with_variant(bert_dims(c.pre_ln, c.dropout, c.attention_options), c.variant));
  std::vector<float> p(table.flat_size());
  table.init(p.data(), rng());
  p = test::round_f16(p);
  const Batch b = mlm_batch(1, rng, c.attention_options, c.max_pred);
  const std::uint64_t seed = rng();
  constexpr float kScale = 1024.f;
  std::vector<double> pd(p.begin(), p.end()), gd(p.size(), 0.0);
  model::ReferenceModel<double> ref(table);
  ref.set_dropout(seed, 3);
  const double ref_loss = ref.forward(pd.data(), b.tok.data(), b.lab.data(), kB, kS);
  ref.backward(pd.data(), gd.data());
  for (DType gt : {DType::F32, DType::F16}) {
    SCOPED_TRACE(std::string("fp16 model, gradients ") + dtype_name(gt));
    GpuRun g = run_gpu<f16>(table, c.variant == Variant::Checkpointing, p, b, seed, 3, c.max_pred, 0, kScale, gt,
                            !c.fast_attention);
    EXPECT_EQ(test::count_nan(g.grads), 0u) << "gradient elements left unwritten (poison) or non-finite";
    EXPECT_NEAR(g.loss, ref_loss, 3e-3 * ref_loss);
    for (float& x : g.grads) x /= kScale;
    for (const auto& t : table.tensors()) {
      std::vector<float> out(g.grads.begin() + t.offset, g.grads.begin() + t.offset + t.count);
      std::vector<double> want(gd.begin() + t.offset, gd.begin() + t.offset + t.count);
      EXPECT_LE(test::rel_error(out, want), 1e-2) << t.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Bert, BertGpu,
    ::testing::Values(Case{true, false, Variant::Plain}, Case{true, true, Variant::Plain},
                      Case{false, false, Variant::Plain}, Case{false, true, Variant::Plain},
                      Case{true, true, Variant::NormalizeInvertible}, Case{false, true, Variant::NormalizeInvertible},
                      Case{true, true, Variant::GeluCheckpoint}, Case{false, true, Variant::GeluCheckpoint},
                      Case{true, true, Variant::AttnDropoutCheckpoint}, Case{true, true, Variant::Checkpointing},
                      Case{false, true, Variant::Checkpointing},
                      // Without a pad token and attention dropout (the plain attention): hidden dropout only.
                      Case{true, true, Variant::Plain, false}, Case{false, true, Variant::Plain, false},
                      Case{true, true, Variant::GeluCheckpoint, false}, Case{false, true, Variant::Checkpointing, false},
                      // The head on B x max_pred gathered rows (labels capped at max_pred per sequence).
                      Case{true, false, Variant::Plain, true, 10}, Case{true, true, Variant::Plain, true, 10},
                      Case{false, true, Variant::Plain, true, 10}, Case{true, true, Variant::NormalizeInvertible, true, 7},
                      Case{false, true, Variant::NormalizeInvertible, true, 7},
                      Case{true, true, Variant::Checkpointing, true, 10}, Case{false, true, Variant::Plain, false, 13},
                      // The fast attention backward (head dim 64: dQ by fp32 reduce-adds in any order), with
                      // and without the key mask and attention dropout: the same tolerance, since only dQ's
                      // fp32 summation order differs.
                      Case{true, true, Variant::Plain, true, 0, true}, Case{false, true, Variant::Plain, true, 0, true},
                      Case{true, true, Variant::Plain, false, 0, true},
                      Case{true, true, Variant::Checkpointing, true, 10, true}),
    [](const auto& i) {
      return std::string(i.param.pre_ln ? "PreLN" : "PostLN") + (i.param.dropout ? "Dropout" : "NoDropout") +
             variant_name(i.param.variant) + (i.param.attention_options ? "" : "Unpadded") +
             (i.param.max_pred ? "MaxPred" + std::to_string(i.param.max_pred) : "") +
             (i.param.fast_attention ? "FastAttentionBackward" : "");
    });

// The gathered head (max_pred slots) against S slots on the same batch: the same loss and
// gradients (the same rows reach the loss; only the GEMMs' row counts differ), and the workspace
// smaller by at least the logits of the B x (S - max_pred) rows it no longer holds.
TEST(BertGpuHead, MaxPredSlotsGiveTheAllSlotsResultsInLessMemory) {
  CUTRAIN_REQUIRE_GPU();
  for (bool pre_ln : {true, false}) {
    auto rng = test::fresh_rng();
    const model::TransformerParams table(bert_dims(pre_ln, true));
    const std::vector<float> p = bf16_params(table, rng());
    const int max_pred = 9;
    const Batch b = mlm_batch(1, rng, true, max_pred);
    const GpuRun all = run_gpu(table, false, p, b, 5, 1, 0), few = run_gpu(table, false, p, b, 5, 1, max_pred);
    const std::string what = pre_ln ? "pre-LN" : "post-LN";
    // The GEMMs on fewer rows may pick other algorithms: the bf16 logits can differ by an ulp.
    EXPECT_NEAR(few.loss, all.loss, 1e-3 * all.loss) << what;
    EXPECT_NEAR(few.eval_loss, all.eval_loss, 1e-3 * all.eval_loss) << what;
    EXPECT_LE(test::rel_error(few.grads, all.grads), 2e-2) << what;
    const std::size_t logits_rows = std::size_t(kB) * (kS - max_pred);
    EXPECT_GE(all.workspace - few.workspace, logits_rows * 1024 * sizeof(bf16)) << what;
  }
}

// More labelled rows in a sequence than the head has slots: the label status names the sequence
// (-(b + 1)) in training and evaluation; a bad label is reported first (its row + 1).
TEST(BertGpuHead, TooManyLabelsInASequenceSetTheLabelStatus) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const model::TransformerParams table(bert_dims(true, true));
  const std::vector<float> p = bf16_params(table, rng());
  Batch b = mlm_batch(1, rng, true, 6);
  for (int t = 0; t < 8; ++t) b.lab[std::size_t(kS) + t] = 3 + t;  // sequence 1: at least 8 labels
  ASSERT_GT(labels_in(b, 1), 6);
  ASSERT_LE(labels_in(b, 0), 6);
  run_gpu(table, false, p, b, 5, 1, 6, -2);
  b.lab[5] = 5000;  // outside the vocabulary: reported before the full sequence
  run_gpu(table, false, p, b, 5, 1, 6, 6);
  EXPECT_THROW(model::GpuTransformer(table, kB, kS, false, false, device_allocator(), false, {}, kS + 1), Error);
  EXPECT_THROW(model::GpuTransformer(table, kB, kS, false, false, device_allocator(), false, {}, -1), Error);
}

// Each flag against none: the workspace smaller by exactly the predicted bytes, the forward the
// same bits, the gradients the same (gelu_checkpoint and attn_dropout_checkpoint: the same bits;
// normalize_invertible: the backward from the output rounds differently).
TEST(BertGpuMemory, EachFlagSavesThePredictedBytes) {
  CUTRAIN_REQUIRE_GPU();
  for (bool pre_ln : {true, false})
    for (bool ckpt : {false, true}) {
      auto rng = test::fresh_rng();
      const model::ModelDims base = bert_dims(pre_ln, true);
      const model::TransformerParams t0(base);
      const std::vector<float> p = bf16_params(t0, rng());
      const int max_pred = ckpt ? 11 : 0;  // the head's GELU output on B x max_pred rows
      const Batch b = mlm_batch(1, rng, true, max_pred);
      const GpuRun g0 = run_gpu(t0, ckpt, p, b, 17, 2, max_pred);
      const auto saved = model::GpuTransformer::bert_flag_savings(base, kB, kS, ckpt, max_pred);
      struct Flag {
        Variant v;
        std::size_t bytes;
        bool same_bits;
      };
      for (const Flag f : {Flag{Variant::NormalizeInvertible, saved.normalize_invertible, false},
                           Flag{Variant::GeluCheckpoint, saved.gelu_checkpoint, true},
                           Flag{Variant::AttnDropoutCheckpoint, saved.attn_dropout_checkpoint, true}}) {
        const std::string what = std::string(variant_name(f.v)) + (pre_ln ? " pre-LN" : " post-LN") +
                                 (ckpt ? " checkpointing" : "");
        const model::TransformerParams t(with_variant(base, f.v));
        const GpuRun g = run_gpu(t, ckpt, p, b, 17, 2, max_pred);
        EXPECT_EQ(g0.workspace - g.workspace, f.bytes) << what;
        EXPECT_EQ(g.loss, g0.loss) << what;
        EXPECT_EQ(g.eval_loss, g0.eval_loss) << what;
        if (f.same_bits) EXPECT_EQ(g.grads, g0.grads) << what;
        else EXPECT_LE(test::rel_error(g.grads, g0.grads), 2e-2) << what;
      }
      const std::size_t M = kB * kS, P = kB * (max_pred ? max_pred : kS), h = 128, F = 384, sets = ckpt ? 1 : 2;
      EXPECT_EQ(saved.gelu_checkpoint, sets * M * F * 2);
      EXPECT_EQ(saved.normalize_invertible, sets * (pre_ln ? 1 : 2) * M * h * 2 + P * h * 2);
      EXPECT_EQ(saved.attn_dropout_checkpoint, 0u);
    }
}

namespace {

constexpr int kEngineMaxPred = 12;  // the engine's head slots; its batches are capped to fit

train::BackendOptions bert_engine(std::uint64_t seed, bool pre_ln) {
  train::BackendOptions o;
  o.dims = bert_dims(pre_ln, true);
  o.batch = kB;
  o.seq = kS;
  o.seed = seed;
  o.cuda_graph = true;
  o.max_predictions = kEngineMaxPred;
  return o;
}

// configs/lamb.json's optimizer (the BERT tutorial's LAMB) at this test's micro-batch.
train::TrainConfig lamb_config(int accumulation) {
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" +
                           std::to_string(accumulation) + R"(, "gradient_clipping": 1.0,
      "optimizer": {"type": "Lamb", "params": {"lr": 11e-3, "betas": [0.9, 0.999], "eps": 1e-8,
      "weight_decay": 0.01, "bias_correction": false, "max_coeff": 0.3, "min_coeff": 0.01}},
      "bf16": {"enabled": true}, "zero_optimization": {"stage": 0}})";
  train::TrainConfig c = train::parse_config(text, "test:lamb");
  c.resolve_batch(1);
  return c;
}

}  // namespace

TEST(BertGpuEngine, StepsDrawNewMasksGraphReplaysEqualEagerSteps) {
  CUTRAIN_REQUIRE_GPU();
  for (bool pre_ln : {true, false})
    for (int accum : {1, 2}) {
      auto rng = test::fresh_rng();
      train::BackendOptions eager = bert_engine(rng(), pre_ln), graph = eager, ckpt = eager;
      eager.cuda_graph = false;
      ckpt.activation_checkpointing = true;
      const train::TrainConfig cfg = lamb_config(accum);
      const std::string what = std::string(pre_ln ? "pre-LN" : "post-LN") + " accumulation " + std::to_string(accum);
      {
        // The masks are a function of the step: the same params and batch, another step, another loss.
        train::GpuEngine e(eager, cfg);
        const Batch b = mlm_batch(accum, rng, true, kEngineMaxPred);
        const double l1 = e.forward_backward(b.tok.data(), b.lab.data(), 1);
        EXPECT_EQ(l1, e.forward_backward(b.tok.data(), b.lab.data(), 1)) << what;
        EXPECT_NE(l1, e.forward_backward(b.tok.data(), b.lab.data(), 2)) << what;
      }
      train::GpuEngine a(eager, cfg), g(graph, cfg), c(ckpt, cfg);
      for (int step = 1; step <= 4; ++step) {
        const Batch b = mlm_batch(accum, rng, true, kEngineMaxPred);
        const train::StepStats sa = a.step(b.tok.data(), b.lab.data(), step, 1e-3f);
        const train::StepStats sg = g.step(b.tok.data(), b.lab.data(), step, 1e-3f);
        const train::StepStats sc = c.step(b.tok.data(), b.lab.data(), step, 1e-3f);
        EXPECT_TRUE(std::isfinite(sa.loss)) << what;
        EXPECT_FALSE(sa.skipped) << what;
        EXPECT_EQ(sa.loss, sg.loss) << "graph vs eager, step " << step << ", " << what;
        EXPECT_EQ(sa.grad_norm, sg.grad_norm) << "graph vs eager, step " << step << ", " << what;
        EXPECT_EQ(sa.loss, sc.loss) << "checkpointing vs none, step " << step << ", " << what;
        EXPECT_EQ(sa.grad_norm, sc.grad_norm) << "checkpointing vs none, step " << step << ", " << what;
      }
      EXPECT_TRUE(g.graph_active()) << what;
      EXPECT_EQ(a.download_params(), g.download_params()) << what;
    }
}

TEST(BertGpuEngine, NamesTheSequenceWithTooManyLabels) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  train::GpuEngine e(bert_engine(rng(), true), lamb_config(1));
  Batch b = mlm_batch(1, rng, true, kEngineMaxPred);
  for (int t = 0; t < kS; ++t) b.lab[std::size_t(kS) + t] = t < 40 ? 7 : -100;  // sequence 1: 40 labels
  try {
    e.step(b.tok.data(), b.lab.data(), 1, 1e-3f);
    ADD_FAILURE() << "a sequence with 40 labels and 12 slots was accepted";
  } catch (const Error& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("sequence 1 of micro-batch 0"), std::string::npos) << m;
    EXPECT_NE(m.find("max_predictions_per_seq=12"), std::string::npos) << m;
  }
}

TEST(BertGpuEngine, RefusesWhatItDoesNotImplement) {
  CUTRAIN_REQUIRE_GPU();
  model::ModelDims d = bert_dims(true, true);
  d.moe.experts = {0, 4};
  EXPECT_THROW(model::TransformerParams{d}, Error);
  const model::TransformerParams table(bert_dims(true, true));
  try {
    model::GpuTransformer m(table, kB, kS, false, false, device_allocator(), false, {1});
    ADD_FAILURE() << "random-LTD accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("random-LTD"), std::string::npos) << e.what();
  }
}

// ---- fp16 training in the engine (fp16.enabled): loss scaling, overflow, the stop at the floor ----

namespace {

// configs/bert_tiny_lamb_fp16.json's optimizer at this test's micro-batch with the fp16 block `fp16`.
train::TrainConfig fp16_config(const std::string& fp16, int accumulation = 1) {
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" +
                           std::to_string(accumulation) + R"(, "gradient_clipping": 1.0,
      "optimizer": {"type": "Lamb", "params": {"lr": 11e-3, "betas": [0.9, 0.999], "eps": 1e-8,
      "weight_decay": 0.01, "bias_correction": false, "max_coeff": 0.3, "min_coeff": 0.01}},
      "fp16": )" + fp16 + "}";
  train::TrainConfig c = train::parse_config(text, "test:fp16");
  c.resolve_batch(1);
  return c;
}

}  // namespace

// Dynamic scaling with the defaults: the engine's params are fp16, every step runs at 65536 and
// trains (finite, not skipped, the loss falls on a fixed batch); CUDA-graph replays give the eager
// steps' losses (the scale is a device word the captured part copies in); with accumulation the
// fp32 gradient buffer carries the scale too.
TEST(BertGpuEngineFp16, TrainsAndGraphReplaysEqualEagerSteps) {
  CUTRAIN_REQUIRE_GPU();
  for (int accum : {1, 2}) {
    auto rng = test::fresh_rng();
    train::BackendOptions eager = bert_engine(rng(), true), graph = eager;
    eager.cuda_graph = false;
    const train::TrainConfig cfg = fp16_config(R"({"enabled": true})", accum);
    train::GpuEngine a(eager, cfg), g(graph, cfg);
    EXPECT_EQ(a.plan().param, DType::F16);
    EXPECT_EQ(a.plan().grad, accum > 1 ? DType::F32 : DType::F16);
    EXPECT_EQ(a.loss_scale(), 65536.0);
    const Batch b = mlm_batch(accum, rng, true, kEngineMaxPred);
    double first = 0, last = 0;
    for (int step = 1; step <= 6; ++step) {
      const train::StepStats sa = a.step(b.tok.data(), b.lab.data(), step, 1e-3f);
      const train::StepStats sg = g.step(b.tok.data(), b.lab.data(), step, 1e-3f);
      EXPECT_TRUE(std::isfinite(sa.loss)) << "step " << step;
      EXPECT_FALSE(sa.skipped) << "step " << step;
      EXPECT_EQ(sa.loss_scale, 65536.0);
      EXPECT_EQ(sa.next_loss_scale, 65536.0);
      EXPECT_EQ(sa.loss, sg.loss) << "graph vs eager, step " << step;
      EXPECT_EQ(sa.grad_norm, sg.grad_norm) << "graph vs eager, step " << step;
      (step == 1 ? first : last) = sa.loss;
    }
    EXPECT_LT(last, first) << "accumulation " << accum;
    EXPECT_TRUE(g.graph_active());
    EXPECT_EQ(a.download_params(), g.download_params());
  }
}

// A scale far too large (2^30: the loss gradient alone overflows fp16): the step is skipped with
// params and master unchanged, hysteresis 2 keeps the scale once, then every overflow halves it, in
// eager steps and graph replays alike (the new scale reaches the replay through its device word).
TEST(BertGpuEngineFp16, OverflowSkipsTheStepAndHalvesTheScale) {
  CUTRAIN_REQUIRE_GPU();
  for (bool graph : {false, true}) {
    auto rng = test::fresh_rng();
    train::BackendOptions o = bert_engine(rng(), true);
    o.cuda_graph = graph;
    train::GpuEngine e(o, fp16_config(R"({"enabled": true, "initial_scale_power": 30})"));
    const Batch b = mlm_batch(1, rng, true, kEngineMaxPred);
    const std::vector<float> p0 = e.download_params();
    const std::vector<float> m0 = e.save_state().master;
    double scale = 1073741824.0;
    for (int step = 1; step <= 4; ++step) {
      const train::StepStats st = e.step(b.tok.data(), b.lab.data(), step, 1e-3f);
      SCOPED_TRACE((graph ? "graph, step " : "eager, step ") + std::to_string(step));
      EXPECT_TRUE(st.skipped);
      EXPECT_EQ(st.loss_scale, scale);
      const double next = step == 1 ? scale : scale / 2;  // hysteresis 2: the first overflow keeps it
      EXPECT_EQ(st.next_loss_scale, next);
      EXPECT_EQ(e.loss_scale(), next);
      EXPECT_TRUE(std::isfinite(st.loss)) << "the loss itself is finite; its gradient overflowed";
      EXPECT_EQ(e.download_params(), p0) << "a skipped step changed the fp16 params";
      EXPECT_EQ(e.save_state().master, m0) << "a skipped step changed the fp32 master";
      scale = next;
    }
  }
}

// An overflow at min_loss_scale with the hysteresis used up stops the run: LossScaleError naming
// fp16.min_loss_scale, the params untouched.
TEST(BertGpuEngineFp16, OverflowAtMinLossScaleIsAnError) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  train::GpuEngine e(bert_engine(rng(), true),
                     fp16_config(R"({"enabled": true, "initial_scale_power": 30, "min_loss_scale": 1073741824,
                                     "hysteresis": 1})"));
  const Batch b = mlm_batch(1, rng, true, kEngineMaxPred);
  const std::vector<float> p0 = e.download_params();
  try {
    e.step(b.tok.data(), b.lab.data(), 1, 1e-3f);
    ADD_FAILURE() << "an overflow at min_loss_scale did not stop the run";
  } catch (const train::LossScaleError& err) {
    EXPECT_NE(std::string(err.what()).find("fp16.min_loss_scale"), std::string::npos) << err.what();
  }
  EXPECT_EQ(e.download_params(), p0);
}

// The fp16 engine refuses the features that are bf16 only or not threaded with the loss scale
// (the pipeline's program, tensor parallelism, a sequence-length curriculum's shapes), each named
// before any work; the fp16 model refuses distillation (its kd_loss kernel is bf16).
TEST(BertGpuEngineFp16, RefusesTheBf16OnlyFeatures) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::TrainConfig cfg = fp16_config(R"({"enabled": true})");
  auto expect_refusal = [&](const train::BackendOptions& o, const std::string& what) {
    try {
      train::GpuEngine e(o, cfg);
      ADD_FAILURE() << "fp16 accepted " << what;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find("fp16.enabled"), std::string::npos) << err.what();
    }
  };
  train::BackendOptions pipe = bert_engine(rng(), true);
  pipe.pipeline_engine = true;
  expect_refusal(pipe, "pipeline");
  train::BackendOptions tp = bert_engine(rng(), true);
  tp.tensor_parallel_engine = true;
  expect_refusal(tp, "tensor parallelism");
  train::BackendOptions seqlen = bert_engine(rng(), true);
  seqlen.max_tokens = 2 * std::size_t(seqlen.batch) * std::size_t(seqlen.seq);
  expect_refusal(seqlen, "sequence-length curriculum");
  {
    train::GpuEngine e(bert_engine(rng(), true), cfg);
    try {
      e.set_seq_shape(kB, kS / 2);
      ADD_FAILURE() << "fp16 accepted a shorter micro-batch";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("fp16.enabled"), std::string::npos) << err.what();
    }
  }
  const model::TransformerParams table(model::ModelDims{128, 2, 2, 1000, 64});
  model::GpuTransformerT<f16> m(table, kB, kS, false, true, device_allocator());
  model::GpuDistillation d;
  d.teacher_logits = reinterpret_cast<bf16*>(std::uintptr_t{256});  // never read: refused first
  d.ld_t = 1000;
  d.d_kd_loss = reinterpret_cast<float*>(std::uintptr_t{256});
  try {
    m.set_distillation(&d);
    ADD_FAILURE() << "the fp16 model accepted distillation";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("bf16 only"), std::string::npos) << err.what();
  }
  m.set_distillation(nullptr);  // off is always fine
}

// The fp16 model refuses MoE blocks (their layer is bf16 only), naming them.
TEST(BertGpuEngineFp16, RefusesMoeBlocks) {
  CUTRAIN_REQUIRE_GPU();
  model::ModelDims d{128, 2, 2, 1000, 64};
  d.moe.experts = {0, 4};
  const model::TransformerParams table(d);
  try {
    model::GpuTransformerT<f16> m(table, kB, kS, false, false, device_allocator());
    ADD_FAILURE() << "an fp16 model with MoE blocks was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MoE blocks run in bf16 only"), std::string::npos) << e.what();
  }
}

