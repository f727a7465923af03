// @brief Mixture-of-Students / knowledge distillation on the CPU: the host distillation loss against
// the fp64 reference and finite differences; the CPU backend's distillation term against one
// computed here from the two reference models, the whole objective's gradient (alpha * ce +
// beta * T^2 * KL + coeff * l_aux) by finite differences, teacher == student at T = 1 giving 0,
// the stop step freeing the teacher and the steps after it equal to an LM-only run from the same
// state; the flags' and the teacher checkpoint's refusals, each naming the field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>

#include "model/distillation_loss.h"
#include "model/reference_model.h"
#include "runtime/file_util.h"
#include "runtime/xxhash64.h"
#include "tests/reference/kd_loss_ref.h"
#include "tests/support/cpu_test_util.h"
#include "tests/support/test_support.h"
#include "tests/support/tiny_cpu_backend.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/cpu_backend.h"
#include "train/mos_options.h"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "expected '" << part << "' in: " << text;
}

// ---- the loss itself ----

struct LossCase {
  int rows, vocab, ld_s, ld_t;
  double temperature;
};

TEST(DistillationLoss, MatchesTheReferenceOverOddShapes) {
  auto rng = test::fresh_rng();
  for (const LossCase c : {LossCase{1, 1, 1, 1, 1.0}, LossCase{3, 7, 9, 8, 2.0}, LossCase{13, 101, 101, 128, 0.5},
                           LossCase{5, 1000, 1003, 1001, 4.0}}) {
    const auto s = test::random_normal(std::size_t(c.rows) * c.ld_s, rng, 0.f, 2.f);
    const auto t = test::random_normal(std::size_t(c.rows) * c.ld_t, rng, 0.f, 2.f);
    const double grad_scale = 0.7;
    const ref::KdLossResult want = ref::kd_loss(s, c.ld_s, t, c.ld_t, c.rows, c.vocab, c.temperature, grad_scale);
    // Added onto a gradient already there; padding columns untouched (poisoned with NaN).
    std::vector<float> prev = test::random_normal(s.size(), rng, 0.f, 0.1f), d = prev;
    for (int m = 0; m < c.rows; ++m)
      for (int v = c.vocab; v < c.ld_s; ++v) d[std::size_t(m) * c.ld_s + v] = NAN;
    const double loss =
        model::distillation_loss(s.data(), c.ld_s, t.data(), c.ld_t, c.rows, c.vocab, c.temperature, grad_scale, d.data());
    EXPECT_NEAR(loss, want.loss_mean, 1e-9 * (1 + std::abs(want.loss_mean))) << c.vocab;
    std::vector<float> got;
    std::vector<double> ref;
    for (int m = 0; m < c.rows; ++m) {
      for (int v = 0; v < c.vocab; ++v) {
        const std::size_t i = std::size_t(m) * c.ld_s + v;
        got.push_back(d[i]);
        ref.push_back(double(prev[i]) + want.dstudent[i]);
      }
      for (int v = c.vocab; v < c.ld_s; ++v) ASSERT_TRUE(std::isnan(d[std::size_t(m) * c.ld_s + v]));
    }
    EXPECT_LE(test::rel_error(got, ref), 1e-6) << c.vocab;
  }
}

TEST(DistillationLoss, GradientByFiniteDifferences) {
  auto rng = test::fresh_rng();
  const int rows = 4, vocab = 9, ld = 11;
  for (double temp : {1.0, 2.5}) {
    const auto sf = test::random_normal(std::size_t(rows) * ld, rng, 0.f, 1.5f);
    const auto tf = test::random_normal(std::size_t(rows) * ld, rng, 0.f, 1.5f);
    std::vector<double> s(sf.begin(), sf.end()), t(tf.begin(), tf.end()), g(s.size(), 0.0);
    const double scale = 1.3;
    model::distillation_loss(s.data(), ld, t.data(), ld, rows, vocab, temp, scale, g.data());
    std::vector<float> fd;
    std::vector<double> an;
    for (int m = 0; m < rows; ++m)
      for (int v = 0; v < vocab; ++v) {
        double& x = s[std::size_t(m) * ld + v];
        const double x0 = x, h = 1e-6;
        x = x0 + h;
        const double lp = model::distillation_loss<double>(s.data(), ld, t.data(), ld, rows, vocab, temp, 0, nullptr);
        x = x0 - h;
        const double lm = model::distillation_loss<double>(s.data(), ld, t.data(), ld, rows, vocab, temp, 0, nullptr);
        x = x0;
        fd.push_back(float(scale * (lp - lm) / (2 * h)));
        an.push_back(g[std::size_t(m) * ld + v]);
      }
    EXPECT_LE(test::rel_error(fd, an), 1e-6) << "T " << temp;
  }
}

TEST(DistillationLoss, TeacherEqualToStudentAtTemperatureOneIsZeroAndBadTemperaturesAreRefused) {
  auto rng = test::fresh_rng();
  const auto x = test::random_normal(6 * 50, rng, 0.f, 3.f);
  std::vector<float> g(x.size(), 0.f);
  EXPECT_NEAR(model::distillation_loss(x.data(), 50, x.data(), 50, 6, 50, 1.0, 1.0, g.data()), 0.0, 1e-12);
  for (float v : g) ASSERT_NEAR(v, 0.f, 1e-9f);
  for (double bad : {0.0, -1.0, double(NAN), double(INFINITY)})
    expect_has(test::error_of([&] { model::distillation_loss<float>(x.data(), 50, x.data(), 50, 6, 50, bad, 1, nullptr); }),
               "temperature");
}

// ---- the CPU backend with a teacher ----

// A GPT-2 student of 2 blocks, block 1 a MoE block of 4 experts (top-1; eval capacity factor
// `eval_cf`), vocab 37, seq 6, batch 2.
train::BackendOptions student_options(double eval_cf = 1.0) {
  train::BackendOptions o;
  o.dims = model::ModelDims{16, 2, 2, 37, 6};
  o.dims.arch = model::Arch::Gpt2;
  o.dims.moe.experts = {0, 4};
  o.dims.moe.min_capacity = 1;
  o.dims.moe.capacity_factor = 1.0;
  o.dims.moe.eval_capacity_factor = eval_cf;
  o.dims.moe.loss_coeff = 0.05;
  o.batch = 2;
  o.seq = 6;
  o.seed = 11;
  o.causal = true;
  return o;
}

// A teacher of another shape (3 dense blocks of 24, the same vocabulary), its params from `seed`.
std::shared_ptr<train::Teacher> make_teacher(const model::ModelDims& dims, std::uint64_t seed, bool causal = true) {
  auto t = std::make_shared<train::Teacher>();
  t->dims = dims;
  t->causal = causal;
  const model::TransformerParams table(dims);
  t->params.assign(table.flat_size(), 0.f);
  table.init(t->params.data(), seed);
  return t;
}
model::ModelDims teacher_dims() {
  model::ModelDims d{24, 3, 3, 37, 8};
  d.arch = model::Arch::Gpt2;
  return d;
}

struct Batch {
  std::vector<std::int32_t> tok, lab;
};
Batch random_batch(std::mt19937_64& rng, std::size_t n, int vocab) {
  return {test::random_ints(n, rng, 0, vocab - 1), test::random_ints(n, rng, 0, vocab - 1)};
}

TEST(MosBackend, DistillationTermEqualsOneComputedFromTheTwoReferenceModels) {
  auto rng = test::fresh_rng();
  train::BackendOptions o = student_options(/*eval_cf=*/0.5);  // the teacher's capacity is not the student's concern
  auto teacher = make_teacher(teacher_dims(), 5);
  teacher->dims.moe.experts = {2, 0, 2};  // a MoE teacher, run at its eval capacity factor
  teacher->dims.moe.min_capacity = 1;
  teacher->dims.moe.eval_capacity_factor = 0.5;
  {
    const model::TransformerParams tt(teacher->dims);
    teacher->params.assign(tt.flat_size(), 0.f);
    tt.init(teacher->params.data(), 5);
  }
  o.teacher = teacher;
  o.distill.mos = true;
  o.distill.kd_alpha_ce = 0.6;
  o.distill.kd_beta_ce = 1.7;
  o.distill.kd_temp = 2.0;
  train::TrainConfig cfg = test::tiny_adamw_config("test:mos");
  auto be = train::make_cpu_backend(o, cfg);
  EXPECT_TRUE(be->holds_teacher());
  const Batch b = random_batch(rng, std::size_t(o.batch) * o.seq, o.dims.vocab);
  // The term from the initial parameters, before the step changes them.
  const model::TransformerParams st(o.dims);
  std::vector<double> sp(st.flat_size()), tp(teacher->params.begin(), teacher->params.end());
  {
    std::vector<float> f(st.flat_size());
    st.init(f.data(), o.seed);
    sp.assign(f.begin(), f.end());
  }
  model::ReferenceModel<double> sm(st, true);
  const model::TransformerParams tt(teacher->dims);
  model::ReferenceModel<double> tm2(tt, true);
  sm.set_moe_mode(true, model::moe_forward_seed(o.seed, 1, 0));
  const double ce = sm.forward(sp.data(), b.tok.data(), b.lab.data(), o.batch, o.seq);
  tm2.set_moe_mode(false);
  tm2.forward(tp.data(), b.tok.data(), b.lab.data(), o.batch, o.seq);
  const std::vector<float> sl(sm.logits().begin(), sm.logits().end()), tl(tm2.logits().begin(), tm2.logits().end());
  const ref::KdLossResult want = ref::kd_loss(sl, st.dims().vocab_rows(), tl, tt.dims().vocab_rows(), o.batch * o.seq,
                                              o.dims.vocab, o.distill.kd_temp);
  const train::StepStats s = be->step(b.tok.data(), b.lab.data(), 1, 1e-3f);
  EXPECT_TRUE(s.distilled);
  EXPECT_GT(want.loss_mean, 1e-3);
  EXPECT_NEAR(s.kd_loss, o.distill.kd_beta_ce * want.loss_mean, 1e-5 * want.loss_mean);
  EXPECT_NEAR(s.ce_loss, ce, 1e-5 * ce);
  EXPECT_EQ(s.ce_loss, s.loss);
  // The backend's memory counts the teacher's weights while it holds them.
  EXPECT_GE(be->memory().allocated, std::int64_t(4 * teacher->params.size()));
}

TEST(MosBackend, ObjectiveGradientByFiniteDifferences) {
  // alpha * ce + beta * T^2 * KL + coeff * l_aux through the reference model's distillation hook,
  // every tensor of a MoE (PR-MoE) student sampled.
  auto rng = test::fresh_rng();
  train::BackendOptions o = student_options();
  o.dims.moe.use_residual = true;
  const model::TransformerParams table(o.dims);
  std::vector<float> f(table.flat_size());
  table.init(f.data(), 3);
  std::vector<double> p(f.begin(), f.end());
  auto teacher = make_teacher(teacher_dims(), 4);
  const model::TransformerParams tt(teacher->dims);
  const std::vector<double> tp(teacher->params.begin(), teacher->params.end());
  model::ReferenceModel<double> tm(tt, true), sm(table, true);
  const Batch b = random_batch(rng, std::size_t(o.batch) * o.seq, o.dims.vocab);
  tm.forward(tp.data(), b.tok.data(), b.lab.data(), o.batch, o.seq);
  const std::vector<double> tl = tm.logits();
  const double alpha = 0.4, beta = 1.6, temp = 1.7, coeff = o.dims.moe.loss_coeff;
  const int rows = o.batch * o.seq, Vs = o.dims.vocab_rows(), Vt = tt.dims().vocab_rows();
  auto objective = [&] {
    const double ce = sm.forward(p.data(), b.tok.data(), b.lab.data(), o.batch, o.seq);
    const double kd = model::distillation_loss<double>(sm.logits().data(), Vs, tl.data(), Vt, rows, o.dims.vocab, temp,
                                                       0, nullptr);
    return alpha * ce + beta * kd + coeff * sm.aux_loss();
  };
  sm.forward(p.data(), b.tok.data(), b.lab.data(), o.batch, o.seq);
  std::vector<double> extra(sm.logits().size(), 0.0);
  model::distillation_loss(sm.logits().data(), Vs, tl.data(), Vt, rows, o.dims.vocab, temp, beta, extra.data());
  sm.set_logits_grad_extra(&extra, alpha);
  std::vector<double> g(table.flat_size(), 0.0);
  sm.backward(p.data(), g.data());
  sm.set_logits_grad_extra(nullptr);
  for (const auto& t : table.tensors()) {
    std::vector<float> fd;
    std::vector<double> an;
    for (std::size_t i = 0; i < t.count; i += 1 + t.count / 7) {
      double& x = p[t.offset + i];
      const double x0 = x, h = 1e-6;
      x = x0 + h;
      const double lp = objective();
      x = x0 - h;
      const double lm = objective();
      x = x0;
      fd.push_back(float((lp - lm) / (2 * h)));
      an.push_back(g[t.offset + i]);
    }
    EXPECT_LE(test::rel_error(fd, an), 1e-4) << t.name;
  }
}

TEST(MosBackend, TeacherEqualToStudentAtTemperatureOneGivesZero) {
  auto rng = test::fresh_rng();
  for (bool moe : {false, true}) {
    train::BackendOptions o = student_options();
    if (!moe) o.dims.moe = {};
    o.distill.kd = true;
    // The student's own initial weights as its teacher (train and eval capacity factors equal, no
    // gate noise: the same routing), so KL(teacher || student) is 0 at step 1.
    o.teacher = make_teacher(o.dims, o.seed);
    auto be = train::make_cpu_backend(o, test::tiny_adamw_config("test:mos"));
    const Batch b = random_batch(rng, std::size_t(o.batch) * o.seq, o.dims.vocab);
    const train::StepStats s = be->step(b.tok.data(), b.lab.data(), 1, 1e-2f);
    EXPECT_TRUE(s.distilled);
    EXPECT_NEAR(s.kd_loss, 0.0, 1e-9) << (moe ? "MoE" : "dense");
    const train::StepStats s2 = be->step(b.tok.data(), b.lab.data(), 2, 1e-2f);  // the student moved: KL > 0
    EXPECT_GT(s2.kd_loss, 1e-8) << (moe ? "MoE" : "dense");
  }
}

TEST(MosBackend, StopStepFreesTheTeacherAndTheRunContinuesAsAnLmOnlyRun) {
  auto rng = test::fresh_rng();
  train::BackendOptions o = student_options();
  o.distill.mos = true;
  o.distill.kd_alpha_ce = 0.5;  // while distilling; after the stop the LM loss alone at weight 1
  o.distill.kd_temp = 2.0;
  o.distill.stop_kd_step = 2;
  std::shared_ptr<train::Teacher> teacher = make_teacher(teacher_dims(), 9);
  const std::int64_t teacher_bytes = std::int64_t(4 * teacher->params.size());
  std::weak_ptr<train::Teacher> watch = teacher;
  o.teacher = std::move(teacher);
  const train::TrainConfig cfg = test::tiny_adamw_config("test:mos");
  auto be = train::make_cpu_backend(o, cfg);
  o.teacher.reset();  // the backend's is the only pointer now
  std::vector<Batch> batches;
  for (int i = 0; i < 5; ++i) batches.push_back(random_batch(rng, std::size_t(o.batch) * o.seq, o.dims.vocab));
  for (int step = 0; step < 2; ++step) {
    const train::StepStats s = be->step(batches[step].tok.data(), batches[step].lab.data(), step + 1, 1e-2f);
    EXPECT_TRUE(s.distilled) << step;
    EXPECT_GT(s.kd_loss, 0.0) << step;
  }
  EXPECT_TRUE(be->holds_teacher());
  EXPECT_FALSE(watch.expired());
  const std::int64_t with_teacher = be->memory().allocated;
  // An LM-only run from the same state.
  train::BackendOptions plain = o;
  plain.distill = {};
  auto lm = train::make_cpu_backend(plain, cfg);
  lm->load_state(be->save_state());
  for (int step = 2; step < 5; ++step) {
    const train::StepStats a = be->step(batches[step].tok.data(), batches[step].lab.data(), step + 1, 1e-2f);
    const train::StepStats b = lm->step(batches[step].tok.data(), batches[step].lab.data(), step + 1, 1e-2f);
    EXPECT_FALSE(a.distilled) << step;
    EXPECT_EQ(a.kd_loss, 0.0) << step;
    EXPECT_FALSE(be->holds_teacher()) << step;
    EXPECT_TRUE(watch.expired()) << "the teacher's memory is released at the stop step";
    EXPECT_EQ(a.loss, b.loss) << step;  // bit for bit: the same computation
    EXPECT_EQ(a.grad_norm, b.grad_norm) << step;
  }
  EXPECT_EQ(with_teacher - be->memory().allocated, teacher_bytes);
  EXPECT_EQ(be->save_state().params, lm->save_state().params);
}

// ---- the flags and the teacher checkpoint ----

TEST(MosOptions, BadFlagsAreNamedBeforeAnyWork) {
  train::MosOptions o;
  o.given = {"--kd_temp", "--load_teacher"};
  expect_has(test::error_of([&] { train::check_mos_options(o, false); }), "--kd_temp, --load_teacher configure knowledge distillation: expected --mos");
  o = {};
  o.mos = true;
  expect_has(test::error_of([&] { train::check_mos_options(o, false); }), "--load_teacher");
  o.load_teacher = "/x";
  for (double bad : {0.0, -2.0, double(NAN)}) {
    o.kd_temp = bad;
    expect_has(test::error_of([&] { train::check_mos_options(o, false); }), "--kd_temp must be a finite number > 0");
  }
  o.kd_temp = 1;
  o.kd_beta_ce = -1;
  expect_has(test::error_of([&] { train::check_mos_options(o, false); }), "--kd_beta_ce");
  o.kd_beta_ce = 1;
  o.kd_alpha_ce = INFINITY;
  expect_has(test::error_of([&] { train::check_mos_options(o, false); }), "--kd_alpha_ce");
  o.kd_alpha_ce = 1;
  o.stop_kd_step = -1;
  expect_has(test::error_of([&] { train::check_mos_options(o, false); }), "--stop_kd_step must be >= 0");
  o.stop_kd_step = 3;
  o.num_layers_teacher = 0;
  expect_has(test::error_of([&] { train::check_mos_options(o, false); }), "--num_layers_teacher must be >= 1");
  o.num_layers_teacher.reset();
  EXPECT_EQ(test::error_of([&] { train::check_mos_options(o, false); }), "");
  o.reset_iteration = true;
  expect_has(test::error_of([&] { train::check_mos_options(o, false); }), "--reset_iteration");
  EXPECT_EQ(test::error_of([&] { train::check_mos_options(o, true); }), "");
}

// A tiny run's checkpoint root (the tiny backend: 32 hidden, 2 layers, 2 heads, vocab 64, seq 8).
fs::path saved_teacher(const std::string& tag) {
  const fs::path root = test::fresh_temp_dir("mos", tag);
  auto be = train::make_cpu_backend(test::tiny_backend(3), test::tiny_adamw_config("test:mos"));
  train::save_checkpoint(root, *be, {4, "rng", "baseline", false}, {train::CheckpointIo::Plain, true, 0});
  return root;
}

// Rewrites the step folder's config.json with `edit` and its manifest to match (a checkpoint that
// verifies but whose config.json disagrees with its model.safetensors).
void edit_config(const fs::path& root, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path folder = root / "global_step4";
  train::Manifest m = train::parse_manifest(nlohmann::json::parse(read_text_file(folder / train::kManifestFile)), "test");
  edit(m.config);
  const std::string text = m.config.dump(2);
  write_file_atomic(folder / train::kCheckpointConfigFile, text);
  for (auto& f : m.files)
    if (f.name == train::kCheckpointConfigFile) {
      f.bytes = text.size();
      f.xxh64 = xxh64(text.data(), text.size());
    }
  train::write_manifest(folder, m);
}

TEST(MosTeacher, LoadsAVerifiedCheckpointAndRefusesEveryDisagreementByName) {
  const fs::path root = saved_teacher("good");
  model::ModelDims student{16, 1, 2, 64, 8};
  train::MosOptions o;
  o.mos = true;
  o.load_teacher = root;
  const train::Teacher t = train::load_teacher(o, student, 8);
  EXPECT_EQ(t.step, 4);
  EXPECT_EQ(t.dims.hidden, 32);
  EXPECT_EQ(t.dims.layers, 2);
  auto be = train::make_cpu_backend(test::tiny_backend(3), test::tiny_adamw_config("test:mos"));
  EXPECT_EQ(t.params, be->save_state().params);  // the checkpoint's weights, every tensor in place
  expect_has(train::describe_teacher(t), "2 layers, hidden 32, 2 heads, dense");

  auto err = [&](const train::MosOptions& opt, const model::ModelDims& s, int seq) {
    return test::error_of([&] { train::load_teacher(opt, s, seq); });
  };
  train::MosOptions bad = o;
  bad.load_teacher = root / "no_such_folder";
  expect_has(err(bad, student, 8), "no such folder");
  model::ModelDims other = student;
  other.vocab = 65;
  expect_has(err(o, other, 8), "vocab_size: the teacher has 64");
  expect_has(err(o, other, 8), "the student 65");
  expect_has(err(o, student, 9), "max_seq_len: the teacher's position table has 8 rows");
  bad = o;
  bad.num_layers_teacher = 3;
  expect_has(err(bad, student, 8), "--num_layers_teacher gives 3");
  expect_has(err(bad, student, 8), "has num_layers 2");
  bad = o;
  bad.hidden_size_teacher = 64;
  expect_has(err(bad, student, 8), "--hidden_size_teacher gives 64");
  bad = o;
  bad.num_experts_teacher = {4};
  expect_has(err(bad, student, 8), "--num_experts_teacher gives 4");
  expect_has(err(bad, student, 8), "none (dense)");
  bad.num_experts_teacher = {1};
  EXPECT_EQ(err(bad, student, 8), "");
  model::ModelDims bert = student;
  bert.arch = model::Arch::Bert;
  expect_has(err(o, bert, 8), "BERT");

  // config.json of another shape than its model.safetensors (the manifest rewritten to match).
  const fs::path wide = saved_teacher("wide");
  edit_config(wide, [](nlohmann::json& c) { c["hidden_dim"] = 48; c["head_dim"] = 24; c["ffn_dim"] = 192; });
  o.load_teacher = wide;
  expect_has(err(o, student, 8), "num_params");
  edit_config(wide, [](nlohmann::json& c) {
    model::ModelDims d{48, 2, 2, 64, 8};
    c["num_params"] = model::TransformerParams(d).num_params();
  });
  const std::string e = err(o, student, 8);
  expect_has(e, "tensor '");
  expect_has(e, ", 32]");
  expect_has(e, ", 48]");
}

}  // namespace
