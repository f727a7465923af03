// @brief GPU tests of the sm90 attention pair (kernels/attention_sm90/, the production kernels) with
// each schedule of each kernel (the forward's two query tiles; the production backward runs one per shape).
// Forward: O and the log-sum-exp against the fp64 CPU reference over odd shapes (S not a multiple
// of any tile, B > 1, H > 1, d64 / d128, causal / not, plain and large logits), and at long S
// against the naive GPU reference and kernels::attention_forward on the same inputs. Backward: dQ, dK, dV against the fp64 CPU reference over odd shapes
// (odd B, H and S), fast and deterministic modes (the deterministic one bit-identical on a second
// run), and at long S against the naive GPU reference and kernels::attention_backward's
// deterministic mode (its dQ from the wgmma dQ pass), from the production forward's O and lse;
// every dK/dV schedule (lockstep, producer, producer overlap) and both dQ-pass loops. fp16: every schedule and both backward modes
// against the fp64 CPU reference at odd shapes. Outputs poisoned first. A failure
// names the first element off (batch, token, head, column) with both values, and the product it
// points at.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/attention.cuh"
#include "kernels/attention_sm90/attention_sm90.h"
#include "tests/gpu/attention_checks.h"
#include "tests/gpu/attention_hopper_schedules.h"
#include "tests/gpu/attention_naive.h"
#include "tests/reference/attention_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using kernels::AttentionShape;
namespace hopper = cutrain::kernels::sm90;
using test::hopper_schedules::schedule_name;

namespace {

std::string shape_name(const AttentionShape& s) {
  std::ostringstream os;
  os << 'B' << s.batch << 'S' << s.seq << 'H' << s.heads << 'D' << s.head_dim << (s.causal ? "_causal" : "_full");
  return os.str();
}

// The first element of `got` farther from `want` than atol + rtol*|want| (or not finite), as
// "b= s= h= d=" for O [B, S, H, D] or "b= h= s=" for lse [B, H, S]; "" when none.
template <typename W>
std::string first_off(const std::vector<float>& got, const std::vector<W>& want, const AttentionShape& sh, bool is_lse,
                      double atol, double rtol) {
  std::size_t bad = 0, first = got.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = static_cast<double>(want[i]);
    if (!std::isfinite(g) || std::fabs(g - w) > atol + rtol * std::fabs(w)) {
      if (first == got.size()) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  std::ostringstream os;
  const std::size_t i = first, S = sh.seq, H = sh.heads, D = sh.head_dim;
  if (is_lse)
    os << "lse b=" << i / (H * S) << " h=" << (i / S) % H << " s=" << i % S;
  else
    os << "O b=" << i / (S * H * D) << " s=" << (i / (H * D)) % S << " h=" << (i / D) % H << " d=" << i % D;
  os << ": got " << got[i] << ", want " << static_cast<double>(want[i]) << " (" << bad << " of " << got.size()
     << " elements off)";
  return os.str();
}

// Which part of the kernel a mismatch points at: lse depends only on S = Q K^T (TMA, the Q and K
// descriptors, the mask, the softmax), O also on P V (P's register fragments, V's transposed
// descriptor, whose LBO only d128 uses).
std::string suspect(bool o_ok, bool lse_ok, int head_dim) {
  if (o_ok && lse_ok) return "";
  if (lse_ok)
    return head_dim == 128 ? " [lse right, O wrong: suspect P V, e.g. V's MN-major descriptor (LBO: d128 only)]"
                           : " [lse right, O wrong: suspect P V (P's fragments, V's MN-major descriptor)]";
  return head_dim == 128 ? " [lse wrong: suspect S = Q K^T (TMA boxes, Q/K descriptors; d128: the second column block)]"
                         : " [lse wrong: suspect S = Q K^T (TMA boxes, Q/K descriptors), the mask or the softmax]";
}

double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return v.empty() ? 0.0 : std::sqrt(s / v.size());
}

struct Inputs {
  std::vector<float> qkv_f;  // bf16-rounded inputs as floats
  test::DeviceArray<bf16> qkv;
};

// Fresh N(0,1) inputs; q and k x8 when `large`: logits with std ~64, so the running max jumps
// between tiles.
Inputs make_inputs(const AttentionShape& sh, bool large, std::mt19937_64& rng) {
  const std::size_t row = 3ull * sh.heads * sh.head_dim, tokens = static_cast<std::size_t>(sh.batch) * sh.seq;
  auto qkv_f = test::random_normal(tokens * row, rng);
  if (large)
    for (std::size_t t = 0; t < tokens; ++t)
      for (std::size_t e = 0; e < 2ull * sh.heads * sh.head_dim; ++e) qkv_f[t * row + e] *= 8.f;
  qkv_f = test::round_bf16(qkv_f);
  test::DeviceArray<bf16> qkv(test::to_bf16(qkv_f));
  return Inputs{std::move(qkv_f), std::move(qkv)};
}
Inputs make_inputs(const AttentionShape& sh, bool large) {
  auto rng = test::fresh_rng();
  return make_inputs(sh, large, rng);
}

struct Outputs {
  std::vector<float> out, lse;
};

// The Hopper forward with query tile `tile` on poisoned outputs; nothing may be left unwritten (the
// first NaN is named).
Outputs run_hopper(const AttentionShape& sh, const Inputs& in, hopper::FwdTile tile) {
  const std::size_t tokens = static_cast<std::size_t>(sh.batch) * sh.seq;
  test::DeviceArray<bf16> out(tokens * sh.heads * sh.head_dim);
  test::DeviceArray<float> lse(tokens * sh.heads);
  hopper::attention_forward(nullptr, in.qkv.get(), out.get(), lse.get(), sh, {}, tile);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  Outputs r{test::download_float(out), lse.download()};
  const std::vector<double> zeros_o(r.out.size(), 0.0), zeros_l(r.lse.size(), 0.0);
  // Any NaN left is poison the kernel never overwrote (or a NaN it produced).
  EXPECT_EQ(test::count_nan(r.out), 0u) << first_off(r.out, zeros_o, sh, false, INFINITY, 0);
  EXPECT_EQ(test::count_nan(r.lse), 0u) << first_off(r.lse, zeros_l, sh, true, INFINITY, 0);
  return r;
}

// (seq, head_dim, causal, large logits); batch 2, heads 3.
using Param = std::tuple<int, int, bool, bool>;

class AttentionHopperGpu : public ::testing::TestWithParam<Param> {};

TEST_P(AttentionHopperGpu, MatchesCpuReference) {
  CUTRAIN_REQUIRE_GPU();
  const auto [seq, dim, causal, large] = GetParam();
  const AttentionShape sh{2, seq, 3, dim, causal};
  const Inputs in = make_inputs(sh, large);
  std::vector<double> out_r, lse_r;
  ref::attention_forward(in.qkv_f, sh, out_r, lse_r);
  for (const hopper::FwdTile tile : test::hopper_schedules::kFwdTiles) {
    SCOPED_TRACE(shape_name(sh) + (large ? " large logits " : " ") + schedule_name(tile));
    const Outputs r = run_hopper(sh, in, tile);
    const double err_o = test::rel_error(r.out, out_r), err_l = test::rel_error(r.lse, lse_r);
    const std::string why = suspect(err_o <= 1e-2, err_l <= 1e-4, dim);
    EXPECT_LE(err_o, 1e-2) << "O vs CPU; first element off: "
                           << first_off(r.out, out_r, sh, false, 0.05 * rms(out_r), 0.02) << why;
    EXPECT_LE(err_l, 1e-4) << "lse vs CPU; first element off: " << first_off(r.lse, lse_r, sh, true, 1e-3, 1e-3)
                           << why;
  }
}

INSTANTIATE_TEST_SUITE_P(OddShapes, AttentionHopperGpu,
                         ::testing::Combine(::testing::Values(1, 7, 96, 129, 200, 385), ::testing::Values(64, 128),
                                            ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           std::ostringstream os;
                           os << 'S' << std::get<0>(i.param) << 'D' << std::get<1>(i.param)
                              << (std::get<2>(i.param) ? "_causal" : "_full") << (std::get<3>(i.param) ? "_large" : "");
                           return os.str();
                         });

// Long sequences (many K/V tiles, every ring stage reused): the naive GPU reference and the
// production entry point (its schedule per shape) on the same inputs.
using LongParam = std::tuple<int, int, bool>;  // (seq, head_dim, causal); batch 2, heads 4

class AttentionHopperLongGpu : public ::testing::TestWithParam<LongParam> {};

TEST_P(AttentionHopperLongGpu, MatchesNaiveAndProduction) {
  CUTRAIN_REQUIRE_GPU();
  const auto [seq, dim, causal] = GetParam();
  const AttentionShape sh{2, seq, 4, dim, causal};
  const Inputs in = make_inputs(sh, false);
  const std::size_t n_o = std::size_t(sh.batch) * seq * sh.heads * dim, n_l = std::size_t(sh.batch) * sh.heads * seq;
  test::NaiveAttention naive(sh);
  test::DeviceArray<float> out_n(n_o), lse_n(n_l);
  naive.forward(in.qkv.get(), out_n.get(), lse_n.get());
  const auto out_nh = out_n.download(), lse_nh = lse_n.download();
  const std::vector<double> out_nd(out_nh.begin(), out_nh.end());
  test::DeviceArray<bf16> out_p(n_o);
  test::DeviceArray<float> lse_p(n_l);
  kernels::attention_forward(nullptr, in.qkv.get(), out_p.get(), lse_p.get(), sh);
  const auto out_ph = test::download_float(out_p), lse_ph = lse_p.download();

  for (const hopper::FwdTile tile : test::hopper_schedules::kFwdTiles) {
    SCOPED_TRACE(shape_name(sh) + " " + schedule_name(tile));
    const Outputs r = run_hopper(sh, in, tile);
    const double err_o = test::rel_error(r.out, out_nh), err_l = test::rel_error(r.lse, lse_nh);
    const std::string why = suspect(err_o <= 1e-2, err_l <= 1e-4, dim);
    EXPECT_LE(err_o, 1e-2) << "O vs naive; first element off: "
                           << first_off(r.out, out_nh, sh, false, 0.05 * rms(out_nd), 0.02) << why;
    EXPECT_LE(err_l, 1e-4) << "lse vs naive; first element off: " << first_off(r.lse, lse_nh, sh, true, 1e-3, 1e-3)
                           << why;
    EXPECT_LE(test::rel_error(r.out, out_ph), 1e-2) << "O vs production";
    EXPECT_LE(test::rel_error(r.lse, lse_ph), 1e-4) << "lse vs production";
  }
}

INSTANTIATE_TEST_SUITE_P(LongShapes, AttentionHopperLongGpu,
                         ::testing::Combine(::testing::Values(1000, 2049), ::testing::Values(64, 128), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<LongParam>& i) {
                           std::ostringstream os;
                           os << 'S' << std::get<0>(i.param) << 'D' << std::get<1>(i.param)
                              << (std::get<2>(i.param) ? "_causal" : "_full");
                           return os.str();
                         });

// ---- backward ----

// The first element of one slot of dqkv (w: 0 dQ, 1 dK, 2 dV; [B, S, H, D]) farther from `want`
// than atol + rtol*|want| (or not finite), as "dK b= s= h= d=: got, want"; "" when none.
template <typename W>
std::string first_grad_off(const std::vector<float>& got, const std::vector<W>& want, const AttentionShape& sh, int w,
                           double atol, double rtol) {
  static const char* names[3] = {"dQ", "dK", "dV"};
  std::size_t bad = 0, first = got.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], x = static_cast<double>(want[i]);
    if (!std::isfinite(g) || std::fabs(g - x) > atol + rtol * std::fabs(x)) {
      if (first == got.size()) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  std::ostringstream os;
  const std::size_t i = first, S = sh.seq, H = sh.heads, D = sh.head_dim;
  os << names[w] << " b=" << i / (S * H * D) << " s=" << (i / (H * D)) % S << " h=" << (i / D) % H << " d=" << i % D
     << ": got " << got[i] << ", want " << static_cast<double>(want[i]) << " (" << bad << " of " << got.size()
     << " elements off)";
  return os.str();
}

// Which part of the backward a mismatch points at. dV = P^T dO needs only S^T (K, Q), the mask and
// P; dK also dP^T = V dO^T and dS; dQ also the dS^T round trip through shared memory, dQ's
// transposed operands (dS^T, K) and the atomics.
std::string bwd_suspect(bool dq_ok, bool dk_ok, bool dv_ok) {
  if (dq_ok && dk_ok && dv_ok) return "";
  if (!dv_ok) return " [dV wrong: suspect S^T = K Q^T, the mask, P^T (lse), or dV's MN-major dO descriptor]";
  if (!dk_ok) return " [dV right, dK wrong: suspect dP^T = V dO^T, Dvec, dS^T, or dK's MN-major Q descriptor]";
  return " [dV, dK right, dQ wrong: suspect the dS^T store (swizzle), dQ's MN-major dS^T / K descriptors, the atomics]";
}

struct BwdCase {
  Inputs in;
  std::vector<float> dout_f, out_h;  // bf16-rounded dO; the production forward's O as floats
  test::DeviceArray<bf16> dout, out;
  test::DeviceArray<float> lse;
};

// Fresh inputs and dO, and the production forward's O and lse (the backward's inputs).
BwdCase make_bwd_case(const AttentionShape& sh, bool large) {
  auto rng = test::fresh_rng();
  Inputs in = make_inputs(sh, large, rng);
  const std::size_t n_o = static_cast<std::size_t>(sh.batch) * sh.seq * sh.heads * sh.head_dim;
  auto dout_f = test::round_bf16(test::random_normal(n_o, rng));
  test::DeviceArray<bf16> dout(test::to_bf16(dout_f)), out(n_o);
  test::DeviceArray<float> lse(static_cast<std::size_t>(sh.batch) * sh.heads * sh.seq);
  kernels::attention_forward(nullptr, in.qkv.get(), out.get(), lse.get(), sh);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  auto out_h = test::download_float(out);
  return BwdCase{std::move(in), std::move(dout_f), std::move(out_h), std::move(dout), std::move(out), std::move(lse)};
}

const auto& kBwdSchedules = test::hopper_schedules::kBackward;
const auto& kDqSchedules = test::hopper_schedules::kDq;

// The sm90 backward on a poisoned dqkv (nothing may be left unwritten) with `scratch`.
std::vector<float> run_hopper_bwd(const AttentionShape& sh, const BwdCase& c, test::DeviceArray<float>& scratch,
                                  hopper::BackwardSchedule schedule, bool deterministic = false,
                                  hopper::DqSchedule dq_schedule = hopper::DqSchedule::Serial) {
  test::DeviceArray<bf16> dqkv(3ull * sh.batch * sh.seq * sh.heads * sh.head_dim);
  hopper::attention_backward(nullptr, c.in.qkv.get(), c.out.get(), c.dout.get(), c.lse.get(), dqkv.get(),
                             scratch.get(), sh, schedule, {}, deterministic, dq_schedule);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  auto r = test::download_float(dqkv);
  const std::vector<double> zeros(r.size() / 3, 0.0);
  for (int w = 0; w < 3; ++w) {
    const auto slot = test::attention_slot(r, sh, w);
    EXPECT_EQ(test::count_nan(slot), 0u) << "poison survived or NaN produced: "
                                         << first_grad_off(slot, zeros, sh, w, INFINITY, 0);
  }
  return r;
}

test::DeviceArray<float> bwd_scratch(const AttentionShape& sh) {
  return test::DeviceArray<float>((kernels::attention_backward_scratch_bytes(sh, false) + 3) / 4);
}

// dQ, dK, dV of `got` against `want` by the production backward test's measure (relative, floored
// at 5% of ||dV||), bound 1e-2; names the first element off and the suspect product.
template <typename W>
void expect_grads(const std::vector<float>& got, const std::vector<W>& want, const AttentionShape& sh,
                  const char* against) {
  static const char* names[3] = {"dQ", "dK", "dV"};
  const auto dv_ref = test::attention_slot(want, sh, 2);
  std::vector<double> dv_d(dv_ref.begin(), dv_ref.end());
  bool ok[3];
  double err[3];
  for (int w = 0; w < 3; ++w) {
    err[w] = test::attention_grad_error(test::attention_slot(got, sh, w), test::attention_slot(want, sh, w), dv_ref);
    ok[w] = err[w] <= 1e-2;
  }
  const std::string why = bwd_suspect(ok[0], ok[1], ok[2]);
  for (int w = 0; w < 3; ++w)
    EXPECT_LE(err[w], 1e-2) << names[w] << " vs " << against << "; first element off: "
                            << first_grad_off(test::attention_slot(got, sh, w), test::attention_slot(want, sh, w), sh,
                                              w, 0.05 * rms(dv_d), 0.02)
                            << why;
}

// (seq, head_dim, causal, large logits); batch 3, heads 3.
class AttentionHopperBwdGpu : public ::testing::TestWithParam<Param> {};

TEST_P(AttentionHopperBwdGpu, MatchesCpuReference) {
  CUTRAIN_REQUIRE_GPU();
  const auto [seq, dim, causal, large] = GetParam();
  const AttentionShape sh{3, seq, 3, dim, causal};
  SCOPED_TRACE(shape_name(sh) + (large ? " large logits" : ""));
  const BwdCase c = make_bwd_case(sh, large);
  std::vector<double> dqkv_r;
  ref::attention_backward(c.in.qkv_f, c.out_h, c.dout_f, sh, dqkv_r);
  auto scratch = bwd_scratch(sh);
  // Each schedule; the later ones run on the first's dirty scratch (the launcher clears its dQ
  // accumulator). Then the deterministic mode (the dQ pass after the dK/dV pass) with each dQ
  // schedule: right, and the same bits twice.
  for (const hopper::BackwardSchedule schedule : kBwdSchedules) {
    SCOPED_TRACE(std::string(schedule_name(schedule)) + " schedule");
    expect_grads(run_hopper_bwd(sh, c, scratch, schedule), dqkv_r, sh, "CPU");
    for (const hopper::DqSchedule dq_schedule : kDqSchedules) {
      SCOPED_TRACE(std::string("deterministic, ") + schedule_name(dq_schedule));
      const auto det = run_hopper_bwd(sh, c, scratch, schedule, true, dq_schedule);
      expect_grads(det, dqkv_r, sh, "CPU");
      const auto again = run_hopper_bwd(sh, c, scratch, schedule, true, dq_schedule);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < det.size(); ++i) differ += std::memcmp(&det[i], &again[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << "the deterministic mode gave other bits on a second run";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OddShapes, AttentionHopperBwdGpu,
                         ::testing::Combine(::testing::Values(1, 7, 96, 129, 200, 385), ::testing::Values(64, 128),
                                            ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           std::ostringstream os;
                           os << 'S' << std::get<0>(i.param) << 'D' << std::get<1>(i.param)
                              << (std::get<2>(i.param) ? "_causal" : "_full") << (std::get<3>(i.param) ? "_large" : "");
                           return os.str();
                         });

// Long sequences (many query tiles per CTA, every ring stage reused, several key blocks): the
// naive GPU reference and the production backward's deterministic mode (dQ from the dQ pass, not
// the atomics: an independent dQ) on the same inputs.
class AttentionHopperBwdLongGpu : public ::testing::TestWithParam<LongParam> {};

TEST_P(AttentionHopperBwdLongGpu, MatchesNaiveAndProduction) {
  CUTRAIN_REQUIRE_GPU();
  const auto [seq, dim, causal] = GetParam();
  const AttentionShape sh{2, seq, 4, dim, causal};
  SCOPED_TRACE(shape_name(sh));
  const BwdCase c = make_bwd_case(sh, false);
  const std::size_t n_qkv = 3ull * sh.batch * seq * sh.heads * dim, n_o = n_qkv / 3;
  const std::size_t n_l = static_cast<std::size_t>(sh.batch) * sh.heads * seq;
  test::NaiveAttention naive(sh);
  test::DeviceArray<float> out_n(n_o), lse_n(n_l), dqkv_n(n_qkv);
  naive.forward(c.in.qkv.get(), out_n.get(), lse_n.get());  // keeps P for backward()
  naive.backward(c.in.qkv.get(), c.out.get(), c.dout.get(), dqkv_n.get());
  const auto dqkv_nh = dqkv_n.download();
  auto scratch = bwd_scratch(sh);
  test::DeviceArray<bf16> dqkv_p(n_qkv);
  kernels::attention_backward(nullptr, c.in.qkv.get(), c.out.get(), c.dout.get(), c.lse.get(), dqkv_p.get(),
                              scratch.get(), sh, true);
  const auto dqkv_ph = test::download_float(dqkv_p);

  static const char* names[3] = {"dQ", "dK", "dV"};
  const auto dv_p = test::attention_slot(dqkv_ph, sh, 2);
  // Each schedule in the fast mode, then in the deterministic mode with the overlap dQ pass (the
  // production one above runs the serial dQ pass): many query tiles per CTA reuse every ring stage.
  for (const hopper::BackwardSchedule schedule : kBwdSchedules)
    for (const bool det : {false, true}) {
      SCOPED_TRACE(std::string(schedule_name(schedule)) + " schedule" + (det ? ", deterministic, dq overlap" : ""));
      const auto got = run_hopper_bwd(sh, c, scratch, schedule, det, hopper::DqSchedule::Overlap);
      expect_grads(got, dqkv_nh, sh, "naive");
      // Both within 1e-2 of the naive reference: within 2e-2 of each other.
      for (int w = 0; w < 3; ++w)
        EXPECT_LE(
            test::attention_grad_error(test::attention_slot(got, sh, w), test::attention_slot(dqkv_ph, sh, w), dv_p),
            2e-2)
            << names[w] << " vs production (deterministic)";
    }
}

INSTANTIATE_TEST_SUITE_P(LongShapes, AttentionHopperBwdLongGpu,
                         ::testing::Combine(::testing::Values(1000, 2049), ::testing::Values(64, 128), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<LongParam>& i) {
                           std::ostringstream os;
                           os << 'S' << std::get<0>(i.param) << 'D' << std::get<1>(i.param)
                              << (std::get<2>(i.param) ? "_causal" : "_full");
                           return os.str();
                         });

// ---- fp16 ----

// The fp16 instances (wgmma's .f16 inputs, fp16 tensor maps, P and dS as fp16) with every schedule
// of each kernel and both backward modes, against the fp64 CPU reference on fp16-rounded inputs:
// O within 3e-3 and the gradients within 5e-3 (fp16's 11 significant bits; the production fp16
// test's bounds), lse within 1e-4. Batch 2, heads 3; odd S.
class AttentionHopperFp16Gpu : public ::testing::TestWithParam<LongParam> {};

TEST_P(AttentionHopperFp16Gpu, EverySchedule) {
  CUTRAIN_REQUIRE_GPU();
  const auto [seq, dim, causal] = GetParam();
  const AttentionShape sh{2, seq, 3, dim, causal};
  SCOPED_TRACE(shape_name(sh) + " fp16");
  auto rng = test::fresh_rng();
  const std::size_t n_qkv = 3ull * sh.batch * seq * sh.heads * dim, n_o = n_qkv / 3;
  const std::size_t n_l = static_cast<std::size_t>(sh.batch) * sh.heads * seq;
  const auto qkv_f = test::round_f16(test::random_normal(n_qkv, rng));
  const auto dout_f = test::round_f16(test::random_normal(n_o, rng));
  test::DeviceArray<f16> qkv(test::to_f16(qkv_f)), dout(test::to_f16(dout_f)), out(n_o);
  test::DeviceArray<float> lse(n_l);
  std::vector<double> out_r, lse_r;
  ref::attention_forward(qkv_f, sh, out_r, lse_r);
  std::vector<float> out_h;
  for (const hopper::FwdTile tile : test::hopper_schedules::kFwdTiles) {
    SCOPED_TRACE(schedule_name(tile));
    out.poison();
    lse.poison();
    hopper::attention_forward(nullptr, qkv.get(), out.get(), lse.get(), sh, {}, tile);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    out_h = test::download_float(out);
    const auto lse_h = lse.download();
    ASSERT_EQ(test::count_nan(out_h), 0u) << "O left unwritten";
    ASSERT_EQ(test::count_nan(lse_h), 0u) << "lse left unwritten";
    EXPECT_LE(test::rel_error(out_h, out_r), 3e-3) << "O vs CPU";
    EXPECT_LE(test::rel_error(lse_h, lse_r), 1e-4) << "lse vs CPU";
  }
  // The backward from the last forward's O and lse (the reference from that O).
  std::vector<double> dqkv_r;
  ref::attention_backward(qkv_f, out_h, dout_f, sh, dqkv_r);
  const auto dv_r = test::attention_slot(dqkv_r, sh, 2);
  test::DeviceArray<float> scratch((kernels::attention_backward_scratch_bytes(sh, false) + 3) / 4);
  static const char* names[3] = {"dQ", "dK", "dV"};
  for (const hopper::BackwardSchedule schedule : kBwdSchedules)
    for (const int mode : {0, 1, 2}) {  // fast; deterministic with the serial, the overlap dQ pass
      const bool det = mode > 0;
      const hopper::DqSchedule dq_schedule = mode == 2 ? hopper::DqSchedule::Overlap : hopper::DqSchedule::Serial;
      SCOPED_TRACE(std::string(schedule_name(schedule)) +
                   (det ? std::string(" deterministic, ") + schedule_name(dq_schedule) : std::string(" fast")));
      test::DeviceArray<f16> dqkv(n_qkv);
      hopper::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), dqkv.get(), scratch.get(), sh,
                                 schedule, {}, det, dq_schedule);
      CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
      const auto g = test::download_float(dqkv);
      ASSERT_EQ(test::count_nan(g), 0u) << "dqkv left unwritten";
      for (int w = 0; w < 3; ++w)
        EXPECT_LE(test::attention_grad_error(test::attention_slot(g, sh, w), test::attention_slot(dqkv_r, sh, w), dv_r),
                  5e-3)
            << names[w] << " vs CPU";
    }
}

INSTANTIATE_TEST_SUITE_P(OddShapes, AttentionHopperFp16Gpu,
                         ::testing::Combine(::testing::Values(7, 129, 385), ::testing::Values(64, 128), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<LongParam>& i) {
                           std::ostringstream os;
                           os << 'S' << std::get<0>(i.param) << 'D' << std::get<1>(i.param)
                              << (std::get<2>(i.param) ? "_causal" : "_full");
                           return os.str();
                         });

}  // namespace
