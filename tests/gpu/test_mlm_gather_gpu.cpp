// @brief GPU tests of kernels/mlm_gather (the masked-LM head's plan and scatter) against
// tests/reference/mlm_gather_ref.h on odd shapes: fresh random labels (some sequences full to K,
// some empty), bad labels and sequences with more than K labelled rows (the status word), the
// scatter's vector and scalar paths (hidden % 8, misaligned bases). Every output is poisoned first
// (the ints with 0x7F7F7F7F, the rows with NaN), so anything left unwritten shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/mlm_gather.cuh"
#include "kernels/token_drop.cuh"
#include "tests/reference/mlm_gather_ref.h"
#include "tests/reference/token_drop_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using test::DeviceArray;

namespace {

enum class Labels { Fit, Bad, TooMany };
struct Shape {
  int B, S, K, h;
  int offset;  // elements added to the row buffers' bases (1: the scalar path)
  Labels labels;
};

std::string name(const Shape& s) {
  const char* l = s.labels == Labels::Fit ? "" : s.labels == Labels::Bad ? "_bad" : "_toomany";
  return "B" + std::to_string(s.B) + "_S" + std::to_string(s.S) + "_K" + std::to_string(s.K) + "_h" +
         std::to_string(s.h) + (s.offset ? "_misaligned" : "") + l;
}

constexpr int kVocab = 1000;

// Sequence b gets min(K, a random count) labelled rows at random positions (sequence 0 exactly K,
// the last none when B > 2); Bad: one label out of range; TooMany: one sequence with K + 1.
std::vector<std::int32_t> make_labels(const Shape& sh, std::mt19937_64& rng) {
  std::vector<std::int32_t> lab(std::size_t(sh.B) * sh.S, -100);
  std::uniform_int_distribution<int> word(0, kVocab - 1);
  for (int b = 0; b < sh.B; ++b) {
    int n = std::uniform_int_distribution<int>(0, sh.K)(rng);
    if (b == 0) n = sh.K;
    if (b == sh.B - 1 && sh.B > 2) n = 0;
    if (sh.labels == Labels::TooMany && b == sh.B / 2) n = std::min(sh.S, sh.K + 1);
    std::vector<int> p(std::size_t(sh.S));
    for (int i = 0; i < sh.S; ++i) p[std::size_t(i)] = i;
    std::shuffle(p.begin(), p.end(), rng);
    for (int j = 0; j < n; ++j) lab[std::size_t(b) * sh.S + p[std::size_t(j)]] = word(rng);
  }
  if (sh.labels == Labels::Bad) lab[lab.size() / 2 + 1] = kVocab + 3;
  return lab;
}

class MlmGatherGpu : public ::testing::TestWithParam<Shape> {};

}  // namespace

namespace {
// One case with the rows in E (bf16 or fp16): the plan, token_gather on it and the scatter back.
template <typename E>
void check_case(const Shape& sh) {
  auto rng = test::fresh_rng();
  const std::vector<std::int32_t> lab = make_labels(sh, rng);
  const ref::MlmGatherPlan want = ref::mlm_gather_plan(lab, sh.B, sh.S, sh.K, kVocab);
  const int expected_sign = sh.labels == Labels::Bad ? 1 : sh.labels == Labels::TooMany ? -1 : 0;
  EXPECT_EQ((want.status > 0) - (want.status < 0), expected_sign) << "the labels made for this case";
  if (sh.labels == Labels::TooMany) {
    EXPECT_EQ(want.status, -(sh.B / 2 + 1));
  }

  const std::size_t P = std::size_t(sh.B) * sh.K, M = std::size_t(sh.B) * sh.S;
  DeviceArray<std::int32_t> dlab(lab), dpos(P), dglab(P), dslot(M), dstatus(1);
  for (auto* d : {&dpos, &dglab, &dslot, &dstatus})
    CUTRAIN_CUDA_CHECK(cudaMemset(d->get(), 0x7F, d->size() * sizeof(std::int32_t)));
  cudaStream_t s = nullptr;
  kernels::mlm_gather_plan(s, dlab.get(), sh.B, sh.S, sh.K, kVocab, dpos.get(), dglab.get(), dslot.get(),
                           dstatus.get());
  EXPECT_EQ(dpos.download(), want.pos);
  EXPECT_EQ(dglab.download(), want.glabels);
  EXPECT_EQ(dslot.download(), want.slot);
  EXPECT_EQ(dstatus.download()[0], want.status);
  // The status is written, not accumulated: a second plan on valid labels clears it.
  if (sh.labels != Labels::Fit) {
    std::vector<std::int32_t> clean(lab.size(), -100);
    clean[0] = 1;
    DeviceArray<std::int32_t> dclean(clean);
    kernels::mlm_gather_plan(s, dclean.get(), sh.B, sh.S, sh.K, kVocab, dpos.get(), dglab.get(), dslot.get(),
                             dstatus.get());
    EXPECT_EQ(dstatus.download()[0], 0);
    kernels::mlm_gather_plan(s, dlab.get(), sh.B, sh.S, sh.K, kVocab, dpos.get(), dglab.get(), dslot.get(),
                             dstatus.get());
  }

  // The head's rows: token_gather on the plan's positions, and the scatter back.
  const int o = sh.offset;
  const std::vector<float> x = test::round_to<E>(test::random_normal(M * sh.h, rng));
  const std::vector<float> d = test::round_to<E>(test::random_normal(P * sh.h, rng));
  auto upload = [&](const std::vector<float>& v) {
    DeviceArray<E> a(v.size() + o);
    std::vector<E> hv = test::to_storage<E>(v);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(a.get() + o, hv.data(), hv.size() * sizeof(E), cudaMemcpyHostToDevice));
    return a;
  };
  auto download = [&](const DeviceArray<E>& a) {
    std::vector<float> all = test::download_float(a);
    return std::vector<float>(all.begin() + o, all.end());
  };
  DeviceArray<E> dx = upload(x), dd = upload(d), dg(P * sh.h + o), dout(M * sh.h + o);
  kernels::token_gather(s, dx.get() + o, dpos.get(), dg.get() + o, sh.B, sh.S, sh.K, sh.h);
  const std::vector<float> got_g = download(dg);
  EXPECT_EQ(test::count_nan(got_g), 0u) << "a slot left unwritten";
  EXPECT_EQ(test::rel_error(got_g, ref::token_gather({x.begin(), x.end()}, want.pos, sh.B, sh.S, sh.K, sh.h)), 0.0);

  kernels::mlm_scatter_rows(s, dd.get() + o, dslot.get(), dout.get() + o, int(M), sh.h);
  const std::vector<float> got = download(dout);
  EXPECT_EQ(test::count_nan(got), 0u) << "a row left unwritten";
  const std::vector<double> want_s = ref::mlm_scatter_rows({d.begin(), d.end()}, want.slot, int(M), sh.h);
  std::size_t mismatched = 0;
  for (std::size_t i = 0; i < got.size(); ++i) mismatched += double(got[i]) != want_s[i];
  EXPECT_EQ(mismatched, 0u) << "the scatter is a copy or zeros";
}

}  // namespace

TEST_P(MlmGatherGpu, PlanGatherAndScatterMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  check_case<bf16>(GetParam());
}

// The fp16 instances of the gather and scatter (fp16 training): bit-exact copies as in bf16.
TEST_P(MlmGatherGpu, Fp16RowsGatherAndScatterMatchTheReference) {
  CUTRAIN_REQUIRE_GPU();
  check_case<f16>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(OddShapes, MlmGatherGpu,
                         ::testing::Values(Shape{1, 1, 1, 1, 0, Labels::Fit}, Shape{3, 17, 5, 7, 0, Labels::Fit},
                                           Shape{2, 33, 32, 64, 0, Labels::Fit}, Shape{2, 33, 6, 64, 1, Labels::Fit},
                                           Shape{5, 129, 20, 200, 0, Labels::Fit},
                                           Shape{37, 128, 20, 136, 0, Labels::Fit},
                                           Shape{70, 130, 77, 24, 1, Labels::Fit},
                                           Shape{4, 512, 80, 1024, 0, Labels::Fit},
                                           Shape{3, 40, 7, 16, 0, Labels::Bad},
                                           Shape{5, 64, 10, 40, 0, Labels::TooMany},
                                           Shape{9, 31, 4, 9, 1, Labels::TooMany}),
                         [](const auto& i) { return name(i.param); });
