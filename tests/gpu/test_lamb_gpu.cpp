// @brief GPU tests of lamb_step against the fp64 reference (tests/reference/lamb_ref.h): every
// layout and gradient type, nearest and stochastic rounding, the compensated bf16 master, several
// tensors of odd sizes with poisoned gaps between them (never written), multi-chunk tensors, the
// scalar path (tensors off a multiple of 4), the clamps and the zero-norm rule of the trust ratio,
// skip and device scale, and bit-identical repeats (the per-tensor sums in a fixed order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>

#include "kernels/lamb.cuh"
#include "tests/reference/lamb_ref.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

using kernels::LambParams;
using kernels::LambTensor;
using kernels::OptimizerLayout;
using test::DeviceArray;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

const char* name_of(OptimizerLayout l) {
  switch (l) {
    case OptimizerLayout::Baseline: return "Baseline";
    case OptimizerLayout::Bf16MasterWG: return "Bf16MasterWG";
    case OptimizerLayout::Bf16Full: return "Bf16Full";
  }
  return "?";
}

// The tensors' elements within one bf16 ulp of the reference (almost all exact; a fp32 result one
// fp32 ulp apart can round either way; where an update cancels, within
// test::bf16_cancellation_floor), the gaps still NaN.
void expect_bf16_close(const std::vector<float>& got, const std::vector<float>& want, const std::vector<bool>& in_tensor,
                       const char* what) {
  const double floor = test::bf16_cancellation_floor(want, in_tensor);
  std::size_t off = 0, n = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!in_tensor[i]) {
      ASSERT_TRUE(std::isnan(got[i])) << what << "[" << i << "] outside every tensor was written";
      continue;
    }
    ++n;
    ASSERT_FALSE(std::isnan(got[i])) << what << "[" << i << "] not written";
    const int d = test::bf16_ulps(got[i], want[i]);
    if (d > 1) {
      ASSERT_LE(std::abs(double(got[i]) - want[i]), floor)
          << what << "[" << i << "]: got " << got[i] << " want " << want[i] << " (" << d << " ulps)";
    }
    off += d != 0;
  }
  EXPECT_LE(off, n / 100 + 2) << what << ": too many one-ulp differences";
}

// ||got - want|| / ||want|| over the tensors' elements; the gaps still NaN.
void expect_f32_close(const std::vector<float>& got, const std::vector<float>& want, const std::vector<bool>& in_tensor,
                      double tol, const char* what) {
  std::vector<float> g, w;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!in_tensor[i]) {
      ASSERT_TRUE(std::isnan(got[i])) << what << "[" << i << "] outside every tensor was written";
      continue;
    }
    g.push_back(got[i]);
    w.push_back(want[i]);
  }
  EXPECT_LE(test::rel_error(g, w), tol) << what;
}

template <typename T>
void put(DeviceArray<T>& d, const std::vector<float>& h) {
  std::vector<T> t(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>) t[i] = cutrain::to_bf16(h[i]);
    else t[i] = h[i];
  }
  d.upload(t);
}
template <typename T>
std::vector<float> get(const DeviceArray<T>& d) {
  const std::vector<T> t = d.download();
  std::vector<float> h(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>) h[i] = cutrain::to_float(t[i]);
    else h[i] = t[i];
  }
  return h;
}

// Tensors of odd sizes around the chunk (16384) and the vector width, 64-aligned like the model's
// flat buffer (+ `shift` elements each: shift 1 takes the scalar path), gaps of 3..67 between.
std::vector<LambTensor> odd_tensors(std::size_t shift, std::size_t& total) {
  const std::size_t sizes[] = {1, 7, 255, 1000, 16384, 16385, 40001, 3 * 16384 + 3, 4099};
  std::vector<LambTensor> t;
  std::size_t at = 0;
  for (std::size_t k = 0; k < std::size(sizes); ++k) {
    at = (at + 63) / 64 * 64 + shift;
    t.push_back({at, sizes[k], k % 3 != 1});  // some tensors without weight decay
    at += sizes[k] + 3;
  }
  total = at + 64;
  return t;
}

// The state of a flat buffer, host floats and device arrays in the layout's dtypes.
struct State {
  OptimizerLayout layout;
  DType gt;
  bool compensated;
  std::vector<LambTensor> tensors;
  std::size_t n;
  std::vector<bool> in_tensor;
  std::vector<float> params, master, m, v, comp;
  DeviceArray<bf16> d_params, d_m16, d_v16, d_g16, d_comp;
  DeviceArray<float> d_master, d_m32, d_v32, d_g32;
  kernels::LambPlan plan;
  DeviceArray<unsigned char> d_table, d_ws;
  kernels::LambDeviceTable table;

  State(OptimizerLayout l, DType g, std::vector<LambTensor> t, std::size_t n_, bool comp_ = false)
      : layout(l), gt(g), compensated(comp_), tensors(std::move(t)), n(n_), in_tensor(n_, false) {
    for (const LambTensor& x : tensors)
      for (std::size_t i = x.begin; i < x.begin + x.count; ++i) in_tensor[i] = true;
    d_params = DeviceArray<bf16>(n);
    if (compensated) d_comp = DeviceArray<bf16>(n);
    if (gt == DType::BF16) d_g16 = DeviceArray<bf16>(n);
    else d_g32 = DeviceArray<float>(n);
    if (l == OptimizerLayout::Baseline) d_master = DeviceArray<float>(n);
    if (full()) {
      d_m16 = DeviceArray<bf16>(n);
      d_v16 = DeviceArray<bf16>(n);
    } else {
      d_m32 = DeviceArray<float>(n);
      d_v32 = DeviceArray<float>(n);
    }
    plan = kernels::LambPlan::make(tensors);
    std::vector<unsigned char> packed(plan.table_bytes());
    plan.pack(packed.data());
    d_table = DeviceArray<unsigned char>(packed);
    d_ws = DeviceArray<unsigned char>(plan.workspace_bytes());
    CUTRAIN_CUDA_CHECK(cudaMemset(d_ws.get(), 0, plan.workspace_bytes()));  // the counters start at zero
    table = kernels::lamb_device_table(plan, d_table.get(), d_ws.get());
  }
  bool full() const { return layout == OptimizerLayout::Bf16Full; }
  std::vector<float> gaps_nan(std::vector<float> x) const {
    for (std::size_t i = 0; i < n; ++i)
      if (!in_tensor[i]) x[i] = kNaN;
    return x;
  }

  void randomize(std::mt19937_64& rng) {
    master = gaps_nan(test::random_normal(n, rng, 0.f, 0.5f));
    params = test::round_bf16(master);
    if (layout != OptimizerLayout::Baseline) master = gaps_nan(std::vector<float>(n, 0.f));
    m = gaps_nan(test::random_normal(n, rng, 0.f, 1e-2f));
    v = gaps_nan(test::random_uniform(n, rng, 0.f, 1e-4f));
    if (full()) {
      m = test::round_bf16(m);
      v = test::round_bf16(v);
    }
    comp = gaps_nan(std::vector<float>(n, 0.f));
    if (compensated) {
      const auto u = test::random_uniform(n, rng, -0.5f, 0.5f);
      for (std::size_t i = 0; i < n; ++i)
        if (in_tensor[i] && params[i] != 0.f) comp[i] = round_bf16(std::ldexp(u[i], std::ilogb(params[i]) - 7));
    }
  }
  void upload() {
    put(d_params, params);
    if (compensated) put(d_comp, comp);
    if (layout == OptimizerLayout::Baseline) put(d_master, master);
    if (full()) {
      put(d_m16, m);
      put(d_v16, v);
    } else {
      put(d_m32, m);
      put(d_v32, v);
    }
  }
  void upload_grads(const std::vector<float>& g) {
    if (gt == DType::BF16) put(d_g16, g);
    else put(d_g32, g);
  }
  void download(std::vector<float>& p, std::vector<float>& mas, std::vector<float>& mm, std::vector<float>& vv,
                std::vector<float>& cc) const {
    p = get(d_params);
    mas = layout == OptimizerLayout::Baseline ? get(d_master) : master;
    mm = full() ? get(d_m16) : get(d_m32);
    vv = full() ? get(d_v16) : get(d_v32);
    cc = compensated ? get(d_comp) : comp;
  }
  // Poisons the ratios and norms (every launch must write them), then runs the step.
  void step(const LambParams& p, const float* device_scale = nullptr, const int* skip = nullptr) {
    const std::size_t t = plan.tensors.size();
    CUTRAIN_CUDA_CHECK(cudaMemset(const_cast<float*>(kernels::lamb_trust_ratios(table)), 0xFF, t * sizeof(float)));
    CUTRAIN_CUDA_CHECK(cudaMemset(const_cast<float*>(kernels::lamb_norms(table)), 0xFF, 2 * t * sizeof(float)));
    const void* g = gt == DType::BF16 ? static_cast<const void*>(d_g16.get()) : d_g32.get();
    void* mm = full() ? static_cast<void*>(d_m16.get()) : d_m32.get();
    void* vv = full() ? static_cast<void*>(d_v16.get()) : d_v32.get();
    kernels::lamb_step(nullptr, layout, p, table, d_params.get(), g, gt,
                       layout == OptimizerLayout::Baseline ? d_master.get() : nullptr, mm, vv, device_scale, skip,
                       compensated ? d_comp.get() : nullptr);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<float> ratios() const {
    std::vector<float> r(plan.tensors.size());
    CUTRAIN_CUDA_CHECK(cudaMemcpy(r.data(), kernels::lamb_trust_ratios(table), r.size() * 4, cudaMemcpyDeviceToHost));
    return r;
  }
};

std::vector<float> make_grads(const State& st, std::mt19937_64& rng, float stddev = 1e-2f) {
  auto g = st.gaps_nan(test::random_normal(st.n, rng, 0.f, stddev));
  return st.gt == DType::BF16 ? test::round_bf16(g) : g;
}

LambParams some_params(std::mt19937_64& rng, bool sr) {
  LambParams p;
  p.lr = 2e-3f;
  p.beta1 = 0.9f;
  p.beta2 = 0.999f;
  p.eps = 1e-6f;
  p.weight_decay = 0.01f;
  p.max_coeff = 10.f;
  p.min_coeff = 0.01f;
  p.grad_scale = 0.5f;
  p.stochastic_rounding = sr;
  p.seed = rng();
  return p;
}

// Three steps; after each the device state is compared with the reference applied to the previous
// device state (rounding differences do not compound), the ratios included.
void check_steps(State& st, LambParams p) {
  auto rng = test::fresh_rng();
  st.randomize(rng);
  st.upload();
  std::vector<float> rp = st.params, rmas = st.master, rm = st.m, rv = st.v, rc = st.comp;
  for (int step = 1; step <= 3; ++step) {
    p.step = step + 10 * (step == 3);
    p.eps_inside_sqrt = step == 2;     // DeepSpeed's eps mode 0 on one step
    p.bias_correction = step != 3;     // and lr without bias correction on another
    const auto g = make_grads(st, rng);
    st.upload_grads(g);
    st.step(p);
    std::vector<double> w_prev(st.n);  // the weights this step starts from (w + c when compensated)
    for (std::size_t i = 0; i < st.n; ++i) w_prev[i] = double(rp[i]) + (st.compensated ? rc[i] : 0.f);
    std::vector<double> want_ratio;
    ref::lamb_step(st.layout, p, p.grad_scale, st.tensors, rp, g, rmas, rm, rv, st.compensated ? &rc : nullptr,
                   &want_ratio);
    const std::vector<float> got_ratio = st.ratios();
    std::vector<float> gp, gmas, gm, gv, gc;
    st.download(gp, gmas, gm, gv, gc);
    auto adam_term = [&](float m, float v) {
      const double d = p.eps_inside_sqrt ? std::sqrt(double(v) + p.eps) : std::sqrt(double(v)) + p.eps;
      return double(m) / d;
    };
    for (std::size_t t = 0; t < got_ratio.size(); ++t) {
      // With bf16 moments a moment the device rounded the other way (expect_bf16_close allows it)
      // moves ||u|| by at most ||u_device - u_reference||: the ratio may move by that fraction.
      double tol = 1e-5 * want_ratio[t];
      if (st.full()) {
        const auto& tensor = st.tensors[t];
        const double wd = tensor.decay ? p.weight_decay : 0.0;
        double du2 = 0, u2 = 0;
        for (std::size_t i = tensor.begin; i < tensor.begin + tensor.count; ++i) {
          const double ur = adam_term(rm[i], rv[i]) + wd * w_prev[i], ud = adam_term(gm[i], gv[i]) + wd * w_prev[i];
          du2 += (ud - ur) * (ud - ur);
          u2 += ur * ur;
        }
        const double x = u2 > 0 ? std::sqrt(du2 / u2) : 0.0;
        if (x < 0.5) tol += want_ratio[t] * x / (1 - x);
      }
      ASSERT_NEAR(got_ratio[t], want_ratio[t], tol) << "trust ratio of tensor " << t << ", step " << step;
    }
    expect_bf16_close(gp, rp, st.in_tensor, "params");
    if (st.layout == OptimizerLayout::Baseline) expect_f32_close(gmas, rmas, st.in_tensor, 1e-6, "master");
    if (st.full()) {
      expect_bf16_close(gm, rm, st.in_tensor, "m (bf16)");
      expect_bf16_close(gv, rv, st.in_tensor, "v (bf16)");
    } else {
      expect_f32_close(gm, rm, st.in_tensor, 1e-6, "m");
      expect_f32_close(gv, rv, st.in_tensor, 1e-6, "v");
    }
    if (st.compensated) {
      // w + c must agree (a weight one ulp off carries the difference in its compensation). With
      // bf16 moments a moment the device rounded the other way (expect_bf16_close allows it)
      // changes this element's update by step_size * ratio * |u_device - u_reference|: that much
      // more is allowed, computed from both sides' stored moments.
      const double bc1 = 1.0 - std::pow(double(p.beta1), p.step), bc2 = 1.0 - std::pow(double(p.beta2), p.step);
      const double step_size = p.bias_correction ? p.lr * std::sqrt(bc2) / bc1 : p.lr;
      for (std::size_t t = 0; t < st.tensors.size(); ++t) {
        const auto& tensor = st.tensors[t];
        for (std::size_t i = tensor.begin; i < tensor.begin + tensor.count; ++i) {
          const double want = double(rp[i]) + rc[i], got = double(gp[i]) + gc[i];
          double tol = (rp[i] == 0.f ? 0.0 : std::ldexp(1.0, std::ilogb(rp[i]) - 14)) + 1e-8;
          if (st.full()) tol += step_size * want_ratio[t] * std::abs(adam_term(gm[i], gv[i]) - adam_term(rm[i], rv[i]));
          // The trust ratio itself may differ within its own bound (above): the update moves by
          // step_size * |ratio_device - ratio_reference| * |u|.
          const double wd = tensor.decay ? p.weight_decay : 0.0;
          tol += step_size * std::abs(double(got_ratio[t]) - want_ratio[t]) *
                 std::abs(adam_term(gm[i], gv[i]) + wd * w_prev[i]);
          ASSERT_LE(std::abs(got - want), tol) << "w + c at " << i;
        }
      }
      for (std::size_t i = 0; i < st.n; ++i) {
        if (!st.in_tensor[i]) {
          ASSERT_TRUE(std::isnan(gc[i])) << "compensation[" << i << "] outside every tensor was written";
        }
      }
    }
    if (::testing::Test::HasFatalFailure()) return;
    rp = gp, rmas = gmas, rm = gm, rv = gv, rc = gc;
  }
}

using LambCase = std::tuple<OptimizerLayout, DType, bool>;
class LambGpu : public ::testing::TestWithParam<LambCase> {};

TEST_P(LambGpu, MatchesReferenceOverOddTensors) {
  CUTRAIN_REQUIRE_GPU();
  auto [layout, gt, sr] = GetParam();
  auto rng = test::fresh_rng();
  std::size_t n = 0;
  const auto tensors = odd_tensors(0, n);  // sets n (before State reads it)
  State st(layout, gt, tensors, n);
  ASSERT_TRUE(st.plan.aligned4);
  check_steps(st, some_params(rng, sr));
}

TEST_P(LambGpu, MatchesReferenceOnTheScalarPath) {
  CUTRAIN_REQUIRE_GPU();
  auto [layout, gt, sr] = GetParam();
  auto rng = test::fresh_rng();
  std::size_t n = 0;
  const auto tensors = odd_tensors(1, n);  // sets n (before State reads it)
  State st(layout, gt, tensors, n);
  ASSERT_FALSE(st.plan.aligned4);
  check_steps(st, some_params(rng, sr));
}

TEST_P(LambGpu, CompensatedMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto [layout, gt, sr] = GetParam();
  if (layout == OptimizerLayout::Baseline) GTEST_SKIP() << "Baseline keeps an fp32 master: no compensation";
  auto rng = test::fresh_rng();
  std::size_t n = 0;
  const auto tensors = odd_tensors(0, n);
  State st(layout, gt, tensors, n, true);
  check_steps(st, some_params(rng, sr));
}

INSTANTIATE_TEST_SUITE_P(Layouts, LambGpu,
                         ::testing::Combine(::testing::Values(OptimizerLayout::Baseline, OptimizerLayout::Bf16MasterWG,
                                                              OptimizerLayout::Bf16Full),
                                            ::testing::Values(DType::BF16, DType::F32), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<LambCase>& i) {
                           return std::string(name_of(std::get<0>(i.param))) + "_" + dtype_name(std::get<1>(i.param)) +
                                  (std::get<2>(i.param) ? "_SR" : "_RNE");
                         });

// Tensor 0: large weights, tiny gradients -> |w|/|u| far above max_coeff; tensor 1: tiny weights,
// large gradients -> below min_coeff; tensor 2: zero weights and no decay -> |w| = 0 -> ratio 1.
TEST(LambGpuRatio, ClampsAndTheZeroNormRule) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::vector<LambTensor> t{{0, 5000, true}, {5056, 3001, true}, {8064, 777, false}};
  State st(OptimizerLayout::Baseline, DType::F32, t, 8064 + 777);
  st.randomize(rng);
  for (std::size_t i = 0; i < 5000; ++i) st.master[i] = 100.f * (i % 2 ? 1.f : -1.f);
  for (std::size_t i = 5056; i < 8057; ++i) st.master[i] = 1e-6f;
  for (std::size_t i = 8064; i < st.n; ++i) st.master[i] = 0.f;
  st.params = test::round_bf16(st.master);
  st.upload();
  auto g = make_grads(st, rng);
  for (std::size_t i = 0; i < 5000; ++i) g[i] = 1e-6f;
  st.upload_grads(g);
  LambParams p = some_params(rng, false);
  p.max_coeff = 3.f;
  p.min_coeff = 0.2f;
  p.weight_decay = 0.f;
  st.step(p);
  const std::vector<float> r = st.ratios();
  EXPECT_EQ(r[0], 3.f);
  EXPECT_EQ(r[1], 0.2f);
  EXPECT_EQ(r[2], 1.f);
}

TEST(LambGpuFlags, SkipChangesNothingAndDeviceScaleMultiplies) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  std::size_t n = 0;
  const auto tensors = odd_tensors(0, n);
  State st(OptimizerLayout::Bf16MasterWG, DType::F32, tensors, n);
  st.randomize(rng);
  st.upload();
  const auto g = make_grads(st, rng);
  st.upload_grads(g);
  LambParams p = some_params(rng, false);
  DeviceArray<int> skip(std::vector<int>{1});
  st.step(p, nullptr, skip.get());
  std::vector<float> gp, gmas, gm, gv, gc;
  st.download(gp, gmas, gm, gv, gc);
  EXPECT_EQ(std::memcmp(gp.data(), st.params.data(), n * 4), 0) << "params changed under skip";
  EXPECT_EQ(std::memcmp(gm.data(), st.m.data(), n * 4), 0) << "m changed under skip";
  // Now a device scale of 4 with grad_scale 0.5: the reference sees 2.
  DeviceArray<float> scale(std::vector<float>{4.f});
  DeviceArray<int> no_skip(std::vector<int>{0});
  st.step(p, scale.get(), no_skip.get());
  std::vector<float> rp = st.params, rmas = st.master, rm = st.m, rv = st.v;
  ref::lamb_step(st.layout, p, 2.0, st.tensors, rp, g, rmas, rm, rv);
  st.download(gp, gmas, gm, gv, gc);
  expect_bf16_close(gp, rp, st.in_tensor, "params");
  expect_f32_close(gm, rm, st.in_tensor, 1e-6, "m");
}

// The same inputs twice: the same bits (the ratios' sums have a fixed order; no float atomics).
TEST(LambGpuDeterminism, RepeatsBitForBit) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  std::size_t n = 0;
  const auto tensors = odd_tensors(0, n);
  std::vector<float> first;
  std::vector<float> first_ratio;
  const std::uint64_t seed = rng();
  for (int run = 0; run < 2; ++run) {
    std::mt19937_64 r(seed);
    State st(OptimizerLayout::Baseline, DType::BF16, tensors, n);
    st.randomize(r);
    st.upload();
    LambParams p = some_params(r, false);
    for (int step = 1; step <= 3; ++step) {
      p.step = step;
      st.upload_grads(make_grads(st, r));
      st.step(p);
    }
    std::vector<float> gp, gmas, gm, gv, gc;
    st.download(gp, gmas, gm, gv, gc);
    if (run == 0) {
      first = gmas;
      first_ratio = st.ratios();
    } else {
      EXPECT_EQ(std::memcmp(first.data(), gmas.data(), n * 4), 0);
      const auto ratio = st.ratios();
      EXPECT_EQ(std::memcmp(first_ratio.data(), ratio.data(), ratio.size() * 4), 0);
    }
  }
}

TEST(LambPlan, RefusesOverlapAndEmptyTensors) {
  EXPECT_THROW(kernels::LambPlan::make({{0, 10, true}, {5, 10, true}}), Error);
  EXPECT_THROW(kernels::LambPlan::make({{0, 0, true}}), Error);
  const auto plan = kernels::LambPlan::make({{100, 40000, true}, {0, 7, false}}, 16384);
  ASSERT_EQ(plan.tensors.size(), 2u);
  EXPECT_EQ(plan.tensors[0].num_chunks, 3u);
  EXPECT_EQ(plan.tensors[1].num_chunks, 1u);
  EXPECT_EQ(plan.end(), 40100u);
  EXPECT_TRUE(plan.aligned4);
}

// fp16 parameters (fp16 training): LAMB's Baseline layout over the odd tensor table, fp16 gradients
// loss_scale times the true ones unscaled through device_scale; master, m, v and the trust ratios
// against the fp64 reference as the bf16 Baseline test checks them, the fp16 params exactly the
// fp16 rounding of the kernel's own master, elements outside every tensor untouched.
TEST(LambGpuFp16, BaselineMatchesReferenceWithDeviceUnscale) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  std::size_t n = 0;
  const auto tensors = odd_tensors(0, n);
  std::vector<bool> in_tensor(n, false);
  for (const LambTensor& x : tensors)
    for (std::size_t i = x.begin; i < x.begin + x.count; ++i) in_tensor[i] = true;
  const kernels::LambPlan plan = kernels::LambPlan::make(tensors);
  std::vector<unsigned char> packed(plan.table_bytes());
  plan.pack(packed.data());
  DeviceArray<unsigned char> d_table(packed), d_ws(plan.workspace_bytes());
  CUTRAIN_CUDA_CHECK(cudaMemset(d_ws.get(), 0, plan.workspace_bytes()));
  const kernels::LambDeviceTable table = kernels::lamb_device_table(plan, d_table.get(), d_ws.get());
  const float loss_scale = 1024.f;
  std::vector<float> master = test::random_normal(n, rng, 0.f, 1.f);
  std::vector<float> m = test::random_normal(n, rng, 0.f, 1e-2f), v = test::random_uniform(n, rng, 0.f, 1e-4f);
  for (std::size_t i = 0; i < n; ++i)
    if (!in_tensor[i]) master[i] = m[i] = v[i] = NAN;  // the gaps: must stay untouched (NaN)
  DeviceArray<f16> dp(test::to_f16(test::round_f16(master))), dg(n);
  DeviceArray<float> dmaster(master), dm(m), dv(v), dscale(std::vector<float>{1.f / loss_scale});
  LambParams p = some_params(rng, false);
  std::vector<float> rp = test::round_f16(master), rmas = master, rm = m, rv = v;
  for (int step = 1; step <= 3; ++step) {
    p.step = step;
    const auto stored = test::round_f16(test::random_normal(n, rng, 0.f, 1e-2f * loss_scale));
    dg.upload(test::to_f16(stored));
    kernels::lamb_step(nullptr, OptimizerLayout::Baseline, p, table, dp.get(), dg.get(), DType::F16, dmaster.get(),
                       dm.get(), dv.get(), dscale.get(), nullptr);
    std::vector<double> want_ratio;
    ref::lamb_step(OptimizerLayout::Baseline, p, p.grad_scale / loss_scale, tensors, rp, stored, rmas, rm, rv, nullptr,
                   &want_ratio);
    std::vector<float> got_ratio(tensors.size());
    CUTRAIN_CUDA_CHECK(cudaMemcpy(got_ratio.data(), kernels::lamb_trust_ratios(table), got_ratio.size() * 4,
                                  cudaMemcpyDeviceToHost));
    for (std::size_t t = 0; t < tensors.size(); ++t)
      ASSERT_NEAR(got_ratio[t], want_ratio[t], 1e-5 * want_ratio[t]) << "trust ratio of tensor " << t;
    const auto gp = test::download_float(dp), gmas = dmaster.download(), gm = dm.download(), gv = dv.download();
    expect_f32_close(gmas, rmas, in_tensor, 1e-6, "master");
    expect_f32_close(gm, rm, in_tensor, 1e-6, "m");
    expect_f32_close(gv, rv, in_tensor, 1e-6, "v");
    for (std::size_t i = 0; i < n; ++i) {
      if (in_tensor[i]) ASSERT_EQ(gp[i], round_f16(gmas[i])) << "params[" << i << "]: the fp16 rounding of the master";
      else ASSERT_TRUE(std::isnan(gp[i])) << "params[" << i << "] outside every tensor was written";
    }
    if (::testing::Test::HasFatalFailure()) return;
    rmas = gmas, rm = gm, rv = gv;
  }
}

}  // namespace
}  // namespace cutrain
