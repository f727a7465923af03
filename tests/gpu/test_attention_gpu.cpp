// @brief GPU tests of the flash attention kernels against the naive GPU reference (all sizes) and the
// fp64 CPU reference (small sizes): O, lse, dQ, dK, dV on fresh random inputs, outputs poisoned
// first; the deterministic backward gives identical bits twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention.cuh"
#include "tests/gpu/attention_checks.h"
#include "tests/gpu/attention_naive.h"
#include "tests/reference/attention_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using kernels::AttentionShape;

namespace {

// (seq, heads, causal, head_dim, large logits)
using Param = std::tuple<int, int, bool, int, bool>;

std::string param_name(const Param& p) {
  std::ostringstream os;  // (not operator+ chains: GCC 12 -O3 raises a false -Wrestrict on those)
  os << 'S' << std::get<0>(p) << 'H' << std::get<1>(p) << 'D' << std::get<3>(p) << (std::get<2>(p) ? "_causal" : "_full")
     << (std::get<4>(p) ? "_large" : "");
  return os.str();
}

class AttentionGpu : public ::testing::TestWithParam<Param> {};

TEST_P(AttentionGpu, MatchesReferences) {
  CUTRAIN_REQUIRE_GPU();
  const auto [seq, heads, causal, dim, large] = GetParam();
  AttentionShape sh{seq <= 129 ? 2 : 1, seq, heads, dim, causal};
  auto rng = test::fresh_rng();
  const std::size_t n_qkv = static_cast<std::size_t>(sh.batch) * seq * 3 * heads * dim, n_o = n_qkv / 3;
  const std::size_t n_l = static_cast<std::size_t>(sh.batch) * heads * seq;

  auto qkv_f = test::random_normal(n_qkv, rng);
  if (large)  // q and k x8: logits with std ~64, so the running max moves by a lot between tiles
    for (std::size_t t = 0; t < n_qkv / (3 * heads * dim); ++t)
      for (std::size_t e = 0; e < 2ull * heads * dim; ++e) qkv_f[t * 3 * heads * dim + e] *= 8.f;
  qkv_f = test::round_bf16(qkv_f);
  const auto dout_f = test::round_bf16(test::random_normal(n_o, rng));
  test::DeviceArray<bf16> qkv(test::to_bf16(qkv_f)), dout(test::to_bf16(dout_f));

  // ---- forward ----
  test::DeviceArray<bf16> out(n_o);
  test::DeviceArray<float> lse(n_l);
  kernels::attention_forward(nullptr, qkv.get(), out.get(), lse.get(), sh);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out_h = test::download_float(out);
  const auto lse_h = lse.download();
  ASSERT_EQ(test::count_nan(out_h), 0u) << "output elements left unwritten (poison survived)";
  ASSERT_EQ(test::count_nan(lse_h), 0u) << "lse elements left unwritten (poison survived)";

  test::NaiveAttention naive(sh);
  test::DeviceArray<float> out_n(n_o), lse_n(n_l);
  naive.forward(qkv.get(), out_n.get(), lse_n.get());
  const auto out_nh = out_n.download(), lse_nh = lse_n.download();
  EXPECT_LE(test::rel_error(out_h, out_nh), 1e-2) << "O vs naive";
  EXPECT_LE(test::rel_error(lse_h, lse_nh), 1e-4) << "lse vs naive";

  // ---- backward, deterministic ----
  test::DeviceArray<float> scratch((kernels::attention_backward_scratch_bytes(sh, true) + 3) / 4);
  test::DeviceArray<bf16> dqkv(n_qkv), dqkv2(n_qkv), dqkv_fast(n_qkv);
  kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv.get(), scratch.get(), sh, true);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto dqkv_raw = dqkv.download();
  const auto dqkv_h = test::to_float(dqkv_raw);
  ASSERT_EQ(test::count_nan(dqkv_h), 0u) << "dqkv elements left unwritten (poison survived)";

  test::DeviceArray<float> dqkv_n(n_qkv);
  naive.backward(qkv.get(), out.get(), dout.get(), dqkv_n.get());
  const auto dqkv_nh = dqkv_n.download();
  const char* names[3] = {"dQ", "dK", "dV"};
  for (int w = 0; w < 3; ++w)
    EXPECT_LE(test::attention_grad_error(test::attention_slot(dqkv_h, sh, w), test::attention_slot(dqkv_nh, sh, w), test::attention_slot(dqkv_nh, sh, 2)), 1e-2) << names[w] << " vs naive";

  // Same bits on a second deterministic run.
  kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv2.get(), scratch.get(), sh, true);
  const auto dqkv2_raw = dqkv2.download();
  EXPECT_EQ(std::memcmp(dqkv_raw.data(), dqkv2_raw.data(), n_qkv * sizeof(bf16)), 0) << "deterministic mode differs";

  // The fast mode is within tolerance of the naive reference too.
  test::DeviceArray<float> scratch_fast((kernels::attention_backward_scratch_bytes(sh, false) + 3) / 4);
  kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv_fast.get(),
                              scratch_fast.get(), sh, false);
  const auto fast_h = test::download_float(dqkv_fast);
  ASSERT_EQ(test::count_nan(fast_h), 0u);
  for (int w = 0; w < 3; ++w)
    EXPECT_LE(test::attention_grad_error(test::attention_slot(fast_h, sh, w), test::attention_slot(dqkv_nh, sh, w), test::attention_slot(dqkv_nh, sh, 2)), 1e-2) << names[w] << " (fast) vs naive";
  // A second fast run on the same (now dirty) scratch: the launcher must clear its dQ accumulator.
  dqkv_fast.poison();
  kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv_fast.get(),
                              scratch_fast.get(), sh, false);
  const auto fast2_h = test::download_float(dqkv_fast);
  EXPECT_LE(test::attention_grad_error(test::attention_slot(fast2_h, sh, 0), test::attention_slot(dqkv_nh, sh, 0), test::attention_slot(dqkv_nh, sh, 2)), 1e-2) << "dQ (fast, second run) vs naive";

  // ---- fp64 CPU reference where it is cheap ----
  if (seq <= 129 || (seq <= 512 && heads == 1)) {
    std::vector<double> out_r, lse_r, dqkv_r;
    ref::attention_forward(qkv_f, sh, out_r, lse_r);
    EXPECT_LE(test::rel_error(out_h, out_r), 1e-2) << "O vs CPU";
    EXPECT_LE(test::rel_error(lse_h, lse_r), 1e-4) << "lse vs CPU";
    ref::attention_backward(qkv_f, out_h, dout_f, sh, dqkv_r);
    for (int w = 0; w < 3; ++w)
      EXPECT_LE(test::attention_grad_error(test::attention_slot(dqkv_h, sh, w), test::attention_slot(dqkv_r, sh, w), test::attention_slot(dqkv_r, sh, 2)), 1e-2) << names[w] << " vs CPU";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGpu,
                         ::testing::Combine(::testing::Values(1, 7, 64, 129, 200, 512, 2048), ::testing::Values(1, 16),
                                            ::testing::Bool(), ::testing::Values(64, 128), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Param>& i) { return param_name(i.param); });

}  // namespace
