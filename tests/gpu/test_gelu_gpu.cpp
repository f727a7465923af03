// @brief GPU tests of kernels/gelu against the fp64 CPU reference: erf and tanh, with and without
// bias, pre-activation output, in-place use, odd sizes (vector tail, cols % 8 != 0), misaligned
// pointers (scalar path), backward with aliasing, determinism, bad arguments; the vector path
// (fitted Φ) must be within one bf16 step of the fp64 GELU for every bf16 input in [-12, 12].
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/gelu.cuh"
#include "tests/reference/gelu_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {

struct Shape {
  int rows, cols;
};
const Shape kShapes[] = {{1, 1}, {7, 63}, {7, 64}, {33, 1000}, {3, 4097}, {2048, 4096}, {5, 8}, {129, 1030}};

// Host bf16 values of a device array, `off` elements in.
std::vector<float> dl(const test::DeviceArray<bf16>& a, std::size_t off, std::size_t n) {
  auto h = test::to_float(a.download());
  return std::vector<float>(h.begin() + off, h.begin() + off + n);
}
void ul(test::DeviceArray<bf16>& a, std::size_t off, const std::vector<float>& v) {
  std::vector<bf16> h(a.size(), to_bf16(0.f));
  for (std::size_t i = 0; i < v.size(); ++i) h[off + i] = to_bf16(v[i]);
  a.upload(h);
}
std::vector<uint16_t> bits_of(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16_bits(v[i]);
  return b;
}

}  // namespace

TEST(GeluGpu, ForwardBackwardMatchReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Shape& s : kShapes) {
    for (int variant = 0; variant < 16; ++variant) {
      const bool tanh = variant & 1, with_bias = variant & 2, in_place = variant & 4, misalign = variant & 8;
      SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                   (tanh ? " tanh" : " erf") +
                   (with_bias ? " bias" : "") + (in_place ? " in-place" : "") + (misalign ? " misaligned" : ""));
      const kernels::GeluKind kind = tanh ? kernels::GeluKind::Tanh : kernels::GeluKind::Erf;
      const std::size_t n = static_cast<std::size_t>(s.rows) * s.cols;
      const std::size_t off = misalign ? 1 : 0;
      const auto in = test::round_bf16(test::random_normal(n, rng, 0.f, 2.f));
      const auto bias = test::round_bf16(test::random_normal(s.cols, rng, 0.f, 0.5f));
      test::DeviceArray<bf16> din(n + 1), dbias(s.cols), dpre(n + 1), dout(n + 1);
      ul(din, off, in);
      ul(dbias, 0, bias);
      dpre.poison();
      dout.poison();
      bf16* out_ptr = in_place ? din.get() + off : dout.get() + off;
      kernels::gelu_forward(nullptr, din.get() + off, with_bias ? dbias.get() : nullptr,
                            with_bias ? dpre.get() + off : nullptr, out_ptr, s.rows, s.cols, kind);
      auto want = ref::gelu_forward(in.data(), with_bias ? bias.data() : nullptr, s.rows, s.cols, tanh);
      auto got = dl(in_place ? din : dout, off, n);
      ASSERT_EQ(test::count_nan(got), 0u) << "out not fully written";
      EXPECT_LE(test::rel_error(got, want.out), 1e-2);
      std::vector<float> pre = in;
      if (with_bias) {
        pre = dl(dpre, off, n);
        ASSERT_EQ(test::count_nan(pre), 0u) << "pre_out not fully written";
        EXPECT_EQ(bits_of(pre), bits_of(want.pre)) << "pre must be the bf16-rounded in + bias";
      }

      // Backward at the stored pre-activation; din aliases dout in the in-place variant.
      const auto g = test::round_bf16(test::random_normal(n, rng));
      test::DeviceArray<bf16> dg(n + 1), dp(n + 1), dx(n + 1);
      ul(dg, off, g);
      ul(dp, off, pre);
      bf16* dx_ptr = in_place ? dg.get() + off : dx.get() + off;
      kernels::gelu_backward(nullptr, dg.get() + off, dp.get() + off, dx_ptr, n, kind);
      auto got_dx = dl(in_place ? dg : dx, off, n);
      ASSERT_EQ(test::count_nan(got_dx), 0u) << "din not fully written";
      EXPECT_LE(test::rel_error(got_dx, ref::gelu_backward(g.data(), pre.data(), n, tanh)), 1e-2);
      if (!in_place) {
        // Determinism: a second run gives the same bits.
        dx.poison();
        kernels::gelu_backward(nullptr, dg.get() + off, dp.get() + off, dx_ptr, n, kind);
        EXPECT_EQ(bits_of(dl(dx, off, n)), bits_of(got_dx));
      }
    }
  }
}

// Shapes where the grid-stride loop runs several (partial) iterations: every element written,
// forward (pre_out bits, out) and backward against the reference, and a second run gives the
// same bits.
TEST(GeluGpu, GridStrideShapesAreDeterministic) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Shape& s : {Shape{3001, 4104}, Shape{1, 13}, Shape{7, 1030}, Shape{1025, 2048}}) {
    for (bool tanh : {false, true}) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols) + (tanh ? " tanh" : " erf") +
                     (with_bias ? " bias" : ""));
        const auto kind = tanh ? kernels::GeluKind::Tanh : kernels::GeluKind::Erf;
        const std::size_t n = static_cast<std::size_t>(s.rows) * s.cols;
        const auto in = test::round_bf16(test::random_normal(n, rng, 0.f, 3.f));
        const auto bias = test::round_bf16(test::random_normal(s.cols, rng, 0.f, 0.5f));
        const auto g = test::round_bf16(test::random_normal(n, rng));
        test::DeviceArray<bf16> din(test::to_bf16(in)), dbias(test::to_bf16(bias)), dg(test::to_bf16(g));
        const auto want = ref::gelu_forward(in.data(), with_bias ? bias.data() : nullptr, s.rows, s.cols, tanh);
        std::vector<float> outs[2], pres[2], dxs[2];
        for (int k = 0; k < 2; ++k) {
          test::DeviceArray<bf16> out(n), pre(n), dx(n);
          out.poison();
          pre.poison();
          dx.poison();
          kernels::gelu_forward(nullptr, din.get(), with_bias ? dbias.get() : nullptr, with_bias ? pre.get() : nullptr,
                                out.get(), s.rows, s.cols, kind);
          kernels::gelu_backward(nullptr, dg.get(), din.get(), dx.get(), n, kind);
          outs[k] = test::download_float(out);
          dxs[k] = test::download_float(dx);
          if (with_bias) pres[k] = test::download_float(pre);
          ASSERT_EQ(test::count_nan(outs[k]) + test::count_nan(dxs[k]) + test::count_nan(pres[k]), 0u)
              << "run " << k + 1 << ": an output was not fully written";
        }
        EXPECT_EQ(bits_of(outs[1]), bits_of(outs[0])) << "forward differs between runs";
        EXPECT_EQ(bits_of(pres[1]), bits_of(pres[0])) << "pre_out differs between runs";
        EXPECT_EQ(bits_of(dxs[1]), bits_of(dxs[0])) << "backward differs between runs";
        if (with_bias) {
          EXPECT_EQ(bits_of(pres[0]), bits_of(want.pre)) << "pre must be the bf16-rounded in + bias";
        }
        EXPECT_LE(test::rel_error(outs[0], want.out), 1e-2);
        EXPECT_LE(test::rel_error(dxs[0], ref::gelu_backward(g.data(), in.data(), n, tanh)), 1e-2);
      }
    }
  }
}

// Every bf16 value in [-12, 12] (each bit pattern once, tails included), both kinds, vector path:
// forward and backward within one bf16 step (the bf16 ulp at the fp64 value) of the fp64 GELU.
// Absolute slack: backward 1e-5 (gelu' crosses zero near -0.75, where fp32 Φ + xφ cancels);
// forward 1e-30 for the tanh kind, 1e-12 for the erf kind's fitted Φ (its relative error grows
// where |gelu| < 4e-14; below x = -10 its clamp gives |gelu| < 1e-22).
TEST(GeluGpu, EveryBf16InputWithinOneBf16Step) {
  CUTRAIN_REQUIRE_GPU();
  std::vector<float> in;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float x = bf16_bits_to_f32(static_cast<uint16_t>(b));
    // (bf16 subnormal results would round coarsely whatever the math: inputs >= 1e-30 or zero)
    if (std::isfinite(x) && std::abs(x) <= 12.f && (x == 0.f || std::abs(x) >= 1e-30f)) in.push_back(x);
  }
  in.resize(in.size() / 8 * 8 + 3);  // a 3-element tail after the vectors (values repeat: fine)
  for (std::size_t i = in.size() - 3; i < in.size(); ++i) in[i] = -0.5f * static_cast<float>(i % 7);
  const std::size_t n = in.size();
  for (bool tanh : {false, true}) {
    SCOPED_TRACE(tanh ? "tanh" : "erf");
    const auto kind = tanh ? kernels::GeluKind::Tanh : kernels::GeluKind::Erf;
    const double fwd_slack = tanh ? 1e-30 : 1e-12;
    test::DeviceArray<bf16> d(test::to_bf16(in)), o(n), ones(test::to_bf16(std::vector<float>(n, 1.f))), dx(n);
    kernels::gelu_forward(nullptr, d.get(), nullptr, nullptr, o.get(), 1, static_cast<int>(n), kind);
    kernels::gelu_backward(nullptr, ones.get(), d.get(), dx.get(), n, kind);
    const auto got = test::download_float(o), got_dx = test::download_float(dx);
    ASSERT_EQ(test::count_nan(got) + test::count_nan(got_dx), 0u) << "an output was not fully written";
    int bad = 0;
    // One bf16 step at v: 2^(exponent - 7) (8 significant bits). Correct rounding is within half
    // of it; a CPU emulation of the exact path (fp32 erff/erfcf, bf16 rounding) lands within 0.5.
    auto bf16_step = [](double v) { return v == 0 ? 0.0 : std::ldexp(1.0, std::ilogb(v) - 7); };
    for (std::size_t i = 0; i < n; ++i) {
      const double x = in[i], y = tanh ? ref::gelu_tanh(x) : ref::gelu_erf(x);
      const double dy = tanh ? ref::gelu_tanh_grad(x) : ref::gelu_erf_grad(x);
      const bool ok = std::abs(got[i] - y) <= bf16_step(y) + fwd_slack &&
                      std::abs(got_dx[i] - dy) <= bf16_step(dy) + 1e-5;
      if (!ok && ++bad <= 10)
        ADD_FAILURE() << "x=" << x << ": gelu " << got[i] << " want " << y << ", gelu' " << got_dx[i] << " want " << dy;
    }
    EXPECT_EQ(bad, 0);
  }
}

// Large magnitudes and the region around 0, where erf vs tanh and the derivative's shape matter.
TEST(GeluGpu, TailsAndZero) {
  CUTRAIN_REQUIRE_GPU();
  std::vector<float> in;
  for (float x = -12.f; x <= 12.f; x += 0.0625f) in.push_back(round_bf16(x));
  const int n = static_cast<int>(in.size());
  for (bool tanh : {false, true}) {
    SCOPED_TRACE(tanh ? "tanh" : "erf");
    const auto kind = tanh ? kernels::GeluKind::Tanh : kernels::GeluKind::Erf;
    test::DeviceArray<bf16> d(test::to_bf16(in)), o(n), ones(test::to_bf16(std::vector<float>(n, 1.f))), dx(n);
    kernels::gelu_forward(nullptr, d.get(), nullptr, nullptr, o.get(), 1, n, kind);
    kernels::gelu_backward(nullptr, ones.get(), d.get(), dx.get(), n, kind);
    auto got = test::download_float(o), got_dx = test::download_float(dx);
    for (int i = 0; i < n; ++i) {
      const double x = in[i];
      const double y = tanh ? ref::gelu_tanh(x) : ref::gelu_erf(x);
      const double dy = tanh ? ref::gelu_tanh_grad(x) : ref::gelu_erf_grad(x);
      EXPECT_NEAR(got[i], y, 1e-2 * std::abs(y) + 1e-6) << "x=" << x;
      EXPECT_NEAR(got_dx[i], dy, 1e-2 * std::abs(dy) + 1e-6) << "x=" << x;
    }
  }
}

TEST(GeluArgs, BadArgumentsAreErrors) {
  bf16* p = reinterpret_cast<bf16*>(std::uintptr_t{256});
  bf16* q = reinterpret_cast<bf16*>(std::uintptr_t{512});
  EXPECT_THROW(kernels::gelu_forward(nullptr, p, nullptr, nullptr, q, 0, 8), Error);
  EXPECT_THROW(kernels::gelu_forward(nullptr, p, nullptr, nullptr, q, 4, 0), Error);
  EXPECT_THROW(kernels::gelu_forward<bf16>(nullptr, nullptr, nullptr, nullptr, q, 4, 8), Error);
  EXPECT_THROW(kernels::gelu_forward(nullptr, p, q, p, q, 4, 8), Error);  // pre_out aliases in
  EXPECT_THROW(kernels::gelu_backward(nullptr, p, q, q, 8), Error);        // din aliases pre
  EXPECT_THROW(kernels::gelu_backward(nullptr, p, q, p, 0), Error);
}

// The fp16 instance (fp16 training): the same math on fp16 storage, every path (vector and scalar,
// bias, erf and tanh), against the fp64 reference. Tolerance 3e-3: fp16 keeps 11 significant bits
// (one rounding of the output is at most 2^-11 relative), against bf16's 1e-2 for 8 bits.
TEST(GeluGpu, Fp16MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Shape& s : kShapes) {
    for (int variant = 0; variant < 8; ++variant) {
      const bool tanh = variant & 1, with_bias = variant & 2, misalign = variant & 4;
      SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols) + (tanh ? " tanh" : " erf") +
                   (with_bias ? " bias" : "") + (misalign ? " misaligned" : "") + " fp16");
      const auto kind = tanh ? kernels::GeluKind::Tanh : kernels::GeluKind::Erf;
      const std::size_t n = static_cast<std::size_t>(s.rows) * s.cols, off = misalign ? 1 : 0;
      const auto in = test::round_f16(test::random_normal(n, rng, 0.f, 2.f));
      const auto bias = test::round_f16(test::random_normal(s.cols, rng, 0.f, 0.5f));
      std::vector<float> in_h(n + 1, 0.f);
      std::copy(in.begin(), in.end(), in_h.begin() + off);
      test::DeviceArray<f16> din(test::to_f16(in_h)), dbias(test::to_f16(bias)), dpre(n + 1), dout(n + 1);
      kernels::gelu_forward(nullptr, din.get() + off, with_bias ? dbias.get() : nullptr,
                            with_bias ? dpre.get() + off : nullptr, dout.get() + off, s.rows, s.cols, kind);
      const auto want =
          ref::gelu_forward(in.data(), with_bias ? bias.data() : nullptr, s.rows, s.cols, tanh, DType::F16);
      auto got = test::download_float(dout);
      got.erase(got.begin(), got.begin() + off);
      got.resize(n);
      ASSERT_EQ(test::count_nan(got), 0u) << "out not fully written";
      EXPECT_LE(test::rel_error(got, want.out), 3e-3);
      std::vector<float> pre = in;
      if (with_bias) {
        pre = test::download_float(dpre);
        pre.erase(pre.begin(), pre.begin() + off);
        pre.resize(n);
        EXPECT_EQ(pre, want.pre) << "pre must be the fp16-rounded in + bias";
      }
      const auto g = test::round_f16(test::random_normal(n, rng));
      std::vector<float> g_h(n + 1, 0.f), pre_h(n + 1, 0.f);
      std::copy(g.begin(), g.end(), g_h.begin() + off);
      std::copy(pre.begin(), pre.end(), pre_h.begin() + off);
      test::DeviceArray<f16> dg(test::to_f16(g_h)), dp(test::to_f16(pre_h)), dx(n + 1);
      kernels::gelu_backward(nullptr, dg.get() + off, dp.get() + off, dx.get() + off, n, kind);
      auto got_dx = test::download_float(dx);
      got_dx.erase(got_dx.begin(), got_dx.begin() + off);
      got_dx.resize(n);
      ASSERT_EQ(test::count_nan(got_dx), 0u) << "din not fully written";
      EXPECT_LE(test::rel_error(got_dx, ref::gelu_backward(g.data(), pre.data(), n, tanh)), 3e-3);
    }
  }
}
