// @brief GPU tests of the vocabulary-parallel cross-entropy (kernels/vocab_parallel_loss.cuh): the
// logits of a padded vocabulary cut into T column slices, each slice's three passes run as a
// tensor-parallel rank would, the group's all-reduces (max, then sums) done on the host between
// them; every rank's loss, row losses and gradient slices (put side by side) must be the fp64
// reference's over the whole row (tests/reference/cross_entropy_ref.h). Ignored and bad labels,
// labels in every slice, slices of padding only, grad scales on the host and on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/vocab_parallel_loss.cuh"
#include "runtime/check.h"
#include "tests/reference/cross_entropy_ref.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

using test::DeviceArray;

struct VpCase {
  int rows, vocab, vocab_rows, tp;
};

struct RankRun {
  std::vector<float> dlogits, row_loss;  // [rows, slice], [rows]
  float loss = 0;
  int status = -1;
};

// Runs the T ranks' passes; `grad` false: evaluation (the logits must stay).
std::vector<RankRun> run_ranks(const VpCase& c, const std::vector<float>& logits, const std::vector<int32_t>& labels,
                               bool grad, float grad_scale, const float* host_device_scale) {
  const int w = c.vocab_rows / c.tp;
  DeviceArray<int32_t> d_labels(labels);
  std::vector<DeviceArray<bf16>> slices;
  for (int t = 0; t < c.tp; ++t) {
    std::vector<float> part(std::size_t(c.rows) * w);
    for (int r = 0; r < c.rows; ++r)
      std::copy_n(logits.begin() + std::size_t(r) * c.vocab_rows + std::size_t(t) * w, w,
                  part.begin() + std::size_t(r) * w);
    slices.emplace_back(test::to_bf16(part));
  }
  // Pass 1 on every rank, the all-reduce (max) on the host.
  std::vector<float> group_max(c.rows, -INFINITY);
  for (int t = 0; t < c.tp; ++t) {
    DeviceArray<float> m(c.rows);
    m.poison();
    kernels::vocab_parallel_ce_max(nullptr, slices[t].get(), c.rows, w, t * w, c.vocab, m.get());
    auto h = m.download();
    for (int r = 0; r < c.rows; ++r) group_max[r] = std::max(group_max[r], h[r]);
  }
  // Pass 2, the all-reduce (sum) in rank order.
  DeviceArray<float> d_max(group_max);
  std::vector<float> group_stats(2 * std::size_t(c.rows), 0.f);
  for (int t = 0; t < c.tp; ++t) {
    DeviceArray<float> st(2 * std::size_t(c.rows));
    st.poison();
    kernels::vocab_parallel_ce_sums(nullptr, slices[t].get(), d_labels.get(), c.rows, w, t * w, c.vocab, d_max.get(),
                                    st.get());
    auto h = st.download();
    for (std::size_t i = 0; i < h.size(); ++i) group_stats[i] += h[i];
  }
  DeviceArray<float> d_stats(group_stats);
  std::vector<RankRun> out(std::size_t(c.tp));
  for (int t = 0; t < c.tp; ++t) {
    DeviceArray<float> loss(1), row_loss(c.rows);
    DeviceArray<int> status(1);
    DeviceArray<char> scratch(kernels::vocab_parallel_ce_scratch_bytes(c.rows));
    loss.poison();
    row_loss.poison();
    status.poison();
    std::vector<float> dev_scale_host{host_device_scale ? *host_device_scale : 1.f};
    DeviceArray<float> dev_scale(dev_scale_host);
    const auto before = slices[t].download();
    kernels::vocab_parallel_ce_finish(nullptr, slices[t].get(), d_labels.get(), c.rows, w, t * w, c.vocab, d_max.get(),
                                      d_stats.get(), loss.get(), row_loss.get(), status.get(), scratch.get(), grad,
                                      -100, grad_scale, host_device_scale ? dev_scale.get() : nullptr);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto after = slices[t].download();
    if (!grad) EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(bf16)), 0) << "rank " << t;
    out[t].dlogits = test::to_float(after);
    out[t].row_loss = row_loss.download();
    out[t].loss = loss.download()[0];
    out[t].status = status.download()[0];
  }
  return out;
}

void check_case(const VpCase& c, bool grad, float host_scale, const float* device_scale) {
  SCOPED_TRACE("rows " + std::to_string(c.rows) + " vocab " + std::to_string(c.vocab) + "/" +
               std::to_string(c.vocab_rows) + " tp " + std::to_string(c.tp));
  auto rng = test::fresh_rng();
  std::vector<float> logits = test::round_bf16(test::random_normal(std::size_t(c.rows) * c.vocab_rows, rng, 0.f, 2.f));
  std::vector<int32_t> labels = test::random_ints(c.rows, rng, 0, c.vocab - 1);
  labels[0] = c.vocab - 1;  // the last real column (in the last slice that holds real columns)
  if (c.rows > 1) labels[1] = 0;
  if (c.rows > 2) labels[2] = -100;
  if (c.rows > 3) labels[3] = c.vocab + (c.vocab_rows > c.vocab ? 0 : 5);  // bad: a padded row or past the table
  const int w = c.vocab_rows / c.tp;
  if (c.rows > 4) labels[4] = std::min(w, c.vocab - 1);  // the second slice's first column
  const double scale = double(host_scale) * (device_scale ? *device_scale : 1.f);
  auto want = ref::cross_entropy(logits, labels, c.rows, c.vocab, c.vocab_rows, -100, scale);
  auto ranks = run_ranks(c, logits, labels, grad, host_scale, device_scale);
  std::vector<float> whole(std::size_t(c.rows) * c.vocab_rows);
  for (int t = 0; t < c.tp; ++t) {
    const RankRun& r = ranks[std::size_t(t)];
    EXPECT_EQ(r.status, want.status) << "rank " << t;
    EXPECT_NEAR(r.loss, want.loss_mean, 1e-4 * std::max(1.0, std::fabs(want.loss_mean))) << "rank " << t;
    EXPECT_EQ(r.loss, ranks[0].loss) << "rank " << t << ": every rank computes the same loss bits";
    for (int i = 0; i < c.rows; ++i)
      ASSERT_NEAR(r.row_loss[i], want.row_loss[i], 1e-4 * std::max(1.0, std::fabs(want.row_loss[i])))
          << "rank " << t << " row " << i;
    for (int i = 0; i < c.rows; ++i)
      std::copy_n(r.dlogits.begin() + std::size_t(i) * w, w,
                  whole.begin() + std::size_t(i) * c.vocab_rows + std::size_t(t) * w);
  }
  if (!grad) return;
  EXPECT_EQ(test::count_nan(whole), 0u);
  EXPECT_LE(test::rel_error(whole, want.dlogits), 1e-2);
  for (int i = 0; i < c.rows; ++i) {
    const std::size_t o = std::size_t(i) * c.vocab_rows;
    const bool ignored = labels[i] < 0 || labels[i] >= c.vocab;
    for (int j = ignored ? 0 : c.vocab; j < c.vocab_rows; ++j)
      ASSERT_EQ(whole[o + j], 0.f) << (ignored ? "ignored" : "padding") << " row " << i << " col " << j;
    if (ignored) continue;
    std::vector<float> got(whole.begin() + o, whole.begin() + o + c.vocab);
    std::vector<float> exp(want.dlogits.begin() + o, want.dlogits.begin() + o + c.vocab);
    ASSERT_LE(test::rel_error(got, exp), 1e-2) << "row " << i;
    ASSERT_NEAR(got[labels[i]], exp[labels[i]], 8e-3 * std::fabs(exp[labels[i]]) + 1e-7) << "label entry, row " << i;
  }
}

class VocabParallelLossGpu : public ::testing::TestWithParam<VpCase> {};

TEST_P(VocabParallelLossGpu, SlicesGiveTheWholeRowsLossAndGradient) {
  CUTRAIN_REQUIRE_GPU();
  check_case(GetParam(), true, 0.75f, nullptr);
}

TEST_P(VocabParallelLossGpu, DeviceGradScaleMultiplies) {
  CUTRAIN_REQUIRE_GPU();
  const float dev = 256.f;
  check_case(GetParam(), true, 0.5f, &dev);
}

TEST_P(VocabParallelLossGpu, EvaluationLeavesTheLogits) {
  CUTRAIN_REQUIRE_GPU();
  check_case(GetParam(), false, 1.f, nullptr);
}

// Odd rows; vocabularies padded to divide (the last slice partly or wholly padding); degrees 1-4.
INSTANTIATE_TEST_SUITE_P(Shapes, VocabParallelLossGpu,
                         ::testing::Values(VpCase{7, 50, 64, 2}, VpCase{33, 250, 256, 4}, VpCase{5, 97, 128, 4},
                                           VpCase{64, 1000, 1000, 1}, VpCase{129, 4000, 4096, 2},
                                           VpCase{3, 20, 32, 4} /* the last slice holds padding only */));

TEST(VocabParallelLossGpu, RefusesBadShapes) {
  CUTRAIN_REQUIRE_GPU();
  DeviceArray<bf16> logits(8);
  DeviceArray<float> m(2);
  EXPECT_NE(test::error_of([&] { kernels::vocab_parallel_ce_max(nullptr, logits.get(), 0, 4, 0, 8, m.get()); })
                .find("rows > 0"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { kernels::vocab_parallel_ce_max(nullptr, logits.get(), 2, 4, -1, 8, m.get()); })
                .find("slice start"),
            std::string::npos);
}

}  // namespace
}  // namespace cutrain
