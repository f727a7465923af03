// The GPU model and engine against the CPU reference model, for each precision layout: the loss
// and every parameter gradient at step 0, 20 training steps of losses, the persistent bytes per
// parameter, CUDA-graph replay == eager, activation checkpointing == none, gradient accumulation;
// the gradients with the fast attention backward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <limits>

#include <unistd.h>

#include <filesystem>

#include "model/reference_model.h"
#include "runtime/file_util.h"
#include "tests/support/cpu_test_util.h"
#include "tests/support/small_model.h"
#include "tests/support/test_support.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train/config.h"
#include "train/engine.h"

using namespace cutrain;

namespace {

using test::small_model;

train::TrainConfig config_for(const std::string& layout, int accumulation = 1, float clip = 0.f) {
  std::string bf16 = test::bf16_section(layout);
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" +
                           std::to_string(accumulation) + R"(, "gradient_clipping": )" + std::to_string(clip) +
                           R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999],
                           "eps": 1e-8, "weight_decay": 0.01}}, "bf16": {)" + bf16 + "}}";
  train::TrainConfig c = train::parse_config(text, "test:" + layout);
  c.resolve_batch(1);
  return c;
}

struct Batch {
  std::vector<std::int32_t> tokens, labels;
};
Batch random_batch(std::mt19937_64& rng, std::size_t n, int vocab) {
  return {test::random_ints(n, rng, 0, vocab - 1), test::random_ints(n, rng, 0, vocab - 1)};
}

std::vector<double> to_double(const std::vector<float>& v) {
  std::vector<double> d(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) d[i] = v[i];
  return d;
}

// Every parameter's gradient against the reference's (want), by relative error, named on failure.
void expect_grads_match(const model::TransformerParams& table, const std::vector<float>& grads,
                        const std::vector<double>& want, const std::string& what) {
  for (const auto& t : table.tensors()) {
    std::vector<float> out(grads.begin() + t.offset, grads.begin() + t.offset + t.count);
    std::vector<double> w(want.begin() + t.offset, want.begin() + t.offset + t.count);
    EXPECT_LE(test::rel_error(out, w), 2e-2) << what << ": " << t.name;
  }
}

// One batch's loss and gradients from the GPU against the fp64 reference model, which sees exactly
// the GPU's (bf16-rounded) parameters.
void expect_step_matches_reference(const train::GpuEngine& eng, const train::BackendOptions& o, const Batch& b,
                                   double loss, const std::vector<float>& grads, const std::string& what) {
  std::vector<double> p = to_double(eng.download_params()), g(grads.size(), 0.0);
  model::ReferenceModel<double> ref(eng.table(), o.causal);
  const double ref_loss = ref.forward(p.data(), b.tokens.data(), b.labels.data(), o.batch, o.seq);
  ref.backward(p.data(), g.data());
  EXPECT_NEAR(loss, ref_loss, 2e-2 * ref_loss) << what;
  expect_grads_match(eng.table(), grads, g, what);
}

// The resume tests' run: a small model of `layout`, six random batches and the losses of six
// uninterrupted steps over them.
struct ResumeCase {
  train::BackendOptions o;
  train::TrainConfig cfg;
  std::vector<Batch> batches;
  std::vector<double> full;
};
ResumeCase resume_case(const char* layout) {
  auto rng = test::fresh_rng();
  ResumeCase r{small_model(rng()), config_for(layout), {}, {}};
  for (int i = 0; i < 6; ++i) r.batches.push_back(random_batch(rng, std::size_t(r.o.batch) * r.o.seq, r.o.dims.vocab));
  train::GpuEngine a(r.o, r.cfg);
  for (int s = 0; s < 6; ++s)
    r.full.push_back(a.step(r.batches[s].tokens.data(), r.batches[s].labels.data(), s + 1, 1e-3f).loss);
  return r;
}

class ModelGpu : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(ModelGpu, LossAndEveryGradientMatchTheReferenceAtStep0) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = small_model(rng());
  train::GpuEngine eng(o, config_for(GetParam()));
  const Batch b = random_batch(rng, std::size_t(o.batch) * o.seq, o.dims.vocab);
  eng.poison_grads();
  const double loss = eng.forward_backward(b.tokens.data(), b.labels.data());
  const std::vector<float> grads = eng.download_grads();
  EXPECT_EQ(test::count_nan(grads), 0u) << "gradient elements left unwritten (poison) or non-finite";
  expect_step_matches_reference(eng, o, b, loss, grads, GetParam());
}

TEST_P(ModelGpu, TwentyStepsFollowTheReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = small_model(rng());
  const train::TrainConfig cfg = config_for(GetParam());
  train::GpuEngine eng(o, cfg);
  const std::vector<float> init = eng.download_params();
  std::vector<float> p = init, g(init.size()), m(init.size(), 0.f), v(init.size(), 0.f);
  model::ReferenceModel<float> ref(eng.table());
  const std::size_t n = std::size_t(o.batch) * o.seq;
  double first = 0, last = 0;
  for (int step = 1; step <= 20; ++step) {
    const Batch b = random_batch(rng, n, o.dims.vocab);
    const train::StepStats st = eng.step(b.tokens.data(), b.labels.data(), step, 1e-3f);
    const double ref_loss = ref.forward(p.data(), b.tokens.data(), b.labels.data(), o.batch, o.seq);
    std::fill(g.begin(), g.end(), 0.f);
    ref.backward(p.data(), g.data());
    model::reference_adam_step(p.data(), g.data(), m.data(), v.data(), p.size(), 1e-3, 0.9, 0.999, 1e-8, 0.01, true, step);
    EXPECT_FALSE(st.skipped);
    EXPECT_NEAR(st.loss, ref_loss, 0.02 * ref_loss) << GetParam() << " step " << step;
    if (step == 1) first = st.loss;
    last = st.loss;
  }
  EXPECT_TRUE(eng.graph_active()) << "CUDA graph replay should be on after the warm-up step";
  EXPECT_TRUE(std::isfinite(last) && std::isfinite(first));
}

TEST_P(ModelGpu, PersistentBytesMatchTheLayout) {
  CUTRAIN_REQUIRE_GPU();
  const train::BackendOptions o = small_model(7);
  for (int accum : {1, 2}) {
    train::GpuEngine eng(o, config_for(GetParam(), accum));
    const std::size_t want = eng.table().flat_size() * eng.plan().bytes_per_param();
    EXPECT_EQ(eng.state_requested_bytes(), want) << GetParam() << " accumulation " << accum;
    // Handed out: 512 B rounding, and a cached block reused whole when the rest would be < 1 MiB.
    EXPECT_GE(eng.state_bytes(), want);
    EXPECT_LE(eng.state_bytes(), want + 5 * ((1u << 20) + 512)) << GetParam() << " accumulation " << accum;
  }
}

TEST_P(ModelGpu, GraphReplayEqualsEagerAndCheckpointingEqualsNone) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::uint64_t seed = rng();
  train::BackendOptions eager = small_model(seed), graph = eager, ckpt = eager;
  eager.cuda_graph = false;
  ckpt.activation_checkpointing = true;
  const train::TrainConfig cfg = config_for(GetParam(), 1, 1.0f);  // clipping on too
  train::GpuEngine a(eager, cfg), b(graph, cfg), c(ckpt, cfg);
  for (int step = 1; step <= 5; ++step) {
    const Batch batch = random_batch(rng, std::size_t(eager.batch) * eager.seq, eager.dims.vocab);
    const train::StepStats sa = a.step(batch.tokens.data(), batch.labels.data(), step, 1e-3f);
    const train::StepStats sb = b.step(batch.tokens.data(), batch.labels.data(), step, 1e-3f);
    const train::StepStats sc = c.step(batch.tokens.data(), batch.labels.data(), step, 1e-3f);
    EXPECT_EQ(sa.loss, sb.loss) << "graph vs eager, step " << step;
    EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "graph vs eager, step " << step;
    EXPECT_EQ(sa.loss, sc.loss) << "checkpointing vs none, step " << step;
  }
  EXPECT_FALSE(a.graph_active());
  EXPECT_TRUE(b.graph_active());
  // Releasing the workspace frees memory; the next steps allocate and capture again, same bits.
  const std::int64_t held = b.memory().allocated;
  b.release_workspace();
  EXPECT_LT(b.memory().allocated, held);
  EXPECT_FALSE(b.graph_active());
  for (int step = 6; step <= 7; ++step) {
    const Batch batch = random_batch(rng, std::size_t(eager.batch) * eager.seq, eager.dims.vocab);
    EXPECT_EQ(a.step(batch.tokens.data(), batch.labels.data(), step, 1e-3f).loss,
              b.step(batch.tokens.data(), batch.labels.data(), step, 1e-3f).loss) << "after release, step " << step;
    c.step(batch.tokens.data(), batch.labels.data(), step, 1e-3f);
  }
  EXPECT_EQ(a.download_params(), b.download_params());
  EXPECT_EQ(a.download_params(), c.download_params());
}

TEST_P(ModelGpu, AccumulationAveragesTheMicroBatches) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = small_model(rng());
  train::GpuEngine eng(o, config_for(GetParam(), 2));
  const std::size_t n = std::size_t(o.batch) * o.seq;
  const Batch b = random_batch(rng, 2 * n, o.dims.vocab);
  eng.poison_grads();  // the first micro-batch must write, not add
  const double loss = eng.forward_backward(b.tokens.data(), b.labels.data());
  const std::vector<float> grads = eng.download_grads();
  const std::vector<float> params = eng.download_params();
  std::vector<double> p = to_double(params), g(params.size(), 0.0);
  model::ReferenceModel<double> ref(eng.table());
  double ref_loss = 0;
  for (int a = 0; a < 2; ++a) {
    ref_loss += 0.5 * ref.forward(p.data(), b.tokens.data() + a * n, b.labels.data() + a * n, o.batch, o.seq);
    ref.backward(p.data(), g.data(), 0.5);
  }
  EXPECT_NEAR(loss, ref_loss, 2e-2 * ref_loss);
  expect_grads_match(eng.table(), grads, g, GetParam());
}

TEST_P(ModelGpu, BadTokenIsReportedWithItsPosition) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = small_model(rng());
  train::GpuEngine eng(o, config_for(GetParam()));
  Batch b = random_batch(rng, std::size_t(o.batch) * o.seq, o.dims.vocab);
  b.tokens[37] = o.dims.vocab + 5;
  try {
    eng.forward_backward(b.tokens.data(), b.labels.data());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 37"), std::string::npos) << e.what();
  }
}

TEST_P(ModelGpu, NonFiniteGradientsSkipTheStep) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = small_model(rng());
  train::GpuEngine eng(o, config_for(GetParam(), 1, 1.0f));
  train::HostState st = eng.save_state();
  const std::size_t bad = eng.table().tensor(eng.table().output_b()).offset + 3;
  st.params[bad] = std::numeric_limits<float>::infinity();
  if (!st.master.empty()) st.master[bad] = st.params[bad];
  eng.load_state(st);
  const std::vector<float> before = eng.download_params();
  const Batch b = random_batch(rng, std::size_t(o.batch) * o.seq, o.dims.vocab);
  const train::StepStats s = eng.step(b.tokens.data(), b.labels.data(), 1, 1e-3f);
  EXPECT_TRUE(s.skipped) << "grad norm " << s.grad_norm;
  const std::vector<float> after = eng.download_params();
  for (std::size_t i = 0; i < before.size(); ++i)
    if (i != bad) {
      ASSERT_EQ(before[i], after[i]) << "param " << i << " changed in a skipped step";
    }
}

TEST_P(ModelGpu, ResumeFromACheckpointIsBitIdentical) {
  CUTRAIN_REQUIRE_GPU();
  const ResumeCase rc = resume_case(GetParam());
  const auto& [o, cfg, batches, full] = rc;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("cutrain_gpu_ckpt_" + std::string(GetParam()) + "_" + std::to_string(::getpid()));
  {
    train::GpuEngine b(o, cfg);
    for (int s = 0; s < 3; ++s) b.step(batches[s].tokens.data(), batches[s].labels.data(), s + 1, 1e-3f);
    train::save_checkpoint(dir, b, train::CheckpointMeta{3, "", GetParam(), false});
  }
  // The step folder, verified against its manifest before the load; bf16 params on the GPU.
  const train::OpenedCheckpoint opened = train::open_checkpoint(dir);
  EXPECT_EQ(opened.folder, dir / "global_step3");
  EXPECT_EQ(opened.manifest.config["param_dtype"], "BF16");
  EXPECT_EQ(opened.manifest.config["precision_layout"], GetParam());
  train::GpuEngine c(o, config_for(GetParam()));
  EXPECT_EQ(train::load_checkpoint(opened, c).step, 3);
  for (int s = 3; s < 6; ++s)
    EXPECT_EQ(c.step(batches[s].tokens.data(), batches[s].labels.data(), s + 1, 1e-3f).loss, full[s]) << "step " << s;
  std::filesystem::remove_all(dir);
}

// The background save: the snapshot (one device-to-host copy per buffer, pinned) equals the
// state save_state() gives; training goes on unchanged while the write runs; the folder resumes
// bit-identically; the moments are stored in their own dtype.
TEST_P(ModelGpu, AsyncSaveWhileTrainingResumesBitIdentical) {
  CUTRAIN_REQUIRE_GPU();
  const ResumeCase rc = resume_case(GetParam());
  const auto& [o, cfg, batches, full] = rc;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("cutrain_gpu_async_ckpt_" + std::string(GetParam()) + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    train::GpuEngine b(o, cfg);
    for (int s = 0; s < 3; ++s) b.step(batches[s].tokens.data(), batches[s].labels.data(), s + 1, 1e-3f);
    train::StateSnapshot fast, slow;
    fast.pinned = true;
    b.snapshot_state(fast);
    train::snapshot_from_host_state(b.save_state(), slow);
    for (auto [f, w, what] : {std::tuple{&fast.params, &slow.params, "params"}, {&fast.master, &slow.master, "master"},
                              {&fast.exp_avg, &slow.exp_avg, "exp_avg"}, {&fast.exp_avg_sq, &slow.exp_avg_sq, "exp_avg_sq"},
                              {&fast.compensation, &slow.compensation, "compensation"}}) {
      ASSERT_EQ(f->dtype(), w->dtype()) << what;
      ASSERT_EQ(f->bytes(), w->bytes()) << what;
      if (f->bytes() > 0) {
        EXPECT_EQ(std::memcmp(f->data(), w->data(), f->bytes()), 0) << what;
      }
    }
    train::CheckpointWriter writer({dir, train::CheckpointIo::Auto, 0, /*async=*/true, true});
    writer.save(b, train::CheckpointMeta{3, "", GetParam(), false});
    for (int s = 3; s < 6; ++s)  // while the write runs
      EXPECT_EQ(b.step(batches[s].tokens.data(), batches[s].labels.data(), s + 1, 1e-3f).loss, full[s]) << "step " << s;
    writer.wait();
    const auto done = writer.take_finished();
    ASSERT_EQ(done.size(), 1u);
    EXPECT_TRUE(done[0].ok) << done[0].error;
  }
  const train::OpenedCheckpoint opened = train::open_checkpoint(dir, false, /*checksum_on_load=*/true);
  EXPECT_EQ(opened.manifest.config["optimizer_dtype"], std::string(GetParam()).rfind("bf16_full", 0) == 0 ? "BF16" : "F32");
  // The aio path loads into device scratch; the plain path through a host snapshot: the same state.
  for (auto io : {train::CheckpointIo::Aio, train::CheckpointIo::Plain}) {
    train::GpuEngine c(o, cfg);
    EXPECT_EQ(train::load_checkpoint(opened, c, io).step, 3);
    for (int s = 3; s < 6; ++s)
      EXPECT_EQ(c.step(batches[s].tokens.data(), batches[s].labels.data(), s + 1, 1e-3f).loss, full[s])
          << "step " << s << ", io " << train::checkpoint_io_name(io);
  }
  // A damaged optimizer file (one byte, same size) is refused at load, the engine's state unchanged.
  const auto f = opened.folder / train::kCheckpointOptimFile;
  std::string bytes = read_text_file(f);
  bytes[bytes.size() / 2] ^= 0x10;
  write_file_atomic(f, std::string_view(bytes));
  for (auto io : {train::CheckpointIo::Aio, train::CheckpointIo::Plain}) {
    train::GpuEngine d(o, cfg);
    const train::HostState before = d.save_state();
    EXPECT_HAS(test::message_of([&] { train::load_checkpoint(train::open_checkpoint(dir, false, true), d, io); }),
               "file optimizer.safetensors: expected XXH64");
    const train::HostState after = d.save_state();
    EXPECT_EQ(after.params, before.params);
    EXPECT_EQ(after.exp_avg, before.exp_avg);
    EXPECT_EQ(after.exp_avg_sq, before.exp_avg_sq);
    EXPECT_EQ(after.master, before.master);
    EXPECT_EQ(after.compensation, before.compensation);
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ModelGpu,
                         ::testing::Values("baseline", "bf16_master_wg", "bf16_full", "bf16_master_wg_comp",
                                           "bf16_full_comp"),
                         [](const auto& info) { return std::string(info.param); });

TEST(ModelGpuWide, GradientsMatchAtHeadDim128) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const train::BackendOptions o = small_model(rng(), 256, 2);  // head_dim 128
  train::GpuEngine eng(o, config_for("bf16_full"));
  const Batch b = random_batch(rng, std::size_t(o.batch) * o.seq, o.dims.vocab);
  const double loss = eng.forward_backward(b.tokens.data(), b.labels.data());
  expect_step_matches_reference(eng, o, b, loss, eng.download_grads(), "head dim 128");
}

// --attention_backward fast at head dim 64 (dQ by fp32 reduce-adds in any order), for both masks:
// the step-0 test's tolerance, since only dQ's fp32 summation order differs.
TEST(ModelGpuFastAttention, LossAndEveryGradientMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    auto rng = test::fresh_rng();
    train::BackendOptions o = small_model(rng());
    o.causal = causal;
    o.deterministic_attention = false;
    train::GpuEngine eng(o, config_for("bf16_full"));
    const Batch b = random_batch(rng, std::size_t(o.batch) * o.seq, o.dims.vocab);
    eng.poison_grads();
    const double loss = eng.forward_backward(b.tokens.data(), b.labels.data());
    const std::vector<float> grads = eng.download_grads();
    EXPECT_EQ(test::count_nan(grads), 0u) << "gradient elements left unwritten (poison) or non-finite";
    expect_step_matches_reference(eng, o, b, loss, grads, "fast attention backward");
  }
}

// Evaluation (--eval_data): the forward alone gives the training forward's loss and the
// reference's, for both masks, and leaves parameters and the step graph as they were.
TEST(ModelGpuEval, EvalLossMatchesTheReferenceAndLeavesTheStateAlone) {
  CUTRAIN_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    auto rng = test::fresh_rng();
    train::BackendOptions o = small_model(rng());
    o.causal = causal;
    train::GpuEngine eng(o, config_for("bf16_master_wg"));
    const std::size_t n = std::size_t(o.batch) * o.seq;
    for (int s = 1; s <= 3; ++s) {  // eager step, capture, replay: the graph exists before the eval
      const Batch b = random_batch(rng, n, o.dims.vocab);
      eng.step(b.tokens.data(), b.labels.data(), s, 1e-3f);
    }
    const bool graph = eng.graph_active();
    const std::vector<float> before = eng.download_params();
    const Batch b = random_batch(rng, n, o.dims.vocab);
    const double eval = eng.eval_loss(b.tokens.data(), b.labels.data());
    EXPECT_EQ(eng.download_params(), before) << "evaluation changed the parameters";
    EXPECT_EQ(eng.graph_active(), graph);
    std::vector<double> p = to_double(before);
    model::ReferenceModel<double> ref(eng.table(), causal);
    const double ref_loss = ref.forward(p.data(), b.tokens.data(), b.labels.data(), o.batch, o.seq);
    EXPECT_NEAR(eval, ref_loss, 2e-2 * ref_loss) << (causal ? "causal" : "bidirectional");
    const double trained = eng.forward_backward(b.tokens.data(), b.labels.data());
    EXPECT_NEAR(eval, trained, 1e-5 * trained) << "eval and training forward disagree";
    // A bad label is still an error naming it, and the engine goes on afterwards.
    Batch bad = b;
    bad.labels[5] = o.dims.vocab;
    EXPECT_THROW(eng.eval_loss(bad.tokens.data(), bad.labels.data()), Error);
    EXPECT_NEAR(eng.eval_loss(b.tokens.data(), b.labels.data()), eval, 1e-6 * eval);
  }
}

// --pad_vocab: 1000 -> 1024 rows. The padded logits take no part in the loss and the padded rows
// of the embedding and the output projection get exactly zero gradient; the rest matches the
// (padded) reference.
TEST(ModelGpuPadVocab, PaddedRowsGetNoLossAndNoGradient) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  train::BackendOptions o = small_model(rng());
  o.dims.padded_vocab = 1024;
  o.causal = true;
  train::GpuEngine eng(o, config_for("baseline"));
  const model::TransformerParams& t = eng.table();
  ASSERT_EQ(t.tensor(t.embedding()).shape[0], 1024);
  ASSERT_EQ(t.tensor(t.output_w()).shape[0], 1024);
  const Batch b = random_batch(rng, std::size_t(o.batch) * o.seq, o.dims.vocab);
  eng.poison_grads();
  const double loss = eng.forward_backward(b.tokens.data(), b.labels.data());
  const std::vector<float> grads = eng.download_grads();
  EXPECT_EQ(test::count_nan(grads), 0u) << "gradient elements left unwritten (poison) or non-finite";
  const int h = o.dims.hidden;
  for (int idx : {t.embedding(), t.output_w(), t.output_b()}) {
    const model::ParamTensor& p = t.tensor(idx);
    const std::size_t row = p.shape.size() == 2 ? std::size_t(h) : 1;
    for (std::size_t i = std::size_t(o.dims.vocab) * row; i < p.count; ++i)
      ASSERT_EQ(grads[p.offset + i], 0.f) << p.name << " padded element " << i;
  }
  std::vector<double> p = to_double(eng.download_params()), g(grads.size(), 0.0);
  model::ReferenceModel<double> ref(t, true);
  const double ref_loss = ref.forward(p.data(), b.tokens.data(), b.labels.data(), o.batch, o.seq);
  ref.backward(p.data(), g.data());
  EXPECT_NEAR(loss, ref_loss, 2e-2 * ref_loss);
  for (const auto& pt : t.tensors()) {
    std::vector<float> out(grads.begin() + pt.offset, grads.begin() + pt.offset + pt.count);
    std::vector<double> want(g.begin() + pt.offset, g.begin() + pt.offset + pt.count);
    EXPECT_LE(test::rel_error(out, want), 2e-2) << pt.name;
  }
}
