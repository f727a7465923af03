// @brief GPU tests of adam_step against the fp64 reference for every layout, gradient type, Adam/AdamW,
// round-to-nearest and stochastic rounding; odd sizes, misaligned views (scalar path), skip and
// device scale, the round-to-nearest stall vs stochastic drift, SR statistics and seeding, n > 2^31;
// the compensated bf16 master (Kahan) against the reference, and its far smaller drift from an fp32
// master than the plain bf16 master's.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "kernels/adamw.cuh"
#include "kernels/reduce.cuh"
#include "tests/reference/adamw_ref.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

using kernels::AdamParams;
using kernels::OptimizerLayout;

using test::DeviceArray;

const char* name_of(OptimizerLayout l) {
  switch (l) {
    case OptimizerLayout::Baseline: return "Baseline";
    case OptimizerLayout::Bf16MasterWG: return "Bf16MasterWG";
    case OptimizerLayout::Bf16Full: return "Bf16Full";
  }
  return "?";
}

// Every element within one bf16 ulp, and almost all exact; where an update cancels, within
// test::bf16_cancellation_floor.
void expect_bf16_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  const double floor = test::bf16_cancellation_floor(want);
  std::size_t off = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << "[" << i << "] not written";
    const int d = test::bf16_ulps(got[i], want[i]);
    if (d > 1) {
      ASSERT_LE(std::abs(double(got[i]) - want[i]), floor)
          << what << "[" << i << "]: got " << got[i] << " want " << want[i] << " (" << d << " ulps)";
    }
    off += d != 0;
  }
  EXPECT_LE(off, got.size() / 100 + 2) << what << ": too many one-ulp differences";
}

// The whole optimizer state on the host (floats) and on the device (in the layout's types).
struct State {
  OptimizerLayout layout;
  DType gt;
  std::size_t n, off;  // off: elements of misalignment of every device view
  bool compensated;    // a bf16 compensation buffer beside the bf16 master
  std::vector<float> params, master, m, v, comp;
  DeviceArray<bf16> d_params, d_m16, d_v16, d_g16, d_comp;
  DeviceArray<float> d_master, d_m32, d_v32, d_g32;

  State(OptimizerLayout l, DType g, std::size_t n_, std::size_t off_ = 0, bool comp_ = false)
      : layout(l), gt(g), n(n_), off(off_), compensated(comp_) {
    d_params = DeviceArray<bf16>(n + off);
    if (compensated) d_comp = DeviceArray<bf16>(n + off);
    if (gt == DType::BF16) d_g16 = DeviceArray<bf16>(n + off);
    else d_g32 = DeviceArray<float>(n + off);
    if (l == OptimizerLayout::Baseline) d_master = DeviceArray<float>(n + off);
    if (l == OptimizerLayout::Bf16Full) {
      d_m16 = DeviceArray<bf16>(n + off);
      d_v16 = DeviceArray<bf16>(n + off);
    } else {
      d_m32 = DeviceArray<float>(n + off);
      d_v32 = DeviceArray<float>(n + off);
    }
  }
  bool full() const { return layout == OptimizerLayout::Bf16Full; }

  void randomize(std::mt19937_64& rng) {
    master = test::random_normal(n, rng, 0.f, 1.f);
    params = test::round_bf16(master);
    if (layout != OptimizerLayout::Baseline) master.assign(n, 0.f);
    m = test::random_normal(n, rng, 0.f, 1e-2f);
    v = test::random_uniform(n, rng, 0.f, 1e-4f);
    if (full()) {
      m = test::round_bf16(m);
      v = test::round_bf16(v);
    }
    // A compensation as the kernel leaves it: bf16, within half an ulp of its weight.
    comp.assign(n, 0.f);
    if (compensated) {
      const auto u = test::random_uniform(n, rng, -0.5f, 0.5f);
      for (std::size_t i = 0; i < n; ++i)
        comp[i] = params[i] == 0.f ? 0.f : round_bf16(std::ldexp(u[i], std::ilogb(params[i]) - 7));
    }
  }

  template <typename T>
  static void put(DeviceArray<T>& d, std::size_t off, const std::vector<float>& h) {
    std::vector<T> t(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) {
      if constexpr (std::is_same_v<T, bf16>) t[i] = cutrain::to_bf16(h[i]);
      else t[i] = h[i];
    }
    CUTRAIN_CUDA_CHECK(cudaMemcpy(d.get() + off, t.data(), t.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <typename T>
  static std::vector<float> get(const DeviceArray<T>& d, std::size_t off, std::size_t n) {
    std::vector<T> t(n);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    CUTRAIN_CUDA_CHECK(cudaMemcpy(t.data(), d.get() + off, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> h(n);
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, bf16>) h[i] = cutrain::to_float(t[i]);
      else h[i] = t[i];
    }
    return h;
  }

  void upload() {
    put(d_params, off, params);
    if (compensated) put(d_comp, off, comp);
    if (layout == OptimizerLayout::Baseline) put(d_master, off, master);
    if (full()) {
      put(d_m16, off, m);
      put(d_v16, off, v);
    } else {
      put(d_m32, off, m);
      put(d_v32, off, v);
    }
  }
  void upload_grads(const std::vector<float>& g) {
    if (gt == DType::BF16) put(d_g16, off, g);
    else put(d_g32, off, g);
  }
  void download(std::vector<float>& p, std::vector<float>& mas, std::vector<float>& mm, std::vector<float>& vv) const {
    p = get(d_params, off, n);
    if (layout == OptimizerLayout::Baseline) mas = get(d_master, off, n);
    else mas.assign(n, 0.f);
    mm = full() ? get(d_m16, off, n) : get(d_m32, off, n);
    vv = full() ? get(d_v16, off, n) : get(d_v32, off, n);
  }
  std::vector<float> download_comp() const { return get(d_comp, off, n); }
  void step(const AdamParams& p, const float* device_scale = nullptr, const int* skip = nullptr) {
    const void* g = gt == DType::BF16 ? static_cast<const void*>(d_g16.get() + off) : d_g32.get() + off;
    void* mm = full() ? static_cast<void*>(d_m16.get() + off) : d_m32.get() + off;
    void* vv = full() ? static_cast<void*>(d_v16.get() + off) : d_v32.get() + off;
    kernels::adam_step(nullptr, layout, p, d_params.get() + off, g, gt,
                       layout == OptimizerLayout::Baseline ? d_master.get() + off : nullptr, mm, vv, n, device_scale,
                       skip, compensated ? d_comp.get() + off : nullptr);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

std::vector<float> make_grads(std::size_t n, DType gt, std::mt19937_64& rng, float stddev = 1e-2f) {
  auto g = test::random_normal(n, rng, 0.f, stddev);
  return gt == DType::BF16 ? test::round_bf16(g) : g;
}

// Three steps; after each, the device state is compared with the reference applied to the
// previous device state (so rounding differences do not compound).
void check_steps(OptimizerLayout layout, DType gt, bool decoupled, bool sr, std::size_t n, std::size_t off,
                 bool comp = false) {
  SCOPED_TRACE(std::string(name_of(layout)) + " grads=" + dtype_name(gt) + " decoupled=" + std::to_string(decoupled) +
               " sr=" + std::to_string(sr) + " n=" + std::to_string(n) + " off=" + std::to_string(off) +
               " compensated=" + std::to_string(comp));
  auto rng = test::fresh_rng();
  State st(layout, gt, n, off, comp);
  st.randomize(rng);
  st.upload();
  AdamParams p;
  p.lr = 1e-3f;
  p.beta1 = 0.9f;
  p.beta2 = 0.95f;
  p.eps = 1e-8f;
  p.weight_decay = 0.05f;
  p.decoupled = decoupled;
  p.grad_scale = 0.5f;
  p.stochastic_rounding = sr;
  p.seed = rng();
  std::vector<float> rp = st.params, rmas = st.master, rm = st.m, rv = st.v, rc = st.comp;
  for (int step = 1; step <= 3; ++step) {
    p.step = step + 10 * (step == 3);  // also a later step (bias correction near 1)
    auto g = make_grads(n, gt, rng);
    st.upload_grads(g);
    st.step(p);
    ref::adam_step(layout, p, p.grad_scale, rp, g, rmas, rm, rv, comp ? &rc : nullptr);
    std::vector<float> gp, gmas, gm, gv, gc;
    st.download(gp, gmas, gm, gv);
    expect_bf16_close(gp, rp, "params");
    if (comp) {
      // The weight is w + c: where the kernel's fp32 x and the reference's differ across a
      // rounding boundary, w moves one ulp and c the other way, so the sum is what must agree:
      // within 2^-7 of an ulp of w (c itself is rounded to bf16: 2^-9 of its half ulp).
      gc = st.download_comp();
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_FALSE(std::isnan(gc[i])) << "compensation[" << i << "] not written";
        const double want = double(rp[i]) + rc[i], got = double(gp[i]) + gc[i];
        const double tol = (rp[i] == 0.f ? 0.0 : std::ldexp(1.0, std::ilogb(rp[i]) - 7 - 7)) + 1e-8;
        ASSERT_LE(std::abs(got - want), tol) << "w + c at " << i << ": got " << gp[i] << " + " << gc[i] << ", want "
                                             << rp[i] << " + " << rc[i];
        ASSERT_LE(std::abs(double(gc[i])), rp[i] == 0.f ? 1e-8 : std::ldexp(1.0, std::ilogb(gp[i]) - 7))
            << "compensation[" << i << "] larger than an ulp of its weight";
      }
    }
    if (layout == OptimizerLayout::Baseline) {
      EXPECT_LE(test::rel_error(gmas, rmas), 1e-5) << "master, step " << step;
    }
    if (st.full()) {
      expect_bf16_close(gm, rm, "m (bf16)");
      expect_bf16_close(gv, rv, "v (bf16)");
    } else {
      EXPECT_EQ(test::count_nan(gm) + test::count_nan(gv), 0u);
      EXPECT_LE(test::rel_error(gm, rm), 1e-5) << "m, step " << step;
      EXPECT_LE(test::rel_error(gv, rv), 1e-5) << "v, step " << step;
    }
    if (::testing::Test::HasFatalFailure()) return;
    rp = gp, rmas = gmas, rm = gm, rv = gv, rc = gc;  // continue from the device state
  }
}

using AdamCase = std::tuple<OptimizerLayout, DType, bool, bool>;
class AdamGpu : public ::testing::TestWithParam<AdamCase> {};

TEST_P(AdamGpu, MatchesReferenceOddSize) {
  CUTRAIN_REQUIRE_GPU();
  auto [layout, gt, decoupled, sr] = GetParam();
  check_steps(layout, gt, decoupled, sr, 1000003, 0);
}

TEST_P(AdamGpu, MatchesReferenceTinyAndMisaligned) {
  CUTRAIN_REQUIRE_GPU();
  auto [layout, gt, decoupled, sr] = GetParam();
  // Around the warp tile (256 elements) and its tail too.
  for (std::size_t n : {1, 7, 9, 255, 256, 257, 4099}) check_steps(layout, gt, decoupled, sr, n, 0);
  check_steps(layout, gt, decoupled, sr, 100003, 1);  // views off 16-byte alignment: scalar path
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, AdamGpu,
    ::testing::Combine(::testing::Values(OptimizerLayout::Baseline, OptimizerLayout::Bf16MasterWG,
                                         OptimizerLayout::Bf16Full),
                       ::testing::Values(DType::BF16, DType::F32), ::testing::Bool(), ::testing::Bool()),
    [](const ::testing::TestParamInfo<AdamCase>& i) {
      return std::string(name_of(std::get<0>(i.param))) + "_" + dtype_name(std::get<1>(i.param)) +
             (std::get<2>(i.param) ? "_AdamW" : "_AdamL2") + (std::get<3>(i.param) ? "_SR" : "_RNE");
    });

// The compensated bf16 master: both bf16-master layouts, both gradient types, AdamW and Adam-L2,
// nearest and stochastic rounding of w, odd, tiny and misaligned sizes.
using CompCase = std::tuple<OptimizerLayout, DType, bool, bool>;
class AdamGpuCompensated : public ::testing::TestWithParam<CompCase> {};

TEST_P(AdamGpuCompensated, MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto [layout, gt, decoupled, sr] = GetParam();
  check_steps(layout, gt, decoupled, sr, 1000003, 0, true);
  for (std::size_t n : {1, 7, 255, 257, 4099}) check_steps(layout, gt, decoupled, sr, n, 0, true);
  check_steps(layout, gt, decoupled, sr, 100003, 1, true);  // scalar path
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, AdamGpuCompensated,
    ::testing::Combine(::testing::Values(OptimizerLayout::Bf16MasterWG, OptimizerLayout::Bf16Full),
                       ::testing::Values(DType::BF16, DType::F32), ::testing::Bool(), ::testing::Bool()),
    [](const ::testing::TestParamInfo<CompCase>& i) {
      return std::string(name_of(std::get<0>(i.param))) + "_" + dtype_name(std::get<1>(i.param)) +
             (std::get<2>(i.param) ? "_AdamW" : "_AdamL2") + (std::get<3>(i.param) ? "_SR" : "_RNE");
    });

// 1000 steps of drifting random gradients on the device: the compensated bf16 master stays within
// one bf16 ulp of an fp32 master run on the same gradients (Baseline layout), the plain bf16
// master does not (its updates below half an ulp are lost).
TEST(AdamGpuCompensated, StaysWithinAnUlpOfAnFp32MasterOver1000Steps) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::size_t n = 100003;
  const int steps = 1000;
  State fp32(OptimizerLayout::Baseline, DType::F32, n), comp(OptimizerLayout::Bf16MasterWG, DType::F32, n, 0, true),
      plain(OptimizerLayout::Bf16MasterWG, DType::F32, n);
  auto w0 = test::random_uniform(n, rng, 0.5f, 2.f);
  const auto sign = test::random_uniform(n, rng, -1.f, 1.f);
  for (std::size_t i = 0; i < n; ++i) w0[i] = round_bf16(sign[i] < 0 ? -w0[i] : w0[i]);
  for (State* s : {&fp32, &comp, &plain}) {
    s->params = w0;
    s->master = s->layout == OptimizerLayout::Baseline ? w0 : std::vector<float>(n, 0.f);
    s->comp.assign(n, 0.f);
    s->m.assign(n, 0.f);
    s->v.assign(n, 0.f);
    s->upload();
  }
  const auto mean = test::random_normal(n, rng, 0.f, 1e-2f);
  AdamParams p;
  p.lr = 3e-4f;
  p.weight_decay = 0.01f;
  for (int step = 1; step <= steps; ++step) {
    auto g = test::random_normal(n, rng, 0.f, 1e-2f);
    for (std::size_t i = 0; i < n; ++i) g[i] += mean[i];
    p.step = step;
    for (State* s : {&fp32, &comp, &plain}) {
      s->upload_grads(g);
      s->step(p);
    }
  }
  std::vector<float> fp, fmas, fm, fv, cp, cmas, cm, cv, pp, pmas, pm, pv;
  fp32.download(fp, fmas, fm, fv);
  comp.download(cp, cmas, cm, cv);
  plain.download(pp, pmas, pm, pv);
  std::size_t comp_off = 0, plain_off = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double ulp = std::ldexp(1.0, std::ilogb(fmas[i]) - 7);
    comp_off += std::abs(double(cp[i]) - fmas[i]) > ulp;
    plain_off += std::abs(double(pp[i]) - fmas[i]) > ulp;
  }
  EXPECT_EQ(comp_off, 0u) << "compensated bf16 master: elements more than one ulp from the fp32 master";
  EXPECT_GT(plain_off, n / 2) << "the plain bf16 master should lose most of the drift (else the test cannot fail)";
}

TEST(AdamGpuControl, SkipFlagChangesNothingAndDeviceScaleMultiplies) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::size_t n = 300007;
  State st(OptimizerLayout::Baseline, DType::BF16, n);
  st.randomize(rng);
  st.upload();
  auto g = make_grads(n, DType::BF16, rng);
  st.upload_grads(g);
  AdamParams p;
  p.weight_decay = 0.01f;
  p.grad_scale = 2.f;
  DeviceArray<int> skip(std::vector<int>{1});
  DeviceArray<float> dscale(std::vector<float>{0.25f});
  st.step(p, dscale.get(), skip.get());
  std::vector<float> gp, gmas, gm, gv;
  st.download(gp, gmas, gm, gv);
  EXPECT_EQ(std::memcmp(gp.data(), st.params.data(), 4 * n), 0) << "skip=1 changed params";
  EXPECT_EQ(std::memcmp(gmas.data(), st.master.data(), 4 * n), 0) << "skip=1 changed master";
  EXPECT_EQ(std::memcmp(gm.data(), st.m.data(), 4 * n), 0);
  EXPECT_EQ(std::memcmp(gv.data(), st.v.data(), 4 * n), 0);

  skip.upload({0});
  st.step(p, dscale.get(), skip.get());
  ref::adam_step(OptimizerLayout::Baseline, p, 2.0 * 0.25, st.params, g, st.master, st.m, st.v);
  st.download(gp, gmas, gm, gv);
  expect_bf16_close(gp, st.params, "params");
  EXPECT_LE(test::rel_error(gmas, st.master), 1e-5);
  EXPECT_LE(test::rel_error(gm, st.m), 1e-5);
  EXPECT_LE(test::rel_error(gv, st.v), 1e-5);
}

// The engine's chain: grad_norm_clip's clip coefficient feeds device_scale and its nonfinite flag
// feeds skip, with no host round trip.
TEST(AdamGpuControl, ChainedWithGradNormClip) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::size_t n = 200003;
  for (bool poison_grad : {false, true}) {
    State st(OptimizerLayout::Bf16MasterWG, DType::BF16, n);
    st.randomize(rng);
    st.upload();
    auto g = make_grads(n, DType::BF16, rng);
    if (poison_grad) g[n / 2] = NAN;
    st.upload_grads(g);
    double sq = 0;
    for (float x : g) sq += double(x) * x;
    const float max_norm = static_cast<float>(std::sqrt(sq) / 4);  // NaN when poisoned: no clip, flagged
    DeviceArray<float> norm(1), clip(1);
    DeviceArray<int> bad(1);
    DeviceArray<char> scratch(kernels::grad_norm_scratch_bytes(n));
    kernels::grad_norm_clip(nullptr, st.d_g16.get(), DType::BF16, n, poison_grad ? 1.f : max_norm, norm.get(),
                            clip.get(), bad.get(), scratch.get());
    AdamParams p;
    p.weight_decay = 0.01f;
    st.step(p, clip.get(), bad.get());
    const float c = clip.download()[0];
    std::vector<float> gp, gmas, gm, gv;
    st.download(gp, gmas, gm, gv);
    if (poison_grad) {
      EXPECT_EQ(bad.download()[0], 1);
      EXPECT_EQ(std::memcmp(gp.data(), st.params.data(), 4 * n), 0) << "a NaN step must change nothing";
      EXPECT_EQ(std::memcmp(gm.data(), st.m.data(), 4 * n), 0);
      continue;
    }
    EXPECT_EQ(bad.download()[0], 0);
    EXPECT_NEAR(c, 0.25, 1e-4);
    ref::adam_step(OptimizerLayout::Bf16MasterWG, p, c, st.params, g, st.master, st.m, st.v);
    expect_bf16_close(gp, st.params, "params");
    EXPECT_LE(test::rel_error(gm, st.m), 1e-5);
    EXPECT_LE(test::rel_error(gv, st.v), 1e-5);
  }
}

// Updates far below half a bf16 ulp: round-to-nearest never moves a bf16 master, stochastic
// rounding moves it by the right amount on average.
TEST(AdamGpuStochasticRounding, NearestStallsStochasticDrifts) {
  CUTRAIN_REQUIRE_GPU();
  const std::size_t n = 1 << 20;
  const int steps = 100;
  AdamParams p;
  p.lr = 1e-4f;  // per-step change ~1e-4, bf16 half-ulp at 1.0 is 2^-9 ~ 2e-3
  p.weight_decay = 0.f;
  for (bool sr : {false, true}) {
    SCOPED_TRACE(sr ? "stochastic" : "nearest");
    State st(OptimizerLayout::Bf16MasterWG, DType::BF16, n);
      st.params.assign(n, 1.f);
    st.m.assign(n, 0.f);
    st.v.assign(n, 0.f);
    st.upload();
    st.upload_grads(std::vector<float>(n, 1e-3f));
    p.stochastic_rounding = sr;
    p.seed = 1234;
    double expect = 1.0;
    for (int s = 1; s <= steps; ++s) {
      p.step = s;
      st.step(p);
      expect -= p.lr * (1e-3 / (1e-3 + p.eps));  // m_hat / sqrt(v_hat) = 1 for a constant gradient
    }
    std::vector<float> gp, gmas, gm, gv;
    st.download(gp, gmas, gm, gv);
    double mean = 0;
    for (float x : gp) mean += x;
    mean /= n;
    if (!sr) {
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(gp[i], 1.f) << "round-to-nearest moved element " << i;
    } else {
      // Per element the accumulated rounding noise has sd <= sqrt(steps) * ulp / 2 (ulp = 2^-8 below 1).
      const double sd_mean = std::sqrt(static_cast<double>(steps)) * 0.5 * std::ldexp(1.0, -8) / std::sqrt(double(n));
      EXPECT_LT(mean, 1.0);
      EXPECT_NEAR(mean, expect, 10 * sd_mean) << "stochastic rounding drifted the wrong amount";
    }
  }
}

// One step on fp32 masters in [1, 2): each bf16 copy is one of the two neighbours of the fp32
// value, the rounding error has mean 0 within statistical bounds, the same seed gives the same bits
// and another seed different bits.
TEST(AdamGpuSr, UnbiasedAndSeeded) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::size_t n = 1 << 20;
  State st(OptimizerLayout::Baseline, DType::F32, n);
  st.master = test::random_uniform(n, rng, 1.01f, 1.99f);  // stays in [1, 2) after the step
  st.params = test::round_bf16(st.master);
  st.m.assign(n, 0.f);
  st.v.assign(n, 0.f);
  auto g = make_grads(n, DType::F32, rng);
  AdamParams p;
  p.lr = 1e-3f;
  p.stochastic_rounding = true;
  auto run = [&](std::uint64_t seed, std::vector<float>& params, std::vector<float>& master) {
    st.upload();
    st.upload_grads(g);
    p.seed = seed;
    st.step(p);
    std::vector<float> gm, gv;
    st.download(params, master, gm, gv);
  };
  std::vector<float> pa, ma, pb, mb, pc, mc;
  run(42, pa, ma);
  run(42, pb, mb);
  run(43, pc, mc);
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), 4 * n), 0) << "same seed, different bits";
  std::size_t differ = 0;
  double sum = 0, sumsq = 0, sum_par[2] = {0, 0};  // by index parity: the two halves of a pair hash
  for (std::size_t i = 0; i < n; ++i) {
    differ += pa[i] != pc[i];
    const double ulp = std::ldexp(1.0, -7);  // bf16 ulp in [1, 2)
    const double down = std::floor(ma[i] / ulp) * ulp;
    ASSERT_TRUE(pa[i] == static_cast<float>(down) || pa[i] == static_cast<float>(down + ulp))
        << "element " << i << ": " << pa[i] << " is not a neighbour of " << ma[i];
    const double e = pa[i] - static_cast<double>(ma[i]);
    sum += e;
    sumsq += e * e;
    sum_par[i & 1] += e;
  }
  EXPECT_GT(differ, n / 10) << "another seed should change many roundings";
  const double mean = sum / n, sd = std::sqrt(sumsq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 5 * sd / std::sqrt(double(n))) << "stochastic rounding is biased";
  for (int par = 0; par < 2; ++par)
    EXPECT_NEAR(sum_par[par] / (n / 2), 0.0, 5 * sd / std::sqrt(double(n / 2))) << "biased at parity " << par;
}

// The bf16 moments of Bf16Full get their own draws: m and v round without bias, with the
// reference's bits (up to rare fp32-rounding ties between the kernel's fmaf chain and fp64).
TEST(AdamGpuSr, Bf16FullMomentsUnbiasedWithReferenceBits) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::size_t n = 1 << 20;
  State st(OptimizerLayout::Bf16Full, DType::F32, n);
  st.params = test::round_bf16(test::random_uniform(n, rng, 1.01f, 1.99f));
  st.m = test::round_bf16(test::random_uniform(n, rng, 2.f, 3.9f));
  st.v = test::round_bf16(test::random_uniform(n, rng, 2.f, 3.9f));
  st.upload();
  auto g = test::random_uniform(n, rng, 2.f, 3.9f);  // m_new = (m + g) / 2, v_new = (v + g^2) / 2: inexact
  st.upload_grads(g);
  AdamParams p;
  p.lr = 1e-3f;
  p.beta1 = 0.5f;
  p.beta2 = 0.5f;
  p.stochastic_rounding = true;
  p.seed = rng();
  st.step(p);
  std::vector<float> gp, gmas, gm, gv;
  st.download(gp, gmas, gm, gv);
  std::vector<float> rp = st.params, rmas(n, 0.f), rm = st.m, rv = st.v;
  ref::adam_step(OptimizerLayout::Bf16Full, p, 1.0, rp, g, rmas, rm, rv);
  std::size_t differ_m = 0, differ_v = 0, differ_p = 0;
  double sum[2] = {0, 0}, sumsq[2] = {0, 0};
  for (std::size_t i = 0; i < n; ++i) {
    differ_m += gm[i] != rm[i];
    differ_v += gv[i] != rv[i];
    differ_p += gp[i] != rp[i];
    const double e[2] = {gm[i] - (0.5 * st.m[i] + 0.5 * g[i]), gv[i] - (0.5 * st.v[i] + 0.5 * double(g[i]) * g[i])};
    for (int k = 0; k < 2; ++k) {
      sum[k] += e[k];
      sumsq[k] += e[k] * e[k];
    }
  }
  EXPECT_LE(differ_m, n / 2000) << "m: the kernel's draws differ from the reference's";
  EXPECT_LE(differ_v, n / 2000) << "v: the kernel's draws differ from the reference's";
  EXPECT_LE(differ_p, n / 2000) << "params: the kernel's draws differ from the reference's";
  for (int k = 0; k < 2; ++k) {
    const double mean = sum[k] / n, sd = std::sqrt(sumsq[k] / n - mean * mean);
    EXPECT_GT(sd, 0.0);
    EXPECT_NEAR(mean, 0.0, 5 * sd / std::sqrt(double(n))) << (k == 0 ? "m" : "v") << " rounding is biased";
  }
}

// More than 2^31 elements (size_t indexing, the tail, the high index bits of the SR key).
TEST(AdamGpuLarge, MoreThan2Pow31Elements) {
  CUTRAIN_REQUIRE_GPU();
  const std::size_t n = (std::size_t(1) << 31) + 13;
  std::size_t free_b = 0, total_b = 0;
  CUTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < 8 * n + (std::size_t(2) << 30)) GTEST_SKIP() << "needs " << 8 * n / (1 << 30) << " GiB free";
  bf16 *params, *g, *m, *v;
  CUTRAIN_CUDA_CHECK(cudaMalloc(&params, 2 * n));
  CUTRAIN_CUDA_CHECK(cudaMalloc(&g, 2 * n));
  CUTRAIN_CUDA_CHECK(cudaMalloc(&m, 2 * n));
  CUTRAIN_CUDA_CHECK(cudaMalloc(&v, 2 * n));
  CUTRAIN_CUDA_CHECK(cudaMemset(params, 0x3F, 2 * n));  // every bf16 0x3F3F = 0.746...
  CUTRAIN_CUDA_CHECK(cudaMemset(g, 0x3C, 2 * n));       // 0x3C3C = 0.0115
  CUTRAIN_CUDA_CHECK(cudaMemset(m, 0, 2 * n));
  CUTRAIN_CUDA_CHECK(cudaMemset(v, 0, 2 * n));
  AdamParams p;
  p.lr = 1e-2f;
  p.weight_decay = 0.1f;
  kernels::adam_step(nullptr, OptimizerLayout::Bf16Full, p, params, g, DType::BF16, nullptr, m, v, n, nullptr, nullptr);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> rp{cutrain::bf16_bits_to_f32(0x3F3F)}, rg{cutrain::bf16_bits_to_f32(0x3C3C)}, rmas{0.f}, rm{0.f},
      rv{0.f};
  ref::adam_step(OptimizerLayout::Bf16Full, p, 1.0, rp, rg, rmas, rm, rv);
  for (std::size_t start : {std::size_t(0), (std::size_t(1) << 31) - 4096, n - 4096}) {
    std::vector<bf16> hp(4096), hm(4096), hv(4096);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(hp.data(), params + start, 2 * 4096, cudaMemcpyDeviceToHost));
    CUTRAIN_CUDA_CHECK(cudaMemcpy(hm.data(), m + start, 2 * 4096, cudaMemcpyDeviceToHost));
    CUTRAIN_CUDA_CHECK(cudaMemcpy(hv.data(), v + start, 2 * 4096, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4096; ++i) {
      ASSERT_LE(test::bf16_ulps(cutrain::to_float(hp[i]), rp[0]), 1) << "param " << start + i;
      ASSERT_LE(test::bf16_ulps(cutrain::to_float(hm[i]), rm[0]), 1) << "m " << start + i;
      ASSERT_LE(test::bf16_ulps(cutrain::to_float(hv[i]), rv[0]), 1) << "v " << start + i;
    }
  }
  cudaFree(params);
  cudaFree(g);
  cudaFree(m);
  cudaFree(v);
}

TEST(AdamGpuArgs, RejectsBadArguments) {
  CUTRAIN_REQUIRE_GPU();
  DeviceArray<bf16> p(16), g(16);
  DeviceArray<float> m(16), v(16);
  AdamParams ap;
  EXPECT_THROW(kernels::adam_step(nullptr, OptimizerLayout::Baseline, ap, p.get(), g.get(), DType::BF16, nullptr,
                                  m.get(), v.get(), 16, nullptr, nullptr),
               Error);  // Baseline without master
  DeviceArray<float> master(16);
  DeviceArray<bf16> comp(16);
  EXPECT_THROW(kernels::adam_step(nullptr, OptimizerLayout::Baseline, ap, p.get(), g.get(), DType::BF16, master.get(),
                                  m.get(), v.get(), 16, nullptr, nullptr, comp.get()),
               Error);  // a compensation belongs to a bf16 master
  EXPECT_THROW(kernels::adam_step(nullptr, OptimizerLayout::Bf16MasterWG, ap, p.get(), g.get(), DType::I32, nullptr,
                                  m.get(), v.get(), 16, nullptr, nullptr),
               Error);
  ap.step = 0;
  EXPECT_THROW(kernels::adam_step(nullptr, OptimizerLayout::Bf16MasterWG, ap, p.get(), g.get(), DType::BF16, nullptr,
                                  m.get(), v.get(), 16, nullptr, nullptr),
               Error);
}


// fp16 parameters (fp16 training): layout Baseline only (the fp32 master), fp16 or fp32 gradients
// that are loss_scale times the true ones, unscaled through device_scale = 1 / loss_scale (what
// grad_norm_clip's clip_scale carries); the master, m and v against the fp64 reference within 1e-5
// (fp32 stores), the fp16 params exactly the fp16 rounding of the kernel's own master; aligned and
// misaligned (scalar path) views; a raised skip flag changes nothing.
TEST(AdamGpuFp16, BaselineMatchesReferenceWithDeviceUnscale) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (DType gt : {DType::F16, DType::F32}) {
    for (std::size_t off : {std::size_t(0), std::size_t(1)}) {
      const std::size_t n = off ? 1001 : 100003;
      SCOPED_TRACE(std::string("fp16 params, grads ") + dtype_name(gt) + " off " + std::to_string(off));
      const float loss_scale = 2048.f;
      std::vector<float> master = test::random_normal(n, rng, 0.f, 1.f);
      std::vector<float> m = test::random_normal(n, rng, 0.f, 1e-2f), v = test::random_uniform(n, rng, 0.f, 1e-4f);
      auto up16 = [&](const std::vector<float>& h) {
        std::vector<float> pad(off, 0.f);
        pad.insert(pad.end(), h.begin(), h.end());
        return DeviceArray<f16>(test::to_f16(pad));
      };
      auto up32 = [&](const std::vector<float>& h) {
        std::vector<float> pad(off, 0.f);
        pad.insert(pad.end(), h.begin(), h.end());
        return DeviceArray<float>(pad);
      };
      auto down = [&](const auto& d) {
        std::vector<float> h;
        if constexpr (std::is_same_v<std::decay_t<decltype(d)>, DeviceArray<f16>>) h = test::download_float(d);
        else h = d.download();
        return std::vector<float>(h.begin() + off, h.end());
      };
      DeviceArray<f16> dp = up16(test::round_f16(master));
      DeviceArray<float> dmaster = up32(master), dm = up32(m), dv = up32(v);
      DeviceArray<float> dscale(std::vector<float>{1.f / loss_scale});
      DeviceArray<int> dskip(std::vector<int>{0});
      AdamParams p;
      p.lr = 1e-3f, p.beta1 = 0.9f, p.beta2 = 0.95f, p.weight_decay = 0.05f, p.grad_scale = 0.5f;
      std::vector<float> rp = test::round_f16(master), rmas = master, rm = m, rv = v;
      for (int step = 1; step <= 3; ++step) {
        p.step = step;
        // The true gradient g, stored scaled by the loss scale (in fp16 where the grads are fp16).
        auto stored = test::random_normal(n, rng, 0.f, 1e-2f * loss_scale);
        if (gt == DType::F16) stored = test::round_f16(stored);
        DeviceArray<f16> dg16 = up16(stored);
        DeviceArray<float> dg32 = up32(stored);
        const void* g = gt == DType::F16 ? static_cast<const void*>(dg16.get() + off) : dg32.get() + off;
        kernels::adam_step(nullptr, OptimizerLayout::Baseline, p, dp.get() + off, g, gt, dmaster.get() + off,
                           dm.get() + off, dv.get() + off, n, dscale.get(), dskip.get());
        ref::adam_step(OptimizerLayout::Baseline, p, p.grad_scale / loss_scale, rp, stored, rmas, rm, rv);
        const auto gp = down(dp), gmas = down(dmaster), gm = down(dm), gv = down(dv);
        ASSERT_EQ(test::count_nan(gp) + test::count_nan(gmas), 0u) << "params or master not written";
        EXPECT_LE(test::rel_error(gmas, rmas), 1e-5) << "master, step " << step;
        EXPECT_LE(test::rel_error(gm, rm), 1e-5) << "m, step " << step;
        EXPECT_LE(test::rel_error(gv, rv), 1e-5) << "v, step " << step;
        EXPECT_EQ(gp, test::round_f16(gmas)) << "params must be the fp16 rounding of the master, step " << step;
        rmas = gmas, rm = gm, rv = gv;  // continue from the device state
      }
      // Skipped (an overflow step): nothing changes.
      const auto before_p = down(dp), before_m = down(dmaster);
      dskip.upload({1});
      kernels::adam_step(nullptr, OptimizerLayout::Baseline, p, dp.get() + off,
                         gt == DType::F16 ? static_cast<const void*>(dp.get() + off) : dmaster.get() + off, gt,
                         dmaster.get() + off, dm.get() + off, dv.get() + off, n, dscale.get(), dskip.get());
      EXPECT_EQ(down(dp), before_p) << "a skipped step changed the params";
      EXPECT_EQ(down(dmaster), before_m) << "a skipped step changed the master";
    }
  }
}

TEST(AdamGpuFp16, RefusesWhatFp16ParamsCannotDo) {
  CUTRAIN_REQUIRE_GPU();
  DeviceArray<f16> p(64), g16(64);
  DeviceArray<bf16> gb(64);
  DeviceArray<float> mas(64), m(64), v(64);
  AdamParams ap;
  auto err = [&](OptimizerLayout l, const void* g, DType gt, bool sr) {
    ap.stochastic_rounding = sr;
    return test::error_of([&] {
      kernels::adam_step(nullptr, l, ap, p.get(), g, gt, mas.get(), m.get(), v.get(), 64, nullptr, nullptr);
    });
  };
  EXPECT_NE(err(OptimizerLayout::Bf16MasterWG, g16.get(), DType::F16, false).find("need the fp32 master weights"),
            std::string::npos);
  EXPECT_NE(err(OptimizerLayout::Baseline, g16.get(), DType::F16, true).find("stochastic rounding is for bf16"),
            std::string::npos);
  EXPECT_NE(err(OptimizerLayout::Baseline, gb.get(), DType::BF16, false).find("grad_type must be float16"),
            std::string::npos);
}

}  // namespace
}  // namespace cutrain
