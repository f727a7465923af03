// @brief GPU tests of the sm90 attention pair (kernels/attention_sm90/, the production kernels) with
// BERT's options (kernels::AttentionOptions): key (padding) masks and dropout on the probabilities.
// "Production" below is kernels::attention_forward / attention_backward (the backward's schedule
// table's choice per shape), "Hopper" the sm90 backward with each schedule named.
// AttentionHopperOptionsGpu: both kernels (every backward schedule, fast and deterministic) against the fp64 CPU reference
// drawing the same Philox bits, over odd S, d64 / d128, causal or not, mask / dropout / both, outputs
// poisoned first; batches mix a sequence with no valid key (O 0, lse -inf, gradient 0), a fully
// valid one, a padded prefix and a random non-prefix mask; also the production backward.
// AttentionHopperDropoutMaskGpu: the keep mask itself, read out exactly (Q = K = 0 makes P uniform,
// a one-hot V or dO turns each kept element into a nonzero output), is bit for bit the same from
// the forward, the Hopper and production backward, and the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention.cuh"
#include "kernels/attention_sm90/attention_sm90.h"
#include "tests/gpu/attention_checks.h"
#include "tests/gpu/attention_hopper_schedules.h"
#include "tests/reference/attention_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using kernels::AttentionShape;
namespace hopper = cutrain::kernels::sm90;
using test::hopper_schedules::schedule_name;

namespace {

const auto& kBwdSchedules = test::hopper_schedules::kBackward;
const auto& kDqSchedules = test::hopper_schedules::kDq;

std::size_t fast_scratch_floats(const AttentionShape& sh) {
  return (kernels::attention_backward_scratch_bytes(sh, false) + 3) / 4;
}

// (seq, head_dim, causal, dropout p, key mask)
using Param = std::tuple<int, int, bool, float, bool>;

std::string param_name(const ::testing::TestParamInfo<Param>& i) {
  std::ostringstream os;
  os << 'S' << std::get<0>(i.param) << 'D' << std::get<1>(i.param) << (std::get<2>(i.param) ? "_causal" : "_full")
     << "_p" << static_cast<int>(std::get<3>(i.param) * 100) << (std::get<4>(i.param) ? "_mask" : "");
  return os.str();
}

class AttentionHopperOptionsGpu : public ::testing::TestWithParam<Param> {};

TEST_P(AttentionHopperOptionsGpu, MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  const auto [seq, dim, causal, p, masked] = GetParam();
  const AttentionShape sh{masked ? 4 : 2, seq, seq > 200 ? 1 : 2, dim, causal};
  auto rng = test::fresh_rng();
  const std::size_t n_qkv = static_cast<std::size_t>(sh.batch) * seq * 3 * sh.heads * dim, n_o = n_qkv / 3;
  const std::size_t n_l = static_cast<std::size_t>(sh.batch) * sh.heads * seq;
  const std::size_t row = static_cast<std::size_t>(sh.heads) * dim;

  const auto qkv_f = test::round_bf16(test::random_normal(n_qkv, rng));
  const auto dout_f = test::round_bf16(test::random_normal(n_o, rng));
  test::DeviceArray<bf16> qkv(test::to_bf16(qkv_f)), dout(test::to_bf16(dout_f));

  ref::AttentionRefOptions ro;
  if (masked) ro.key_mask = test::option_test_mask(sh, rng);
  ro.dropout = {rng(), static_cast<std::uint32_t>(rng() % 1000), 3, nullptr};
  ro.dropout_p = p;
  test::DeviceArray<std::uint8_t> mask_d(ro.key_mask);
  kernels::AttentionOptions opt;
  opt.key_mask = masked ? mask_d.get() : nullptr;
  opt.dropout = ro.dropout;
  opt.dropout_p = p;

  // ---- forward: the reference, then the kernel with each query tile, then the production entry
  // (kernels::attention_forward), whose outputs feed the backward below ----
  std::vector<double> out_r, lse_r;
  ref::attention_forward(qkv_f, sh, out_r, lse_r, ro);
  test::DeviceArray<bf16> out(n_o);
  test::DeviceArray<float> lse(n_l);
  std::vector<float> out_h;
  for (int run = 0; run <= 2; ++run) {
    const bool production = run == 2;
    const hopper::FwdTile tile = test::hopper_schedules::kFwdTiles[production ? 0 : run];
    SCOPED_TRACE(production ? "production forward" : schedule_name(tile));
    out.poison();
    lse.poison();
    if (production) kernels::attention_forward(nullptr, qkv.get(), out.get(), lse.get(), sh, opt);
    else hopper::attention_forward(nullptr, qkv.get(), out.get(), lse.get(), sh, opt, tile);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    out_h = test::download_float(out);
    const auto l_h = lse.download();
    ASSERT_EQ(test::count_nan(out_h), 0u) << "O elements left unwritten (poison survived)";
    ASSERT_EQ(test::count_nan(l_h), 0u) << "lse elements left unwritten (poison survived)";
    EXPECT_LE(test::rel_error(out_h, out_r), 1e-2) << "O vs CPU";
    test::expect_lse_matches(l_h, lse_r);
    if (masked) {  // sequence 0 has no key: its S x H x D outputs come first and are exactly 0
      for (std::size_t i = 0; i < row * seq; ++i) ASSERT_EQ(out_h[i], 0.f) << "O of a row with no key, at " << i;
    }
  }

  // ---- backward ----
  const char* names[3] = {"dQ", "dK", "dV"};
  // dqkv against the reference computed from the O the backward was given; masked keys get exactly
  // zero dK, dV, and the rows of sequence 0 (no key) exactly zero dQ.
  auto check_grads = [&](const std::vector<float>& g, const std::vector<double>& want, const std::string& what) {
    ASSERT_EQ(test::count_nan(g), 0u) << what << ": dqkv elements left unwritten (poison survived)";
    for (int w = 0; w < 3; ++w)
      EXPECT_LE(test::attention_grad_error(test::attention_slot(g, sh, w), test::attention_slot(want, sh, w),
                                           test::attention_slot(want, sh, 2)),
                1e-2)
          << names[w] << " (" << what << ") vs CPU";
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

  std::vector<double> dqkv_r;
  ref::attention_backward(qkv_f, out_h, dout_f, sh, dqkv_r, ro);
  test::DeviceArray<float> scratch(fast_scratch_floats(sh));
  for (const hopper::BackwardSchedule schedule : kBwdSchedules) {  // the second on the first's dirty scratch
    test::DeviceArray<bf16> dqkv(n_qkv);
    hopper::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv.get(), scratch.get(), sh,
                               schedule, opt);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    check_grads(test::download_float(dqkv), dqkv_r, std::string("Hopper backward, ") +
                                                        schedule_name(schedule));
    // The deterministic mode: the dK/dV pass without its dQ atomics, then the wgmma dQ pass (each schedule).
    for (const hopper::DqSchedule dq_schedule : kDqSchedules) {
      test::DeviceArray<bf16> dqkv_det(n_qkv);
      hopper::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv_det.get(), scratch.get(),
                                 sh, schedule, opt, true, dq_schedule);
      CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
      check_grads(test::download_float(dqkv_det), dqkv_r,
                  std::string("Hopper backward (deterministic), ") + schedule_name(schedule) + ", " +
                      schedule_name(dq_schedule));
    }
  }
  // The production backward (fast mode) from the forward's O and lse.
  {
    test::DeviceArray<bf16> dqkv(n_qkv);
    kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv.get(), scratch.get(), sh,
                                false, opt);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    check_grads(test::download_float(dqkv), dqkv_r, "production backward");
  }
}

// Masks with and without dropout; dropout alone. Odd S (1, 37: not a multiple of 4, so the keep
// bits take their unaligned path; 129, 513: a tile plus a little), several K/V tiles and key blocks.
INSTANTIATE_TEST_SUITE_P(Masked, AttentionHopperOptionsGpu,
                         ::testing::Combine(::testing::Values(1, 37, 129, 200, 513), ::testing::Values(64, 128),
                                            ::testing::Bool(), ::testing::Values(0.f, 0.1f, 0.5f),
                                            ::testing::Values(true)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Dropout, AttentionHopperOptionsGpu,
                         ::testing::Combine(::testing::Values(1, 37, 129, 200, 513), ::testing::Values(64, 128),
                                            ::testing::Bool(), ::testing::Values(0.1f, 0.5f), ::testing::Values(false)),
                         param_name);

// ---- the keep mask itself ----

// (seq, head_dim, causal); batch 2, heads 2, p 0.3.
using MaskParam = std::tuple<int, int, bool>;

class AttentionHopperDropoutMaskGpu : public ::testing::TestWithParam<MaskParam> {};

// With Q = K = 0 every score is 0: the forward's P V takes P = 1 for each key (its row max is 0),
// the backward's P^T = exp(0 - lse) = 1/n > 0. So, per window w of D keys (forward) or D queries
// (backward):
//   V[b, j, h, d] = (j == wD + d)  ->  O[b, i, h, d] != 0 exactly where element (i, j = wD + d) is kept;
//   dO[b, i, h, d] = (i == wD + d) ->  dV[b, j, h, d] != 0 exactly where (i = wD + d, j) is kept.
// Every kernel's read-out must equal ref::attention_dropout_keep for every (b, h, i, j) a row
// attends (causal: j <= i).
TEST_P(AttentionHopperDropoutMaskGpu, KeepBitsMatchProductionAndReference) {
  CUTRAIN_REQUIRE_GPU();
  const auto [seq, dim, causal] = GetParam();
  const AttentionShape sh{2, seq, 2, dim, causal};
  const int B = sh.batch, H = sh.heads, S = seq, D = dim;
  auto rng = test::fresh_rng();
  ref::AttentionRefOptions ro;
  ro.dropout = {rng(), static_cast<std::uint32_t>(rng() % 100000), 5, nullptr};
  ro.dropout_p = 0.3f;
  kernels::AttentionOptions opt;
  opt.dropout = ro.dropout;
  opt.dropout_p = ro.dropout_p;

  const std::size_t n_o = static_cast<std::size_t>(B) * S * H * D, n_qkv = 3 * n_o;
  const std::size_t n_l = static_cast<std::size_t>(B) * H * S;
  auto at = [&](int b, int s, int w, int h, int d) {  // index into [B, S, 3, H, D]
    return ((static_cast<std::size_t>(b) * S + s) * 3 + w) * H * D + static_cast<std::size_t>(h) * D + d;
  };
  auto at_o = [&](int b, int s, int h, int d) {  // index into [B, S, H, D]
    return ((static_cast<std::size_t>(b) * S + s) * H + h) * D + d;
  };

  // Compares one read-out (kept[(b,h,i,j)] as the kernel shows it) with the reference; names the
  // first disagreement.
  std::size_t checked = 0, kept_total = 0;
  auto compare = [&](const char* who, int b, int h, int i, int j, bool got) {
    if (causal && j > i) return ::testing::AssertionSuccess();
    ++checked;
    const bool want = ref::attention_dropout_keep(ro, sh, b, h, i, j);
    kept_total += want;
    if (got == want) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << who << ": element (b " << b << ", h " << h << ", query " << i << ", key "
                                         << j << ") is " << (got ? "kept" : "dropped") << ", the reference "
                                         << (want ? "keeps" : "drops") << " it";
  };

  test::DeviceArray<bf16> out(n_o), dqkv(n_qkv);
  test::DeviceArray<float> lse(n_l), scratch(fast_scratch_floats(sh)),
      scratch_det((kernels::attention_backward_scratch_bytes(sh, true) + 3) / 4);
  for (int w = 0; w * D < S; ++w) {
    SCOPED_TRACE("window " + std::to_string(w));
    // Forward: V one-hot over the window's keys.
    std::vector<float> qkv_f(n_qkv, 0.f);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D && w * D + d < S; ++d) qkv_f[at(b, w * D + d, 2, h, d)] = 1.f;
    test::DeviceArray<bf16> qkv(test::to_bf16(qkv_f));
    auto read_forward = [&](const char* who, auto&& run) {
      out.poison();
      run();
      CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
      const auto o = test::download_float(out);
      ASSERT_EQ(test::count_nan(o), 0u) << who << ": O left unwritten";
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < S; ++i)
            for (int d = 0; d < D && w * D + d < S; ++d)
              ASSERT_TRUE(compare(who, b, h, i, w * D + d, o[at_o(b, i, h, d)] != 0.f));
    };
    read_forward("forward", [&] { kernels::attention_forward(nullptr, qkv.get(), out.get(), lse.get(), sh, opt); });
    // lse = ln(number of keys of the row), as the forward wrote it.

    // Backward: dO one-hot over the window's queries (Q = K = V = 0 now; V only reaches dK, dQ).
    std::vector<float> dout_f(n_o, 0.f);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D && w * D + d < S; ++d) dout_f[at_o(b, w * D + d, h, d)] = 1.f;
    test::DeviceArray<bf16> dout(test::to_bf16(dout_f));
    test::DeviceArray<bf16> zeros(test::to_bf16(std::vector<float>(n_qkv, 0.f)));
    auto read_backward = [&](const char* who, auto&& run) {
      dqkv.poison();
      run();
      CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
      const auto g = test::download_float(dqkv);
      ASSERT_EQ(test::count_nan(g), 0u) << who << ": dqkv left unwritten";
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int j = 0; j < S; ++j)
            for (int d = 0; d < D && w * D + d < S; ++d)
              ASSERT_TRUE(compare(who, b, h, w * D + d, j, g[at(b, j, 2, h, d)] != 0.f));
    };
    read_backward("production backward (fast)", [&] {
      kernels::attention_backward(nullptr, zeros.get(), out.get(), dout.get(), lse.get(), dqkv.get(), scratch.get(),
                                  sh, false, opt);
    });
    read_backward("production backward (deterministic)", [&] {
      kernels::attention_backward(nullptr, zeros.get(), out.get(), dout.get(), lse.get(), dqkv.get(),
                                  scratch_det.get(), sh, true, opt);
    });
    for (const hopper::BackwardSchedule schedule : kBwdSchedules)
      for (const bool det : {false, true}) {  // ProducerOverlap's overlap loop runs in the deterministic mode only
        const std::string who = std::string(schedule_name(schedule)) + (det ? " (deterministic)" : " (fast)");
        read_backward(who.c_str(), [&] {
          hopper::attention_backward(nullptr, zeros.get(), out.get(), dout.get(), lse.get(), dqkv.get(),
                                     scratch.get(), sh, schedule, opt, det, hopper::DqSchedule::Overlap);
        });
      }
  }
  // The read-out saw both outcomes in plenty (p = 0.3): a kernel that kept or dropped everything fails above.
  EXPECT_GT(kept_total, checked / 2);
  EXPECT_LT(kept_total, checked);
}

// S 61 (not a multiple of 4: the keep bits' unaligned path), 128, 200 and 300 (several K/V tiles, key
// blocks and query tiles); d64 and d128 (its 96-key forward tiles).
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionHopperDropoutMaskGpu,
                         ::testing::Combine(::testing::Values(61, 128, 200, 300), ::testing::Values(64, 128),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<MaskParam>& i) {
                           std::ostringstream os;
                           os << 'S' << std::get<0>(i.param) << 'D' << std::get<1>(i.param)
                              << (std::get<2>(i.param) ? "_causal" : "_full");
                           return os.str();
                         });

// The persistent forward (without causal: a CTA per SM looping over work tiles) with each query
// tile and at least three times as many work tiles as the device has SMs, so every CTA runs
// several and its Q buffers and K/V ring wrap: plain, with a key mask (its tile counts differ per
// sequence, so the CTAs' rings fall out of step), and with the mask and dropout. Against the CPU
// reference. S100: one K/V tile per work tile, so every work tile is a ring fill and drain of its
// own; S200: two, and the 192-query tile's second and third warpgroups have no rows before S in its
// second work tile of a sequence.
enum class PersistentOptions { Plain, Mask, MaskDrop };
class AttentionHopperPersistentGpu : public ::testing::TestWithParam<std::tuple<int, int, PersistentOptions>> {};

TEST_P(AttentionHopperPersistentGpu, ManyWorkTilesPerCta) {
  CUTRAIN_REQUIRE_GPU();
  const auto [seq, dim, which] = GetParam();
  const bool options = which != PersistentOptions::Plain, drop = which == PersistentOptions::MaskDrop;
  int dev = 0, sms = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int heads = 4, nq = (seq + 127) / 128;  // 128-query work tiles per sequence
  const AttentionShape sh{(3 * sms + nq * heads - 1) / (nq * heads), seq, heads, dim, false};
  auto rng = test::fresh_rng();
  const std::size_t n_qkv = static_cast<std::size_t>(sh.batch) * seq * 3 * heads * dim, n_o = n_qkv / 3;
  const std::size_t n_l = static_cast<std::size_t>(sh.batch) * heads * seq;
  const auto qkv_f = test::round_bf16(test::random_normal(n_qkv, rng));
  test::DeviceArray<bf16> qkv(test::to_bf16(qkv_f));
  ref::AttentionRefOptions ro;
  if (options) {
    ro.key_mask = test::option_test_mask(sh, rng);
    ro.dropout = {rng(), static_cast<std::uint32_t>(rng() % 1000), 3, nullptr};
    ro.dropout_p = drop ? 0.1f : 0.f;
  }
  test::DeviceArray<std::uint8_t> mask_d(options ? ro.key_mask : std::vector<std::uint8_t>(1));
  kernels::AttentionOptions opt;
  opt.key_mask = options ? mask_d.get() : nullptr;
  opt.dropout = ro.dropout;
  opt.dropout_p = ro.dropout_p;
  std::vector<double> out_r, lse_r;
  ref::attention_forward(qkv_f, sh, out_r, lse_r, ro);

  test::DeviceArray<bf16> o(n_o);
  test::DeviceArray<float> l(n_l);
  for (const hopper::FwdTile tile : test::hopper_schedules::kFwdTiles) {
    SCOPED_TRACE(std::string(schedule_name(tile)) + ", batch " + std::to_string(sh.batch));
    o.poison();
    l.poison();
    hopper::attention_forward(nullptr, qkv.get(), o.get(), l.get(), sh, opt, tile);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto o_h = test::download_float(o);
    const auto l_h = l.download();
    ASSERT_EQ(test::count_nan(o_h), 0u) << "O elements left unwritten (poison survived)";
    ASSERT_EQ(test::count_nan(l_h), 0u) << "lse elements left unwritten (poison survived)";
    EXPECT_LE(test::rel_error(o_h, out_r), 1e-2) << "O vs CPU";
    test::expect_lse_matches(l_h, lse_r);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionHopperPersistentGpu,
                         ::testing::Combine(::testing::Values(100, 200), ::testing::Values(64, 128),
                                            ::testing::Values(PersistentOptions::Plain, PersistentOptions::Mask,
                                                              PersistentOptions::MaskDrop)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int, PersistentOptions>>& i) {
                           const PersistentOptions o = std::get<2>(i.param);
                           return "S" + std::to_string(std::get<0>(i.param)) + "D" + std::to_string(std::get<1>(i.param)) +
                                  (o == PersistentOptions::Plain  ? "_plain"
                                   : o == PersistentOptions::Mask ? "_mask"
                                                                  : "_mask_p10");
                         });

}  // namespace
