// @brief GPU tests of the fused cross-entropy against the fp64 reference: loss, per-row loss, in-place
// dlogits, ignored rows, padding columns, bad labels, misaligned rows (odd ld), vocabularies from
// one column to past what a cluster parks, clusters of every size from 1 to 8 CTAs, labels at the
// cluster slices' edges, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cross_entropy.cuh"
#include "kernels/cross_entropy_slice.h"
#include "tests/reference/cross_entropy_ref.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

using test::DeviceArray;


struct CeCase {
  int rows, vocab, ld;
  float ignore_frac;
  float stddev;
};

std::string case_name(const CeCase& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.vocab) + "_ld" + std::to_string(c.ld);
}

struct CeRun {
  std::vector<float> dlogits;
  std::vector<float> row_loss;
  float loss = 0;
  int status = 0;
};

// Uploads logits/labels, runs forward+backward (or forward only), downloads everything.
CeRun run_ce(const std::vector<float>& logits, const std::vector<int32_t>& labels, const CeCase& c, bool backward,
             int ignore_index = -100, float grad_scale = 1.f, bool* logits_untouched = nullptr) {
  auto hb = test::to_bf16(logits);
  DeviceArray<bf16> d_logits(hb);
  DeviceArray<int32_t> d_labels(labels);
  DeviceArray<float> d_loss(1), d_row(c.rows);
  DeviceArray<int> d_status(1);
  DeviceArray<char> scratch(kernels::cross_entropy_scratch_bytes(c.rows));
  if (backward) {
    kernels::cross_entropy_forward_backward(nullptr, d_logits.get(), d_labels.get(), c.rows, c.vocab, c.ld,
                                            d_loss.get(), d_row.get(), d_status.get(), scratch.get(), ignore_index,
                                            grad_scale);
  } else {
    kernels::cross_entropy_forward(nullptr, d_logits.get(), d_labels.get(), c.rows, c.vocab, c.ld, d_loss.get(),
                                   d_row.get(), d_status.get(), scratch.get(), ignore_index);
  }
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  CeRun r;
  auto out = d_logits.download();
  r.dlogits = test::to_float(out);
  if (logits_untouched) *logits_untouched = std::memcmp(out.data(), hb.data(), hb.size() * sizeof(bf16)) == 0;
  r.row_loss = d_row.download();
  r.loss = d_loss.download()[0];
  r.status = d_status.download()[0];
  return r;
}

struct Inputs {
  std::vector<float> logits;  // bf16-rounded; padding columns NaN (must be overwritten by 0)
  std::vector<int32_t> labels;
};

Inputs make_inputs(const CeCase& c, std::mt19937_64& rng) {
  Inputs in;
  in.logits = test::round_bf16(test::random_normal(static_cast<std::size_t>(c.rows) * c.ld, rng, 0.f, c.stddev));
  for (int i = 0; i < c.rows; ++i)
    for (int j = c.vocab; j < c.ld; ++j) in.logits[static_cast<std::size_t>(i) * c.ld + j] = NAN;
  in.labels = test::random_ints(c.rows, rng, 0, c.vocab - 1);
  auto u = test::random_uniform(c.rows, rng, 0.f, 1.f);
  for (int i = 0; i < c.rows; ++i)
    if (u[i] < c.ignore_frac) in.labels[i] = -100;
  return in;
}

void check_against_ref(const CeCase& c, const Inputs& in, const CeRun& r, const ref::CrossEntropyResult& want,
                       int ignore_index = -100, double grad_scale = 1.0) {
  const double gs = grad_scale / std::max(want.n_valid, 1);  // scale of every gradient entry
  SCOPED_TRACE(case_name(c));
  EXPECT_EQ(r.status, want.status);
  EXPECT_NEAR(r.loss, want.loss_mean, 1e-4 * std::max(1.0, std::fabs(want.loss_mean)));
  for (int i = 0; i < c.rows; ++i)
    ASSERT_NEAR(r.row_loss[i], want.row_loss[i], 1e-4 * std::max(1.0, std::fabs(want.row_loss[i]))) << "row " << i;
  EXPECT_EQ(test::count_nan(r.dlogits), 0u) << "padding or real columns left unwritten (NaN)";
  EXPECT_LE(test::rel_error(r.dlogits, want.dlogits), 1e-2);
  // Per-row check too, so one bad row cannot hide in the global norm.
  for (int i = 0; i < c.rows; ++i) {
    const std::size_t o = static_cast<std::size_t>(i) * c.ld;
    const bool ignored = in.labels[i] == ignore_index || in.labels[i] < 0 || in.labels[i] >= c.vocab;
    if (ignored) {
      for (int j = 0; j < c.ld; ++j) ASSERT_EQ(r.dlogits[o + j], 0.f) << "ignored row " << i << " col " << j;
      continue;
    }
    for (int j = c.vocab; j < c.ld; ++j) ASSERT_EQ(r.dlogits[o + j], 0.f) << "padding row " << i << " col " << j;
    std::vector<float> got(r.dlogits.begin() + o, r.dlogits.begin() + o + c.vocab);
    std::vector<float> exp(want.dlogits.begin() + o, want.dlogits.begin() + o + c.vocab);
    ASSERT_LE(test::rel_error(got, exp), 1e-2) << "row " << i;
    // The label's entry carries the -1: checked element-wise (bf16 rounding, plus the fp32 error
    // of p - 1 when the label's probability is close to 1).
    const float gl = got[in.labels[i]], el = exp[in.labels[i]];
    ASSERT_NEAR(gl, el, 8e-3 * std::fabs(el) + 1e-6 * gs) << "label entry, row " << i;
  }
}

// Two runs gave the same bits: loss, row losses, gradient.
void expect_same_bits(const CeRun& a, const CeRun& b) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, 4), 0);
  EXPECT_EQ(a.status, b.status);
  ASSERT_EQ(a.row_loss.size(), b.row_loss.size());
  ASSERT_EQ(a.dlogits.size(), b.dlogits.size());
  EXPECT_EQ(std::memcmp(a.row_loss.data(), b.row_loss.data(), 4 * a.row_loss.size()), 0);
  EXPECT_EQ(std::memcmp(a.dlogits.data(), b.dlogits.data(), 4 * a.dlogits.size()), 0);
}

class CrossEntropyGpu : public ::testing::TestWithParam<CeCase> {};

TEST_P(CrossEntropyGpu, ForwardBackwardMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  const CeCase c = GetParam();
  auto rng = test::fresh_rng();
  Inputs in = make_inputs(c, rng);
  const float grad_scale = 0.75f;
  auto want = ref::cross_entropy(in.logits, in.labels, c.rows, c.vocab, c.ld, -100, grad_scale);
  CeRun r = run_ce(in.logits, in.labels, c, true, -100, grad_scale, nullptr);
  check_against_ref(c, in, r, want, -100, grad_scale);
}

TEST_P(CrossEntropyGpu, ForwardOnlyLeavesLogitsAndMatchesLoss) {
  CUTRAIN_REQUIRE_GPU();
  const CeCase c = GetParam();
  auto rng = test::fresh_rng();
  Inputs in = make_inputs(c, rng);
  auto want = ref::cross_entropy(in.logits, in.labels, c.rows, c.vocab, c.ld);
  bool untouched = false;
  CeRun r = run_ce(in.logits, in.labels, c, false, -100, 1.f, &untouched);
  EXPECT_TRUE(untouched);
  EXPECT_EQ(r.status, want.status);
  EXPECT_NEAR(r.loss, want.loss_mean, 1e-4 * std::max(1.0, std::fabs(want.loss_mean)));
  for (int i = 0; i < c.rows; ++i)
    ASSERT_NEAR(r.row_loss[i], want.row_loss[i], 1e-4 * std::max(1.0, std::fabs(want.row_loss[i]))) << "row " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CrossEntropyGpu,
    ::testing::Values(CeCase{1, 7, 7, 0.f, 1.f}, CeCase{3, 7, 16, 0.f, 3.f}, CeCase{2048, 7, 7, 0.1f, 2.f},
                      CeCase{1, 50000, 50000, 0.f, 2.f}, CeCase{3, 50000, 50000, 0.f, 2.f},
                      CeCase{2048, 50000, 50000, 0.1f, 2.f}, CeCase{1, 50257, 50257, 0.f, 2.f},
                      CeCase{3, 50257, 50257, 0.f, 4.f}, CeCase{2048, 50257, 50257, 0.1f, 2.f},
                      CeCase{2048, 50257, 50304, 0.1f, 2.f}, CeCase{1, 262144, 262144, 0.f, 2.f},
                      CeCase{3, 262144, 262147, 0.f, 2.f}, CeCase{64, 262144, 262144, 0.1f, 2.f},
                      CeCase{5, 100003, 100003, 0.f, 8.f}, CeCase{17, 2, 9, 0.f, 1.f},
                      // Smaller than one 16-byte vector, exactly one, one and a scalar, with odd
                      // strides (each row starts at another alignment: head and tail both used).
                      CeCase{9, 3, 5, 0.f, 2.f}, CeCase{8, 8, 8, 0.f, 2.f}, CeCase{11, 9, 11, 0.2f, 2.f},
                      CeCase{6, 15, 17, 0.f, 4.f},
                      // One CTA per row at the largest single-CTA vocabulary, then a cluster of 2
                      // one column past it; the GPT-2 vocabulary (4 CTAs) with an odd stride.
                      CeCase{5, 16384, 16385, 0.f, 2.f}, CeCase{33, 16385, 16387, 0.1f, 2.f},
                      CeCase{9, 50304, 50305, 0.1f, 2.f},
                      // Clusters of 3 and of 8 (the cap; up to 150 KB slices, still parked whole),
                      // and a row longer than 8 CTAs can park: each slice's rest is read in every
                      // pass.
                      CeCase{7, 40961, 40963, 0.3f, 2.f}, CeCase{7, 131071, 131072, 0.3f, 2.f},
                      // Clusters of 5, 6 and 7 CTAs.
                      CeCase{5, 65537, 65539, 0.2f, 2.f}, CeCase{5, 81921, 81922, 0.2f, 2.f},
                      CeCase{5, 98305, 98305, 0.2f, 2.f},
                      CeCase{2, 600001, 600003, 0.f, 2.f},
                      CeCase{2, 1000003, 1000005, 0.f, 2.f}),
    [](const ::testing::TestParamInfo<CeCase>& i) { return case_name(i.param); });

// One column: the loss is 0 and the gradient p - 1 = 0, up to the fp32 error of exp2 (the
// reference's zeros admit no relative error, so this shape has its own bound).
TEST(CrossEntropyGpuLabels, SingleColumnGivesZeroLossAndGradient) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (int ld : {1, 2, 3, 8}) {
    const CeCase c{13, 1, ld, 0.f, 4.f};
    Inputs in = make_inputs(c, rng);
    CeRun r = run_ce(in.logits, in.labels, c, true, -100, 1.f, nullptr);
    SCOPED_TRACE(case_name(c));
    EXPECT_EQ(r.status, 0);
    EXPECT_NEAR(r.loss, 0.f, 1e-5f);
    for (int i = 0; i < c.rows; ++i) {
      EXPECT_NEAR(r.row_loss[i], 0.f, 1e-5f) << "row " << i;
      for (int j = 0; j < c.ld; ++j) ASSERT_NEAR(r.dlogits[static_cast<std::size_t>(i) * ld + j], 0.f, 1e-6f);
    }
  }
}

TEST(CrossEntropyGpuLabels, OutOfRangeLabelsReportedAndIgnored) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const CeCase c{6, 50257, 50257, 0.f, 2.f};
  Inputs in = make_inputs(c, rng);
  in.labels[1] = -100;
  in.labels[2] = c.vocab;  // first bad row: status 3
  in.labels[4] = -5;
  auto want = ref::cross_entropy(in.logits, in.labels, c.rows, c.vocab, c.ld);
  ASSERT_EQ(want.status, 3);
  CeRun r = run_ce(in.logits, in.labels, c, true, -100, 1.f, nullptr);
  check_against_ref(c, in, r, want);
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.row_loss[2], 0.f);
  EXPECT_EQ(r.row_loss[4], 0.f);
}

// Labels at the edges of the row and of the cluster slices (each slice's first and last
// element, rank 0 owning the label's logit wherever it lies), rows at every start alignment (odd
// stride; cudaMalloc's base is 256-byte aligned, so row i starts at byte 2 * i * ld). The slice
// bounds are the kernel's own (ce::row_slice over cross_entropy_ctas_per_row CTAs).
TEST(CrossEntropyGpuLabels, LabelsAtRowAndSliceEdges) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const CeCase c : {CeCase{24, 262144, 262145, 0.f, 3.f}, CeCase{16, 50304, 50305, 0.f, 3.f},
                         CeCase{16, 16385, 16387, 0.f, 3.f}}) {
    Inputs in = make_inputs(c, rng);
    const int split = kernels::cross_entropy_ctas_per_row(c.vocab);
    for (int i = 0; i < c.rows; ++i) {
      const std::uintptr_t row_addr = 2u * static_cast<std::uintptr_t>(i) * static_cast<std::uintptr_t>(c.ld);
      const int k = 1 + (i / 6) % std::max(1, split - 1);  // which slice boundary (rows cycle)
      const auto cut = kernels::ce::row_slice(row_addr, c.vocab, split, k);
      const int bound = cut.head + cut.v_begin * 8;  // first element of CTA k's slice
      const int picks[6] = {0, cut.head, bound - 1, bound, cut.tail_start - 1, c.vocab - 1};
      in.labels[i] = std::clamp(picks[i % 6], 0, c.vocab - 1);
    }
    auto want = ref::cross_entropy(in.logits, in.labels, c.rows, c.vocab, c.ld, -100, 2.0);
    CeRun r = run_ce(in.logits, in.labels, c, true, -100, 2.f, nullptr);
    check_against_ref(c, in, r, want, -100, 2.0);
  }
}

TEST(CrossEntropyGpuLabels, CustomIgnoreIndexAndAllIgnored) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const CeCase c{9, 1000, 1000, 0.f, 2.f};
  Inputs in = make_inputs(c, rng);
  in.labels[0] = 0;  // ignore_index 0: this row is ignored, -100 would be an out-of-range label
  auto want = ref::cross_entropy(in.logits, in.labels, c.rows, c.vocab, c.ld, 0, 1.0);
  CeRun r = run_ce(in.logits, in.labels, c, true, 0, 1.f, nullptr);
  check_against_ref(c, in, r, want, 0);
  for (int j = 0; j < c.ld; ++j) ASSERT_EQ(r.dlogits[j], 0.f);

  std::vector<int32_t> all_ignored(c.rows, -100);
  CeRun z = run_ce(in.logits, all_ignored, c, true, -100, 1.f, nullptr);
  EXPECT_EQ(z.loss, 0.f);
  EXPECT_EQ(z.status, 0);
  for (float g : z.dlogits) ASSERT_EQ(g, 0.f);
  CeRun zf = run_ce(in.logits, all_ignored, c, false, -100, 1.f, nullptr);
  EXPECT_EQ(zf.loss, 0.f);
}

// The same bits every run.
TEST(CrossEntropyGpuDeterminism, SameBitsEveryRun) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const CeCase c{2048, 50304, 50304, 0.05f, 2.f};
  Inputs in = make_inputs(c, rng);
  const CeRun a = run_ce(in.logits, in.labels, c, true, -100, 1.f, nullptr);
  const CeRun b = run_ce(in.logits, in.labels, c, true, -100, 1.f, nullptr);
  expect_same_bits(a, b);
}

// Back-to-back calls on one stream reuse the scratch (the done counter must be re-armed by each
// call's count kernel) and several thousand rows make many blocks race for "last"; the calls give
// the same bits.
TEST(CrossEntropyGpuDeterminism, RepeatedCallsOnOneStreamReuseScratch) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const CeCase c{4099, 1031, 1031, 0.1f, 2.f};
  Inputs in = make_inputs(c, rng);
  auto want = ref::cross_entropy(in.logits, in.labels, c.rows, c.vocab, c.ld);
  auto hb = test::to_bf16(in.logits);
  DeviceArray<bf16> d_logits(hb);
  DeviceArray<int32_t> d_labels(in.labels);
  constexpr int kCalls = 6;
  DeviceArray<float> d_loss(kCalls);
  DeviceArray<char> scratch(kernels::cross_entropy_scratch_bytes(c.rows));
  for (int k = 0; k < kCalls; ++k)
    kernels::cross_entropy_forward(nullptr, d_logits.get(), d_labels.get(), c.rows, c.vocab, c.ld, d_loss.get() + k,
                                   nullptr, nullptr, scratch.get());
  auto loss = d_loss.download();
  for (int k = 0; k < kCalls; ++k) {
    EXPECT_NEAR(loss[k], want.loss_mean, 1e-4 * std::max(1.0, std::fabs(want.loss_mean))) << "call " << k;
    EXPECT_EQ(std::memcmp(&loss[k], &loss[0], 4), 0) << "call " << k;
  }
}

TEST(CrossEntropyGpuArgs, BadShapesThrowBeforeLaunch) {
  CUTRAIN_REQUIRE_GPU();
  DeviceArray<bf16> x(64);
  DeviceArray<int32_t> y(4);
  DeviceArray<float> loss(1);
  DeviceArray<char> scratch(kernels::cross_entropy_scratch_bytes(4));
  EXPECT_THROW(kernels::cross_entropy_forward_backward(nullptr, x.get(), y.get(), 4, 16, 8, loss.get(), nullptr,
                                                       nullptr, scratch.get()),
               Error);  // ld < vocab
  EXPECT_THROW(kernels::cross_entropy_forward_backward(nullptr, x.get(), y.get(), 0, 16, 16, loss.get(), nullptr,
                                                       nullptr, scratch.get()),
               Error);
  EXPECT_THROW(kernels::cross_entropy_forward_backward(nullptr, x.get(), y.get(), 4, 16, 16, loss.get(), nullptr,
                                                       nullptr, nullptr),
               Error);
}

// The fp16 instance (fp16 training): forward + backward in place on fp16 logits, with a host
// grad_scale and fp16's device loss scale (device_grad_scale, read on the device so a captured graph
// follows it: dlogits carry grad_scale x loss scale), over rows of one CTA and rows split over a
// cluster of CTAs, odd ld; the forward alone leaves the logits. Loss within 1e-4 (fp32
// math); dlogits within 3e-3 (fp16 keeps 11 significant bits; the label entry 2e-3 element-wise).
// At loss scale 1 over 2048 rows of GPT-2's vocabulary the non-label gradients, about
// grad_scale x p / rows ~ 5e-9, sit in fp16's subnormal range (below 6.1e-5; 2^-24 apart), which
// holds few or no significant bits: the bound there is 1e-2. Loss scaling exists to lift them out.
TEST(CrossEntropyGpuFp16, ForwardBackwardWithDeviceLossScaleMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const CeCase& c : {CeCase{3, 7, 16, 0.f, 3.f}, CeCase{2048, 7, 7, 0.1f, 2.f}, CeCase{64, 30522, 30522, 0.1f, 2.f},
                          CeCase{2048, 50257, 50304, 0.1f, 2.f}, CeCase{3, 262144, 262147, 0.f, 2.f},
                          CeCase{2, 600001, 600003, 0.f, 2.f}}) {
    for (float loss_scale : {1.f, 4096.f}) {
      SCOPED_TRACE(case_name(c) + " loss scale " + std::to_string(loss_scale) + " fp16");
      Inputs in = make_inputs(c, rng);
      in.logits = test::round_f16(in.logits);
      const float grad_scale = 0.5f;
      const auto h = test::to_f16(in.logits);
      DeviceArray<f16> d_logits(h);
      DeviceArray<int32_t> d_labels(in.labels);
      DeviceArray<float> d_loss(1), d_row(c.rows), d_scale(std::vector<float>{loss_scale});
      DeviceArray<int> d_status(1);
      DeviceArray<char> scratch(kernels::cross_entropy_scratch_bytes(c.rows));
      kernels::cross_entropy_forward(nullptr, d_logits.get(), d_labels.get(), c.rows, c.vocab, c.ld, d_loss.get(),
                                     d_row.get(), d_status.get(), scratch.get());
      const auto want = ref::cross_entropy(in.logits, in.labels, c.rows, c.vocab, c.ld, -100,
                                           static_cast<double>(grad_scale) * loss_scale);
      EXPECT_NEAR(d_loss.download()[0], want.loss_mean, 1e-4 * std::max(1.0, std::fabs(want.loss_mean)));
      EXPECT_TRUE(test::bits16(d_logits.download()) == test::bits16(h)) << "the forward must leave the logits";
      kernels::cross_entropy_forward_backward(nullptr, d_logits.get(), d_labels.get(), c.rows, c.vocab, c.ld,
                                              d_loss.get(), d_row.get(), d_status.get(), scratch.get(), -100,
                                              grad_scale, d_scale.get());
      const auto got = test::download_float(d_logits);
      EXPECT_EQ(d_status.download()[0], want.status);
      EXPECT_NEAR(d_loss.download()[0], want.loss_mean, 1e-4 * std::max(1.0, std::fabs(want.loss_mean)));
      ASSERT_EQ(test::count_nan(got), 0u) << "padding or real columns left unwritten (NaN)";
      EXPECT_LE(test::rel_error(got, want.dlogits), loss_scale < 16.f ? 1e-2 : 3e-3);
      for (int i = 0; i < c.rows; ++i) {
        if (in.labels[i] < 0) continue;
        const std::size_t o = static_cast<std::size_t>(i) * c.ld + in.labels[i];
        ASSERT_NEAR(got[o], want.dlogits[o], 2e-3 * std::fabs(want.dlogits[o]) + 1e-7 * loss_scale)
            << "label entry, row " << i;
      }
    }
  }
}

}  // namespace
}  // namespace cutrain
