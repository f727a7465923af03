// @brief GPU tests of the flash attention kernels with BERT's options (kernels/attention.cuh
// AttentionOptions): key (padding) masks and dropout on the probabilities, forward and both
// backward modes, against the fp64 CPU reference drawing the same Philox bits; outputs poisoned
// first. Batches mix a sequence with no valid key, a fully valid one, a padded prefix and a
// non-prefix random mask. Also: the same key gives the same bits, another step (set directly or
// read through step_ptr) another mask; the key mask from tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention.cuh"
#include "tests/gpu/attention_checks.h"
#include "tests/reference/attention_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using kernels::AttentionShape;

namespace {

// (seq, head_dim, causal, dropout p, key mask)
using Param = std::tuple<int, int, bool, float, bool>;

std::string param_name(const Param& p) {
  std::ostringstream os;
  os << 'S' << std::get<0>(p) << 'D' << std::get<1>(p) << (std::get<2>(p) ? "_causal" : "_full") << "_p"
     << static_cast<int>(std::get<3>(p) * 100) << (std::get<4>(p) ? "_mask" : "");
  return os.str();
}

class AttentionOptionsGpu : public ::testing::TestWithParam<Param> {};

// One case on E (bf16 or fp16) storage: O within tol_o of the fp64 reference, the gradients
// within tol_g (attention_grad_error).
template <typename E>
void check_case(const Param& param, double tol_o, double tol_g) {
  const auto [seq, dim, causal, p, masked] = param;
  AttentionShape sh{masked ? 4 : 2, seq, seq > 200 ? 1 : 2, dim, causal};
  auto rng = test::fresh_rng();
  const std::size_t n_qkv = static_cast<std::size_t>(sh.batch) * seq * 3 * sh.heads * dim, n_o = n_qkv / 3;
  const std::size_t n_l = static_cast<std::size_t>(sh.batch) * sh.heads * seq;
  const std::size_t row = static_cast<std::size_t>(sh.heads) * dim;

  const auto qkv_f = test::round_to<E>(test::random_normal(n_qkv, rng));
  const auto dout_f = test::round_to<E>(test::random_normal(n_o, rng));
  test::DeviceArray<E> qkv(test::to_storage<E>(qkv_f)), dout(test::to_storage<E>(dout_f));

  ref::AttentionRefOptions ro;
  if (masked) ro.key_mask = test::option_test_mask(sh, rng);
  ro.dropout = {rng(), static_cast<std::uint32_t>(rng() % 1000), 3, nullptr};
  ro.dropout_p = p;
  test::DeviceArray<std::uint8_t> mask_d(ro.key_mask);
  kernels::AttentionOptions opt;
  opt.key_mask = masked ? mask_d.get() : nullptr;
  opt.dropout = ro.dropout;
  opt.dropout_p = p;

  // ---- forward ----
  test::DeviceArray<E> out(n_o);
  test::DeviceArray<float> lse(n_l);
  kernels::attention_forward(nullptr, qkv.get(), out.get(), lse.get(), sh, opt);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out_h = test::download_float(out);
  const auto lse_h = lse.download();
  ASSERT_EQ(test::count_nan(out_h), 0u) << "output elements left unwritten (poison survived)";
  ASSERT_EQ(test::count_nan(lse_h), 0u) << "lse elements left unwritten (poison survived)";

  std::vector<double> out_r, lse_r;
  ref::attention_forward(qkv_f, sh, out_r, lse_r, ro);
  EXPECT_LE(test::rel_error(out_h, out_r), tol_o) << "O vs CPU";
  // lse: -inf exactly where the reference's row has no key; relative error over the rest.
  const std::size_t empty_rows = test::expect_lse_matches(lse_h, lse_r);
  if (masked) {
    EXPECT_GE(empty_rows, static_cast<std::size_t>(sh.heads) * seq) << "sequence 0 must have no key";
    // Sequence 0 (no key): its S x H x D outputs come first.
    for (std::size_t i = 0; i < row * seq; ++i) ASSERT_EQ(out_h[i], 0.f) << "out of a row with no key, at " << i;
  }

  // ---- backward: reference, deterministic twice, fast twice ----
  std::vector<double> dqkv_r;
  ref::attention_backward(qkv_f, out_h, dout_f, sh, dqkv_r, ro);
  const char* names[3] = {"dQ", "dK", "dV"};
  auto check_grads = [&](const std::vector<float>& g, const char* what) {
    ASSERT_EQ(test::count_nan(g), 0u) << what << ": dqkv elements left unwritten (poison survived)";
    for (int w = 0; w < 3; ++w)
      EXPECT_LE(test::attention_grad_error(test::attention_slot(g, sh, w), test::attention_slot(dqkv_r, sh, w),
                                           test::attention_slot(dqkv_r, sh, 2)),
                tol_g)
          << names[w] << " (" << what << ") vs CPU";
    // Masked keys get exactly zero dK, dV; the rows of sequence 0 (no key) exactly zero dQ.
    if (!masked) return;
    for (int b = 0; b < sh.batch; ++b)
      for (int j = 0; j < seq; ++j) {
        const std::size_t tok = static_cast<std::size_t>(b) * seq + j;
        for (std::size_t e = 0; e < 3 * row; ++e) {
          const bool zero_k = !ro.key_mask[tok] && e >= row, zero_q = b == 0 && e < row;
          if (zero_k || zero_q) {
            ASSERT_EQ(g[tok * 3 * row + e], 0.f) << what << ": token " << tok << " element " << e;
          }
        }
      }
  };

  test::DeviceArray<float> scratch((kernels::attention_backward_scratch_bytes(sh, true) + 3) / 4);
  test::DeviceArray<E> dqkv(n_qkv), dqkv2(n_qkv);
  kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv.get(), scratch.get(), sh, true,
                              opt);
  const auto det_raw = dqkv.download();
  check_grads(test::to_float(det_raw), "deterministic");
  kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv2.get(), scratch.get(), sh,
                              true, opt);
  const auto det2_raw = dqkv2.download();
  EXPECT_EQ(std::memcmp(det_raw.data(), det2_raw.data(), n_qkv * sizeof(E)), 0) << "deterministic mode differs";

  test::DeviceArray<float> scratch_fast((kernels::attention_backward_scratch_bytes(sh, false) + 3) / 4);
  test::DeviceArray<E> dqkv_fast(n_qkv);
  for (int run = 0; run < 2; ++run) {  // the second on the dirty scratch
    dqkv_fast.poison();
    kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv_fast.get(),
                                scratch_fast.get(), sh, false, opt);
    check_grads(test::download_float(dqkv_fast), run == 0 ? "fast" : "fast, second run");
  }
}

TEST_P(AttentionOptionsGpu, MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  check_case<bf16>(GetParam(), 1e-2, 1e-2);
}

// The fp16 instance (fp16 training), the same cases: fp16 keeps 11 significant bits against bf16's
// 8, so O within 3e-3; the gradients within 5e-3 (dS = P (dP - D) cancels, as in bf16 where 1e-2
// holds with 8 bits).
TEST_P(AttentionOptionsGpu, Fp16MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  check_case<f16>(GetParam(), 3e-3, 5e-3);
}

INSTANTIATE_TEST_SUITE_P(Options, AttentionOptionsGpu,
                         ::testing::Combine(::testing::Values(1, 37, 129, 200, 513), ::testing::Values(64, 128),
                                            ::testing::Bool(), ::testing::Values(0.f, 0.1f, 0.5f), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Param>& i) { return param_name(i.param); });

// The mask is a function of (seed, step, layer, element) alone: the same key twice gives the same
// bits, another step another output, and step_ptr reads the step from device memory.
TEST(AttentionOptionsGpu, DropoutKeyAndStepPtr) {
  CUTRAIN_REQUIRE_GPU();
  const AttentionShape sh{2, 128, 2, 64, false};
  auto rng = test::fresh_rng();
  const std::size_t n_qkv = static_cast<std::size_t>(sh.batch) * sh.seq * 3 * sh.heads * sh.head_dim, n_o = n_qkv / 3;
  const std::size_t n_l = static_cast<std::size_t>(sh.batch) * sh.heads * sh.seq;
  const auto qkv_f = test::round_bf16(test::random_normal(n_qkv, rng));
  const auto dout_f = test::round_bf16(test::random_normal(n_o, rng));
  test::DeviceArray<bf16> qkv(test::to_bf16(qkv_f)), dout(test::to_bf16(dout_f));
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(sh.batch) * sh.seq, 1);
  for (int j = 100; j < sh.seq; ++j) mask[j] = 0;  // sequence 0 padded to 100
  test::DeviceArray<std::uint8_t> mask_d(mask);
  test::DeviceArray<std::uint32_t> step_d(std::vector<std::uint32_t>{41});

  struct Result {
    std::vector<bf16> out, dqkv;
    std::vector<float> lse;
  };
  auto run = [&](std::uint32_t step, const std::uint32_t* step_ptr) {
    kernels::AttentionOptions opt;
    opt.key_mask = mask_d.get();
    opt.dropout = {0x1234567890abcdefull, step, 2, step_ptr};
    opt.dropout_p = 0.3f;
    test::DeviceArray<bf16> out(n_o), dqkv(n_qkv);
    test::DeviceArray<float> lse(n_l);
    test::DeviceArray<float> scratch((kernels::attention_backward_scratch_bytes(sh, true) + 3) / 4);
    kernels::attention_forward(nullptr, qkv.get(), out.get(), lse.get(), sh, opt);
    kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv.get(), scratch.get(), sh,
                                true, opt);
    return Result{out.download(), dqkv.download(), lse.download()};
  };
  auto same = [](const std::vector<bf16>& a, const std::vector<bf16>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
  };
  const Result a = run(41, nullptr), b = run(41, nullptr), c = run(42, nullptr), d = run(0, step_d.get());
  EXPECT_TRUE(same(a.out, b.out) && same(a.dqkv, b.dqkv)) << "the same key must give the same bits";
  EXPECT_FALSE(same(a.out, c.out)) << "another step must draw another mask";
  EXPECT_FALSE(same(a.dqkv, c.dqkv)) << "another step must draw another mask (backward)";
  EXPECT_EQ(a.lse, c.lse) << "lse is that of the undropped softmax";
  EXPECT_TRUE(same(a.out, d.out) && same(a.dqkv, d.dqkv)) << "step_ptr -> 41 must match step 41";
  step_d.upload({42});
  const Result e = run(0, step_d.get());
  EXPECT_TRUE(same(c.out, e.out) && same(c.dqkv, e.dqkv)) << "step_ptr -> 42 must match step 42";

  // And the bits are the reference's: the output matches the CPU with step 42.
  ref::AttentionRefOptions ro;
  ro.key_mask = mask;
  ro.dropout = {0x1234567890abcdefull, 42, 2, nullptr};
  ro.dropout_p = 0.3f;
  std::vector<double> out_r, lse_r;
  ref::attention_forward(qkv_f, sh, out_r, lse_r, ro);
  EXPECT_LE(test::rel_error(test::to_float(e.out), out_r), 1e-2);
}

// attention_key_mask_from_tokens: 1 where the token is not the pad id, over odd sizes.
TEST(AttentionOptionsGpu, KeyMaskFromTokens) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (std::size_t n : {std::size_t(1), std::size_t(255), std::size_t(1000)}) {
    const std::int32_t pad = 3;
    const auto tokens = test::random_ints(n, rng, 0, 5);
    test::DeviceArray<std::int32_t> tok_d(tokens);
    test::DeviceArray<std::uint8_t> mask_d(n);
    kernels::attention_key_mask_from_tokens(nullptr, tok_d.get(), pad, mask_d.get(), n);
    const auto mask = mask_d.download();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(mask[i], tokens[i] != pad ? 1 : 0) << "token " << i << " of " << n;
  }
}

}  // namespace
