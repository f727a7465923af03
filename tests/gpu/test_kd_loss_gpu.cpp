// @brief GPU tests of knowledge distillation's fused KL loss (kernels/kd_loss.cuh) against the fp64
// reference: per-row KL, the mean, the gradient written (separate, in place over the student or the
// teacher), accumulated, kd_add_grad, padding columns,
// odd leading dimensions, teacher == student at T = 1 (KL 0), determinism, bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/kd_loss.cuh"
#include "tests/reference/kd_loss_ref.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

using test::DeviceArray;

struct KdCase {
  int rows, vocab, ld_s, ld_t;
  float temperature;
  float near;  // teacher = student + near * noise (0: an independent teacher)
};

std::string case_name(const KdCase& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.vocab) + "_lds" + std::to_string(c.ld_s) + "_ldt" +
         std::to_string(c.ld_t) + "_T" + std::to_string(c.temperature);
}

struct KdInputs {
  std::vector<float> student, teacher;  // bf16-rounded, padding NaN (must not be read)
};

KdInputs make_inputs(const KdCase& c, std::mt19937_64& rng) {
  KdInputs in;
  in.student = test::random_normal(std::size_t(c.rows) * c.ld_s, rng, 0.f, 2.f);
  in.teacher.assign(std::size_t(c.rows) * c.ld_t, 0.f);
  const auto noise = test::random_normal(std::size_t(c.rows) * c.ld_t, rng, 0.f, c.near > 0 ? c.near : 3.f);
  for (int m = 0; m < c.rows; ++m)
    for (int v = 0; v < c.ld_t; ++v) {
      const std::size_t i = std::size_t(m) * c.ld_t + v;
      in.teacher[i] = (c.near > 0 && v < c.vocab ? in.student[std::size_t(m) * c.ld_s + v] : 0.f) + noise[i];
    }
  in.student = test::round_bf16(in.student);
  in.teacher = test::round_bf16(in.teacher);
  for (int m = 0; m < c.rows; ++m) {
    for (int v = c.vocab; v < c.ld_s; ++v) in.student[std::size_t(m) * c.ld_s + v] = NAN;
    for (int v = c.vocab; v < c.ld_t; ++v) in.teacher[std::size_t(m) * c.ld_t + v] = NAN;
  }
  return in;
}

struct KdRun {
  std::vector<float> row_kl, grad;
  float loss = 0;
};

// grad into a separate buffer (ld_d = ld_s + 3, poisoned) or in place over the student.
KdRun run_kd(const KdCase& c, const KdInputs& in, float grad_scale, bool in_place) {
  DeviceArray<bf16> s(test::to_bf16(in.student)), t(test::to_bf16(in.teacher));
  const int ld_d = in_place ? c.ld_s : c.ld_s + 3;
  DeviceArray<bf16> d(in_place ? 0 : std::size_t(c.rows) * ld_d);
  DeviceArray<float> kl(c.rows), loss(1);
  kernels::kd_loss_forward_backward(nullptr, s.get(), c.ld_s, t.get(), c.ld_t, c.rows, c.vocab, c.temperature,
                                    grad_scale, kl.get(), loss.get(), in_place ? s.get() : d.get(), ld_d, false,
                                    nullptr);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  KdRun r;
  r.row_kl = kl.download();
  r.loss = loss.download()[0];
  r.grad = test::download_float(in_place ? s : d);
  return r;
}

// The reference's KL: |got - want| <= 2e-3 |want| + 1e-4 per row (fp32 sums over the vocabulary).
void expect_kl_near(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t m = 0; m < got.size(); ++m)
    ASSERT_LE(std::abs(double(got[m]) - want[m]), 2e-3 * std::abs(want[m]) + 1e-4) << what << " row " << m;
}

class KdLossGpu : public ::testing::TestWithParam<KdCase> {};

TEST_P(KdLossGpu, MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  const KdCase c = GetParam();
  auto rng = test::fresh_rng();
  const KdInputs in = make_inputs(c, rng);
  const float grad_scale = 0.75f * float(c.rows);  // the gradient's entries stay O(1) at any row count
  const ref::KdLossResult want = ref::kd_loss(in.student, c.ld_s, in.teacher, c.ld_t, c.rows, c.vocab, c.temperature,
                                              grad_scale);
  for (bool in_place : {false, true}) {
    const std::string what = case_name(c) + (in_place ? " in place" : " separate");
    const KdRun r = run_kd(c, in, grad_scale, in_place);
    expect_kl_near(r.row_kl, want.row_kl, what);
    EXPECT_LE(std::abs(double(r.loss) - want.loss_mean), 2e-3 * std::abs(want.loss_mean) + 1e-4 * c.temperature * c.temperature) << what;
    const int ld_d = in_place ? c.ld_s : c.ld_s + 3;
    std::vector<float> got;
    std::vector<double> ref;
    for (int m = 0; m < c.rows; ++m) {
      for (int v = 0; v < c.vocab; ++v) {
        got.push_back(r.grad[std::size_t(m) * ld_d + v]);
        ref.push_back(want.dstudent[std::size_t(m) * c.ld_s + v]);
      }
      for (int v = c.vocab; v < ld_d; ++v) {
        const float g = r.grad[std::size_t(m) * ld_d + v];
        ASSERT_EQ(g, 0.f) << what << ": padding column " << v << " of row " << m;
      }
    }
    EXPECT_EQ(test::count_nan(got), 0u) << what;
    EXPECT_LE(test::rel_error(got, ref), 1e-2) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, KdLossGpu,
                         ::testing::Values(KdCase{1, 1, 1, 1, 1.f, 0.f}, KdCase{3, 7, 9, 8, 2.f, 0.f},
                                           KdCase{17, 1000, 1003, 1000, 1.f, 0.f}, KdCase{33, 513, 513, 517, 4.f, 0.5f},
                                           KdCase{64, 4097, 4097, 4100, 0.5f, 0.f},
                                           KdCase{5, 50257, 50304, 50257, 2.f, 0.3f},
                                           KdCase{7, 50257, 50257, 50304, 1.f, 0.f}),
                         [](const auto& info) {
                           std::string n = case_name(info.param);
                           for (char& ch : n)
                             if (ch == '.') ch = 'p';
                           return n;
                         });

TEST(KdLossGpuTest, AccumulatesIntoAnExistingGradient) {
  CUTRAIN_REQUIRE_GPU();
  const KdCase c{9, 777, 779, 777, 2.f, 0.f};
  auto rng = test::fresh_rng();
  const KdInputs in = make_inputs(c, rng);
  const std::vector<float> prev = test::round_bf16(test::random_normal(std::size_t(c.rows) * c.ld_s, rng, 0.f, 0.1f));
  const float grad_scale = float(c.rows);
  const ref::KdLossResult want = ref::kd_loss(in.student, c.ld_s, in.teacher, c.ld_t, c.rows, c.vocab, c.temperature,
                                              grad_scale);
  DeviceArray<bf16> s(test::to_bf16(in.student)), t(test::to_bf16(in.teacher)), d(test::to_bf16(prev));
  kernels::kd_loss_forward_backward(nullptr, s.get(), c.ld_s, t.get(), c.ld_t, c.rows, c.vocab, c.temperature,
                                    grad_scale, nullptr, nullptr, d.get(), c.ld_s, true, nullptr);
  const std::vector<float> got = test::download_float(d);
  std::vector<double> ref(got.size());
  for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = double(prev[i]) + want.dstudent[i];
  EXPECT_LE(test::rel_error(got, ref), 1e-2);
  for (int m = 0; m < c.rows; ++m)
    for (int v = c.vocab; v < c.ld_s; ++v)  // padding left as it was
      ASSERT_EQ(got[std::size_t(m) * c.ld_s + v], prev[std::size_t(m) * c.ld_s + v]);
}

// The GPU model's order: the gradient written over the teacher's logits, then added into the
// buffer the cross-entropy left its gradient in (kd_add_grad).
TEST(KdLossGpuTest, GradientOverTheTeacherThenAddedIntoAnotherBuffer) {
  CUTRAIN_REQUIRE_GPU();
  const KdCase c{11, 3001, 3003, 3005, 2.f, 0.f};
  auto rng = test::fresh_rng();
  const KdInputs in = make_inputs(c, rng);
  const float grad_scale = 0.5f * float(c.rows);
  const ref::KdLossResult want = ref::kd_loss(in.student, c.ld_s, in.teacher, c.ld_t, c.rows, c.vocab, c.temperature,
                                              grad_scale);
  std::vector<float> prev = test::round_bf16(test::random_normal(std::size_t(c.rows) * c.ld_s, rng, 0.f, 0.1f));
  for (int m = 0; m < c.rows; ++m)
    for (int v = c.vocab; v < c.ld_s; ++v) prev[std::size_t(m) * c.ld_s + v] = 7.f;  // padding: left alone
  DeviceArray<bf16> s(test::to_bf16(in.student)), t(test::to_bf16(in.teacher)), d(test::to_bf16(prev));
  DeviceArray<float> loss(1);
  DeviceArray<char> scratch(kernels::kd_loss_scratch_bytes(c.rows));
  kernels::kd_loss_forward_backward(nullptr, s.get(), c.ld_s, t.get(), c.ld_t, c.rows, c.vocab, c.temperature,
                                    grad_scale, nullptr, loss.get(), t.get(), c.ld_t, false, scratch.get());
  kernels::kd_add_grad(nullptr, d.get(), c.ld_s, t.get(), c.ld_t, c.rows, c.vocab);
  EXPECT_LE(std::abs(double(loss.download()[0]) - want.loss_mean), 2e-3 * want.loss_mean + 1e-4);
  const std::vector<float> got_t = test::download_float(t), got = test::download_float(d);
  std::vector<float> kd, sum;
  std::vector<double> ref_kd, ref_sum;
  for (int m = 0; m < c.rows; ++m) {
    for (int v = 0; v < c.vocab; ++v) {
      const std::size_t i = std::size_t(m) * c.ld_s + v;
      kd.push_back(got_t[std::size_t(m) * c.ld_t + v]);
      ref_kd.push_back(want.dstudent[i]);
      sum.push_back(got[i]);
      ref_sum.push_back(double(prev[i]) + want.dstudent[i]);
    }
    for (int v = c.vocab; v < c.ld_t; ++v) ASSERT_EQ(got_t[std::size_t(m) * c.ld_t + v], 0.f);
    for (int v = c.vocab; v < c.ld_s; ++v) ASSERT_EQ(got[std::size_t(m) * c.ld_s + v], 7.f);
  }
  EXPECT_LE(test::rel_error(kd, ref_kd), 1e-2);
  EXPECT_LE(test::rel_error(sum, ref_sum), 1e-2);
  EXPECT_NE(test::error_of([&] {
              kernels::kd_loss_forward_backward(nullptr, s.get(), c.ld_s, t.get(), c.ld_t, c.rows, c.vocab, 1.f, 1.f,
                                                nullptr, nullptr, t.get(), c.ld_s, false, nullptr);
            }).find("leading dimension"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { kernels::kd_add_grad(nullptr, d.get(), c.ld_s, d.get(), c.ld_s, c.rows, c.vocab); })
                .find("alias"),
            std::string::npos);
}

TEST(KdLossGpuTest, TeacherEqualToStudentAtTemperatureOneGivesZero) {
  CUTRAIN_REQUIRE_GPU();
  const int rows = 12, vocab = 5003;
  auto rng = test::fresh_rng();
  const std::vector<float> x = test::round_bf16(test::random_normal(std::size_t(rows) * vocab, rng, 0.f, 3.f));
  DeviceArray<bf16> s(test::to_bf16(x)), t(test::to_bf16(x)), d(std::size_t(rows) * vocab);
  DeviceArray<float> kl(rows), loss(1);
  kernels::kd_loss_forward_backward(nullptr, s.get(), vocab, t.get(), vocab, rows, vocab, 1.f, float(rows), kl.get(),
                                    loss.get(), d.get(), vocab, false, nullptr);
  for (float k : kl.download()) EXPECT_LE(std::abs(k), 1e-5f);
  EXPECT_LE(std::abs(loss.download()[0]), 1e-5f);
  for (float g : test::download_float(d)) ASSERT_LE(std::abs(g), 1e-6f);
}

TEST(KdLossGpuTest, DeterministicAndMeanFromScratch) {
  CUTRAIN_REQUIRE_GPU();
  const KdCase c{300, 2049, 2049, 2049, 1.5f, 0.f};
  auto rng = test::fresh_rng();
  const KdInputs in = make_inputs(c, rng);
  DeviceArray<bf16> s(test::to_bf16(in.student)), t(test::to_bf16(in.teacher));
  DeviceArray<char> scratch(kernels::kd_loss_scratch_bytes(c.rows));
  DeviceArray<float> loss(1);
  float first = 0;
  for (int i = 0; i < 3; ++i) {
    loss.poison();
    kernels::kd_loss_forward_backward(nullptr, s.get(), c.ld_s, t.get(), c.ld_t, c.rows, c.vocab, c.temperature, 1.f,
                                      nullptr, loss.get(), nullptr, 0, false, scratch.get());
    const float l = loss.download()[0];
    if (i == 0) first = l;
    ASSERT_EQ(std::memcmp(&l, &first, sizeof l), 0) << "run " << i;
  }
  const ref::KdLossResult want =
      ref::kd_loss(in.student, c.ld_s, in.teacher, c.ld_t, c.rows, c.vocab, c.temperature);
  EXPECT_LE(std::abs(double(first) - want.loss_mean), 2e-3 * want.loss_mean + 1e-4);
}

TEST(KdLossGpuTest, RefusesBadArguments) {
  CUTRAIN_REQUIRE_GPU();
  DeviceArray<bf16> s(64), t(64);
  DeviceArray<float> loss(1);
  auto call = [&](float temp, int vocab, int ld_t, bool accumulate, bf16* d) {
    return test::error_of([&] {
      kernels::kd_loss_forward_backward(nullptr, s.get(), 8, t.get(), ld_t, 8, vocab, temp, 1.f, nullptr, loss.get(), d,
                                        8, accumulate, nullptr);
    });
  };
  EXPECT_NE(call(0.f, 8, 8, false, nullptr).find("temperature"), std::string::npos);
  EXPECT_NE(call(-1.f, 8, 8, false, nullptr).find("temperature"), std::string::npos);
  EXPECT_NE(call(NAN, 8, 8, false, nullptr).find("temperature"), std::string::npos);
  EXPECT_NE(call(1.f, 8, 4, false, nullptr).find("leading dimensions"), std::string::npos);
  EXPECT_NE(call(1.f, 8, 8, true, s.get()).find("accumulate"), std::string::npos);
  EXPECT_NE(call(1.f, 8, 8, false, nullptr).find("scratch"), std::string::npos);
}

}  // namespace
}  // namespace cutrain
