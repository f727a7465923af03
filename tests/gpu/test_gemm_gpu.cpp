// @brief GPU tests of kernels/gemm (the cuBLASLt wrapper and bias_grad) against the fp64 CPU references
// in tests/reference/gemm_ref.h: fresh random inputs, outputs poisoned with NaN first (so every
// element must be written), odd shapes and the model's shapes at small M, both the fused
// epilogues and their fallbacks, accumulation, determinism, alignment and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm.cuh"
#include "runtime/allocator.h"
#include "tests/reference/gemm_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using kernels::Gemm;
using kernels::GemmEpilogue;
using test::DeviceArray;

namespace {

constexpr double kBf16Tol = 1e-2;
// fp32 outputs from bf16 inputs: the only error left is fp32 accumulation (~1e-6); 1e-3 still
// catches any real mistake while leaving room for split-K orderings.
constexpr double kF32GemmTol = 1e-3;
constexpr double kF32SumTol = 1e-5;

struct Shape {
  int M, N, K;
};
std::string str(const Shape& s) {
  return std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
}

// Odd shapes (fallback algorithms, unfused epilogues), tiny ones, and the BF16 example's linear
// layers at small M (in_proj, ff1, ff2, output projection).
const std::vector<Shape> kShapes = {{7, 13, 5},    {1, 1, 1},       {3, 8, 16},     {33, 17, 65},
                                    {64, 128, 96}, {130, 1000, 24}, {96, 3072, 1024}, {64, 4096, 1024},
                                    {64, 1024, 4096}, {8, 50000, 1024}};

// A bf16 device tensor with its host copy (already rounded to bf16, so the reference sees
// exactly the GPU's input).
struct Tensor {
  std::vector<float> host;
  DeviceArray<bf16> dev;
};
Tensor make_tensor(std::size_t n, std::mt19937_64& rng, float stddev = 1.f) {
  Tensor t{test::round_bf16(test::random_normal(n, rng, 0.f, stddev)), DeviceArray<bf16>()};
  t.dev = DeviceArray<bf16>(test::to_bf16(t.host));
  return t;
}

std::vector<std::uint16_t> bits_of(const DeviceArray<bf16>& a) {
  auto h = a.download();
  std::vector<std::uint16_t> b(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) b[i] = bits(h[i]);
  return b;
}
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
bool all_poisoned(const DeviceArray<bf16>& a) {
  for (auto b : bits_of(a))
    if (b != 0xFFFF) return false;
  return true;
}

const char* name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None: return "none";
    case GemmEpilogue::Bias: return "bias";
    case GemmEpilogue::BiasGeluTanh: return "bias_gelu_tanh";
  }
  return "?";
}

// Every element written (none left NaN from the poison) and within `tol` of the reference.
template <typename Want>
void expect_written_and_close(const std::vector<float>& got, const Want& want, double tol, const std::string& what) {
  EXPECT_EQ(test::count_nan(got), 0u) << what << (what.empty() ? "" : ": ") << "unwritten (NaN) outputs";
  EXPECT_LE(test::rel_error(got, want), tol) << what;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// forward
// ---------------------------------------------------------------------------------------------

TEST(GemmGpu, ForwardMatchesReferenceForEveryEpilogue) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  for (const Shape& s : kShapes) {
    auto x = make_tensor(std::size_t(s.M) * s.K, rng);
    auto w = make_tensor(std::size_t(s.N) * s.K, rng, 1.f / std::sqrt(float(s.K)));
    auto b = make_tensor(s.N, rng, 0.5f);
    for (GemmEpilogue ep : {GemmEpilogue::None, GemmEpilogue::Bias, GemmEpilogue::BiasGeluTanh}) {
      SCOPED_TRACE(str(s) + " epilogue " + name(ep));
      const bool has_bias = ep != GemmEpilogue::None, gelu = ep == GemmEpilogue::BiasGeluTanh;
      // GELU's negative tail multiplies the relative error of its input by up to ~10 (pre = -3),
      // so a single-element output can legitimately miss 1e-2; the norm over more elements cannot.
      if (gelu && std::size_t(s.M) * s.N < 64) continue;
      DeviceArray<bf16> y(std::size_t(s.M) * s.N), aux(gelu ? std::size_t(s.M) * s.N : 0);
      gemm.forward(nullptr, x.dev.get(), w.dev.get(), has_bias ? b.dev.get() : nullptr, y.get(), s.M, s.N, s.K, ep,
                   gelu ? aux.get() : nullptr);
      std::vector<double> pre;
      const auto want = ref::gemm_forward(x.host, w.host, has_bias ? b.host.data() : nullptr, s.M, s.N, s.K, gelu,
                                          gelu ? &pre : nullptr);
      const auto got = test::download_float(y);
      expect_written_and_close(got, want, kBf16Tol, "");
      if (gelu) {
        const auto got_pre = test::download_float(aux);
        EXPECT_EQ(test::count_nan(got_pre), 0u) << "unwritten (NaN) pre-activations";
        EXPECT_LE(test::rel_error(got_pre, pre), kBf16Tol) << "aux (pre-activation)";
      }
    }
  }
}

// At the model's shapes (all dims multiples of 8, 256-byte aligned buffers) every epilogue must
// run fused in cuBLASLt; a silent fallback would still be correct but slow.
// The fp32-output forward (the MoE gate's logits): every element written, fp32 accuracy, at odd
// shapes and with an output that is only 4-byte aligned.
TEST(GemmGpu, ForwardFp32MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  for (const Shape& s : std::vector<Shape>{{7, 13, 5}, {1, 1, 1}, {33, 17, 65}, {8192, 64, 1024}, {100, 2, 96}}) {
    SCOPED_TRACE(str(s));
    Tensor x = make_tensor(std::size_t(s.M) * s.K, rng), w = make_tensor(std::size_t(s.N) * s.K, rng, 0.1f);
    DeviceArray<float> y(std::size_t(s.M) * s.N + 1);
    gemm.forward_fp32(nullptr, x.dev.get(), w.dev.get(), y.get() + 1, s.M, s.N, s.K);
    const auto all = y.download();
    const std::vector<float> got(all.begin() + 1, all.end());
    EXPECT_EQ(test::count_nan(got), 0u);
    EXPECT_LT(test::rel_error(got, ref::gemm_forward(x.host, w.host, nullptr, s.M, s.N, s.K)), kF32GemmTol);
  }
}

TEST(GemmGpu, FusedEpiloguesAreUsedAtModelShapes) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  for (const Shape& s : {Shape{96, 3072, 1024}, Shape{64, 4096, 1024}, Shape{64, 1024, 4096}}) {
    SCOPED_TRACE(str(s));
    auto x = make_tensor(std::size_t(s.M) * s.K, rng), w = make_tensor(std::size_t(s.N) * s.K, rng, 0.03f);
    auto b = make_tensor(s.N, rng), dy = make_tensor(std::size_t(s.M) * s.N, rng);
    auto pre = make_tensor(std::size_t(s.M) * s.K, rng);
    DeviceArray<bf16> y(std::size_t(s.M) * s.N), aux(std::size_t(s.M) * s.N), dx(std::size_t(s.M) * s.K);
    gemm.forward(nullptr, x.dev.get(), w.dev.get(), b.dev.get(), y.get(), s.M, s.N, s.K, GemmEpilogue::Bias);
    EXPECT_EQ(gemm.fallback_count(), 0u) << "Bias epilogue not fused";
    gemm.forward(nullptr, x.dev.get(), w.dev.get(), b.dev.get(), y.get(), s.M, s.N, s.K, GemmEpilogue::BiasGeluTanh,
                 aux.get());
    EXPECT_EQ(gemm.fallback_count(), 0u) << "GELU_AUX_BIAS epilogue not fused";
    gemm.grad_input(nullptr, dy.dev.get(), w.dev.get(), dx.get(), s.M, s.N, s.K, 0.f, pre.dev.get());
    EXPECT_EQ(gemm.fallback_count(), 0u) << "DGELU epilogue not fused";
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // An odd N cannot fuse GELU (aux ld must be a multiple of 8): the fallback is taken and counted.
  auto x = make_tensor(5 * 16, rng), w = make_tensor(13 * 16, rng), b = make_tensor(13, rng);
  DeviceArray<bf16> y(5 * 13), aux(5 * 13);
  gemm.forward(nullptr, x.dev.get(), w.dev.get(), b.dev.get(), y.get(), 5, 13, 16, GemmEpilogue::BiasGeluTanh, aux.get());
  EXPECT_EQ(gemm.fallback_count(), 1u);
}

TEST(GemmGpu, MisalignedPointersStillGiveTheRightResult) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  const Shape s{37, 24, 40};
  // Each operand starts 1..3 bf16 elements into its allocation: 2-byte, not 16-byte aligned.
  auto xs = make_tensor(std::size_t(s.M) * s.K + 1, rng);
  auto ws = make_tensor(std::size_t(s.N) * s.K + 3, rng, 0.2f);
  auto bs = make_tensor(s.N + 1, rng);
  std::vector<float> x(xs.host.begin() + 1, xs.host.end()), w(ws.host.begin() + 3, ws.host.end()),
      b(bs.host.begin() + 1, bs.host.end());
  DeviceArray<bf16> y(std::size_t(s.M) * s.N + 1), aux(std::size_t(s.M) * s.N + 1);
  gemm.forward(nullptr, xs.dev.get() + 1, ws.dev.get() + 3, bs.dev.get() + 1, y.get() + 1, s.M, s.N, s.K,
               GemmEpilogue::BiasGeluTanh, aux.get() + 1);
  std::vector<double> pre;
  const auto want = ref::gemm_forward(x, w, b.data(), s.M, s.N, s.K, true, &pre);
  auto got = test::download_float(y);
  EXPECT_TRUE(std::isnan(got[0])) << "wrote before the output";
  got.erase(got.begin());
  EXPECT_EQ(test::count_nan(got), 0u);
  EXPECT_LE(test::rel_error(got, want), kBf16Tol);
  auto got_pre = test::download_float(aux);
  got_pre.erase(got_pre.begin());
  EXPECT_LE(test::rel_error(got_pre, pre), kBf16Tol);

  // grad_weight (fp32) with misaligned dy / x / dw.
  auto dys = make_tensor(std::size_t(s.M) * s.N + 1, rng);
  std::vector<float> dy(dys.host.begin() + 1, dys.host.end());
  DeviceArray<float> dw(std::size_t(s.N) * s.K + 1);
  gemm.grad_weight(nullptr, dys.dev.get() + 1, xs.dev.get() + 1, dw.get() + 1, DType::F32, s.M, s.N, s.K, false);
  auto got_dw = dw.download();
  got_dw.erase(got_dw.begin());
  EXPECT_LE(test::rel_error(got_dw, ref::gemm_grad_weight(dy, x, s.M, s.N, s.K)), kF32GemmTol);
}

// ---------------------------------------------------------------------------------------------
// grad_input
// ---------------------------------------------------------------------------------------------

TEST(GemmGpu, GradInputMatchesReferenceWithBetaAndDgelu) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  for (const Shape& s : kShapes) {
    auto dy = make_tensor(std::size_t(s.M) * s.N, rng);
    auto w = make_tensor(std::size_t(s.N) * s.K, rng, 1.f / std::sqrt(float(s.N)));
    auto init = make_tensor(std::size_t(s.M) * s.K, rng);
    auto pre = make_tensor(std::size_t(s.M) * s.K, rng, 1.5f);
    struct Case {
      const char* what;
      float beta;
      bool dgelu;
    };
    for (const Case c : {Case{"beta0", 0.f, false}, Case{"beta1", 1.f, false}, Case{"dgelu", 0.f, true}}) {
      SCOPED_TRACE(str(s) + " " + c.what);
      DeviceArray<bf16> dx(std::size_t(s.M) * s.K);  // poisoned
      if (c.beta != 0.f) dx.upload(test::to_bf16(init.host));
      gemm.grad_input(nullptr, dy.dev.get(), w.dev.get(), dx.get(), s.M, s.N, s.K, c.beta,
                      c.dgelu ? pre.dev.get() : nullptr);
      const auto want = ref::gemm_grad_input(dy.host, w.host, s.M, s.N, s.K, c.beta,
                                             c.beta != 0.f ? &init.host : nullptr, c.dgelu ? &pre.host : nullptr);
      const auto got = test::download_float(dx);
      expect_written_and_close(got, want, kBf16Tol, "");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// grad_weight
// ---------------------------------------------------------------------------------------------

TEST(GemmGpu, GradWeightMatchesReferenceBf16AndF32WithAccumulate) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  for (const Shape& s : kShapes) {
    auto dy = make_tensor(std::size_t(s.M) * s.N, rng);
    auto x = make_tensor(std::size_t(s.M) * s.K, rng);
    const std::size_t n = std::size_t(s.N) * s.K;
    // An existing gradient as large as the product (std sqrt(M)), so a dropped or doubled
    // accumulation shows far above the tolerance.
    const auto init = test::round_bf16(test::random_normal(n, rng, 0.f, std::sqrt(float(s.M))));
    const auto fresh = ref::gemm_grad_weight(dy.host, x.host, s.M, s.N, s.K);
    const auto accumulated = ref::gemm_grad_weight(dy.host, x.host, s.M, s.N, s.K, &init);
    for (bool acc : {false, true}) {
      SCOPED_TRACE(str(s) + (acc ? " accumulate" : " overwrite"));
      const auto& want = acc ? accumulated : fresh;
      {
        DeviceArray<float> dw(n);
        if (acc) dw.upload(init);
        gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), dw.get(), DType::F32, s.M, s.N, s.K, acc);
        const auto got = dw.download();
        expect_written_and_close(got, want, kF32GemmTol, "fp32");
      }
      {
        DeviceArray<bf16> dw(n);
        if (acc) dw.upload(test::to_bf16(init));
        gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), dw.get(), DType::BF16, s.M, s.N, s.K, acc);
        const auto got = test::download_float(dw);
        expect_written_and_close(got, want, kBf16Tol, "bf16");
      }
    }
  }
}

TEST(GemmGpu, AccumulateReallyAdds) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  const Shape s{48, 40, 72};
  auto dy = make_tensor(std::size_t(s.M) * s.N, rng);
  auto x = make_tensor(std::size_t(s.M) * s.K, rng);
  auto w = make_tensor(std::size_t(s.N) * s.K, rng);
  // Twice the same wgrad into fp32 with accumulate from zero = 2x the product.
  DeviceArray<float> dw(std::size_t(s.N) * s.K);
  dw.upload(std::vector<float>(dw.size(), 0.f));
  gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), dw.get(), DType::F32, s.M, s.N, s.K, true);
  gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), dw.get(), DType::F32, s.M, s.N, s.K, true);
  auto want = ref::gemm_grad_weight(dy.host, x.host, s.M, s.N, s.K);
  for (auto& v : want) v *= 2;
  EXPECT_LE(test::rel_error(dw.download(), want), kF32GemmTol);
  // grad_input with beta = 1 twice from zero = 2x too.
  DeviceArray<bf16> dx(std::vector<bf16>(std::size_t(s.M) * s.K, to_bf16(0.f)));
  gemm.grad_input(nullptr, dy.dev.get(), w.dev.get(), dx.get(), s.M, s.N, s.K, 1.f);
  gemm.grad_input(nullptr, dy.dev.get(), w.dev.get(), dx.get(), s.M, s.N, s.K, 1.f);
  auto want_dx = ref::gemm_grad_input(dy.host, w.host, s.M, s.N, s.K);
  for (auto& v : want_dx) v *= 2;
  EXPECT_LE(test::rel_error(test::download_float(dx), want_dx), kBf16Tol);
}

// ---------------------------------------------------------------------------------------------
// determinism, the plan cache, the allocator, workspace size
// ---------------------------------------------------------------------------------------------

TEST(GemmGpu, EveryGemmIsBitwiseDeterministic) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  for (const Shape& s : {Shape{256, 1024, 4096}, Shape{64, 4096, 1024}, Shape{7, 13, 5}}) {
    SCOPED_TRACE(str(s));
    auto x = make_tensor(std::size_t(s.M) * s.K, rng), w = make_tensor(std::size_t(s.N) * s.K, rng, 0.05f);
    auto b = make_tensor(s.N, rng), dy = make_tensor(std::size_t(s.M) * s.N, rng);
    auto pre = make_tensor(std::size_t(s.M) * s.K, rng);
    std::vector<std::uint16_t> y_bits[2], aux_bits[2], dx_bits[2], dxg_bits[2];
    std::vector<float> dw_bits[2];
    for (int run = 0; run < 2; ++run) {
      DeviceArray<bf16> y(std::size_t(s.M) * s.N), aux(std::size_t(s.M) * s.N), dx(std::size_t(s.M) * s.K),
          dxg(std::size_t(s.M) * s.K);
      DeviceArray<float> dw(std::size_t(s.N) * s.K);
      gemm.forward(nullptr, x.dev.get(), w.dev.get(), b.dev.get(), y.get(), s.M, s.N, s.K, GemmEpilogue::BiasGeluTanh,
                   aux.get());
      gemm.grad_input(nullptr, dy.dev.get(), w.dev.get(), dx.get(), s.M, s.N, s.K);
      gemm.grad_input(nullptr, dy.dev.get(), w.dev.get(), dxg.get(), s.M, s.N, s.K, 0.f, pre.dev.get());
      gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), dw.get(), DType::F32, s.M, s.N, s.K, false);
      y_bits[run] = bits_of(y);
      aux_bits[run] = bits_of(aux);
      dx_bits[run] = bits_of(dx);
      dxg_bits[run] = bits_of(dxg);
      dw_bits[run] = dw.download();
    }
    EXPECT_TRUE(same_bits(y_bits[0], y_bits[1])) << "forward y";
    EXPECT_TRUE(same_bits(aux_bits[0], aux_bits[1])) << "forward aux";
    EXPECT_TRUE(same_bits(dx_bits[0], dx_bits[1])) << "grad_input";
    EXPECT_TRUE(same_bits(dxg_bits[0], dxg_bits[1])) << "grad_input dgelu";
    EXPECT_TRUE(same_bits(dw_bits[0], dw_bits[1])) << "grad_weight";
  }
}

TEST(GemmGpu, PlansAreCachedPerShapeAndEpilogue) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  auto x = make_tensor(64 * 32, rng), w = make_tensor(48 * 32, rng), b = make_tensor(48, rng);
  DeviceArray<bf16> y(64 * 48);
  EXPECT_EQ(gemm.plan_count(), 0u);
  gemm.forward(nullptr, x.dev.get(), w.dev.get(), nullptr, y.get(), 64, 48, 32);
  EXPECT_EQ(gemm.plan_count(), 1u);
  gemm.forward(nullptr, x.dev.get(), w.dev.get(), nullptr, y.get(), 64, 48, 32);
  EXPECT_EQ(gemm.plan_count(), 1u) << "same key must reuse the plan";
  gemm.forward(nullptr, x.dev.get(), w.dev.get(), b.dev.get(), y.get(), 64, 48, 32, GemmEpilogue::Bias);
  EXPECT_EQ(gemm.plan_count(), 2u) << "another epilogue is another plan";
  gemm.forward(nullptr, x.dev.get(), w.dev.get(), nullptr, y.get(), 32, 48, 32);
  EXPECT_EQ(gemm.plan_count(), 3u) << "another M is another plan";
}

TEST(GemmGpu, WorkspaceFromTheCachingAllocatorOrNone) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const Shape s{128, 256, 512};
  auto x = make_tensor(std::size_t(s.M) * s.K, rng), w = make_tensor(std::size_t(s.N) * s.K, rng, 0.05f);
  const auto want = ref::gemm_forward(x.host, w.host, nullptr, s.M, s.N, s.K);
  CachingAllocator alloc(make_device_source());
  {
    Gemm gemm(&alloc, 8u << 20);
    EXPECT_GE(alloc.stats().allocated_bytes.current, std::int64_t(8u << 20)) << "workspace not from the allocator";
    DeviceArray<bf16> y(std::size_t(s.M) * s.N);
    gemm.forward(nullptr, x.dev.get(), w.dev.get(), nullptr, y.get(), s.M, s.N, s.K);
    EXPECT_LE(test::rel_error(test::download_float(y), want), kBf16Tol);
  }
  EXPECT_EQ(alloc.stats().allocated_bytes.current, 0) << "workspace not returned";
  Gemm no_ws(nullptr, 0);
  DeviceArray<bf16> y(std::size_t(s.M) * s.N);
  no_ws.forward(nullptr, x.dev.get(), w.dev.get(), nullptr, y.get(), s.M, s.N, s.K);
  EXPECT_LE(test::rel_error(test::download_float(y), want), kBf16Tol) << "without workspace";
}

// ---------------------------------------------------------------------------------------------
// argument errors: thrown before any launch, outputs untouched
// ---------------------------------------------------------------------------------------------

TEST(GemmGpu, InvalidArgumentsThrowAndLeaveOutputsUntouched) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  const int M = 16, N = 24, K = 32;
  auto x = make_tensor(M * K, rng), w = make_tensor(N * K, rng), b = make_tensor(N, rng), dy = make_tensor(M * N, rng);
  DeviceArray<bf16> y(M * N), aux(M * N), dx(M * K), dwb(N * K);
  DeviceArray<float> dwf(N * K);
  const bf16* odd = reinterpret_cast<const bf16*>(reinterpret_cast<const char*>(x.dev.get()) + 1);
  auto expect_error = [](auto&& call, const char* needle) {
    try {
      call();
      ADD_FAILURE() << "no cutrain::Error thrown (expected one mentioning '" << needle << "')";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { gemm.forward(nullptr, x.dev.get(), w.dev.get(), nullptr, y.get(), 0, N, K); }, "M=0");
  expect_error([&] { gemm.forward(nullptr, x.dev.get(), w.dev.get(), nullptr, y.get(), M, -3, K); }, "N=-3");
  expect_error([&] { gemm.forward(nullptr, x.dev.get(), w.dev.get(), nullptr, y.get(), M, N, 0); }, "K=0");
  expect_error([&] { gemm.forward<bf16>(nullptr, nullptr, w.dev.get(), nullptr, y.get(), M, N, K); }, "`x`");
  expect_error([&] { gemm.forward(nullptr, odd, w.dev.get(), nullptr, y.get(), M, N, K); }, "aligned");
  expect_error([&] { gemm.forward(nullptr, x.dev.get(), w.dev.get(), nullptr, y.get(), M, N, K, GemmEpilogue::Bias); },
               "`bias`");
  expect_error([&] { gemm.forward(nullptr, x.dev.get(), w.dev.get(), b.dev.get(), y.get(), M, N, K); }, "epilogue None");
  expect_error([&] {
    gemm.forward(nullptr, x.dev.get(), w.dev.get(), b.dev.get(), y.get(), M, N, K, GemmEpilogue::BiasGeluTanh);
  }, "`aux`");
  expect_error([&] {
    gemm.forward(nullptr, x.dev.get(), w.dev.get(), b.dev.get(), y.get(), M, N, K, GemmEpilogue::BiasGeluTanh, y.get());
  }, "alias");
  expect_error([&] { gemm.grad_input(nullptr, dy.dev.get(), w.dev.get(), dx.get(), M, N, K, 1.f, x.dev.get()); },
               "beta");
  expect_error([&] { gemm.grad_input(nullptr, dy.dev.get(), w.dev.get(), dx.get(), -1, N, K); }, "M=-1");
  expect_error([&] { gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), dwf.get(), DType::I32, M, N, K, false); },
               "int32");
  expect_error([&] { gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), dwb.get(), DType::BF16, M, N, 0, false); },
               "K=0");
  expect_error([&] {
    gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), reinterpret_cast<char*>(dwf.get()) + 2, DType::F32, M, N, K,
                     false);
  }, "aligned");
  EXPECT_EQ(gemm.plan_count(), 0u) << "a rejected call must not reach cuBLASLt";
  EXPECT_TRUE(all_poisoned(y));
  EXPECT_TRUE(all_poisoned(aux));
  EXPECT_TRUE(all_poisoned(dx));
  EXPECT_TRUE(all_poisoned(dwb));
  for (float v : dwf.download()) ASSERT_TRUE(std::isnan(v));

  DeviceArray<float> db(N), scratch(kernels::bias_grad_scratch_bytes(M, N) / 4);
  expect_error([&] { kernels::bias_grad(nullptr, dy.dev.get(), db.get(), DType::F32, 0, N, false, scratch.get()); },
               "M=0");
  expect_error([&] { kernels::bias_grad(nullptr, dy.dev.get(), db.get(), DType::I32, M, N, false, scratch.get()); },
               "int32");
  // Past 8192 columns the wide tile needs scratch (the check fires before any access to dy).
  expect_error([&] { kernels::bias_grad(nullptr, dy.dev.get(), db.get(), DType::F32, M, 8193, false, nullptr); },
               "scratch");
  expect_error([&] { kernels::bias_grad_scratch_bytes(M, 0); }, "N=0");
  for (float v : db.download()) ASSERT_TRUE(std::isnan(v));
}

// ---------------------------------------------------------------------------------------------
// bias_grad
// ---------------------------------------------------------------------------------------------

TEST(BiasGradGpu, MatchesReferenceBf16AndF32WithAccumulate) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  // Both sides of the tile table's boundary (cluster tile up to N = 8192, wide tile beyond).
  const std::vector<std::pair<int, int>> shapes = {{1, 1},      {7, 13},      {31, 8},    {4097, 24},   {333, 1000},
                                                   {2048, 1024}, {1000, 4096}, {3, 50000}, {2048, 50000}, {9, 72},
                                                   {16385, 136}, {300, 8192},  {300, 8193}};
  for (auto [M, N] : shapes) {
    auto dy = make_tensor(std::size_t(M) * N, rng);
    const auto init = test::round_bf16(test::random_normal(N, rng, 0.f, std::sqrt(float(M))));
    DeviceArray<float> scratch(kernels::bias_grad_scratch_bytes(M, N) / sizeof(float));  // poisoned
    // Up to 8192 columns no scratch is needed: run those without (null) too.
    for (void* sc : {static_cast<void*>(scratch.get()), static_cast<void*>(nullptr)}) {
      if (!sc && N > 8192) continue;
      for (bool acc : {false, true}) {
        SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + (sc ? "" : " no scratch") +
                     (acc ? " accumulate" : ""));
        const auto want = ref::bias_grad(dy.host, M, N, acc ? &init : nullptr);
        DeviceArray<float> dbf(N);
        if (acc) dbf.upload(init);
        kernels::bias_grad(nullptr, dy.dev.get(), dbf.get(), DType::F32, M, N, acc, sc);
        const auto gotf = dbf.download();
        expect_written_and_close(gotf, want, kF32SumTol, "fp32");
        DeviceArray<bf16> dbb(N);
        if (acc) dbb.upload(test::to_bf16(init));
        kernels::bias_grad(nullptr, dy.dev.get(), dbb.get(), DType::BF16, M, N, acc, sc);
        const auto gotb = test::download_float(dbb);
        expect_written_and_close(gotb, want, kBf16Tol, "bf16");
      }
    }
  }
}

TEST(BiasGradGpu, MisalignedInputTakesTheScalarPathCorrectly) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const int M = 517;  // N % 8 == 0 but dy starts 1 element in: not 16-byte aligned
  for (int N : {1024, 8200}) {  // both tiles
    SCOPED_TRACE(N);
    auto buf = make_tensor(std::size_t(M) * N + 1, rng);
    std::vector<float> dy(buf.host.begin() + 1, buf.host.end());
    DeviceArray<float> db(N), scratch(kernels::bias_grad_scratch_bytes(M, N) / sizeof(float));
    kernels::bias_grad(nullptr, buf.dev.get() + 1, db.get(), DType::F32, M, N, false, scratch.get());
    const auto got = db.download();
    EXPECT_EQ(test::count_nan(got), 0u);
    EXPECT_LE(test::rel_error(got, ref::bias_grad(dy, M, N)), kF32SumTol);
  }
}

TEST(BiasGradGpu, IsBitwiseDeterministic) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (auto [M, N] : std::vector<std::pair<int, int>>{{16384, 4096}, {2048, 50000}, {999, 13}}) {
    auto dy = make_tensor(std::size_t(M) * N, rng);
    DeviceArray<float> scratch(kernels::bias_grad_scratch_bytes(M, N) / sizeof(float));
    SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N));
    std::vector<float> runs[2];
    for (auto& r : runs) {
      DeviceArray<float> db(N);
      kernels::bias_grad(nullptr, dy.dev.get(), db.get(), DType::F32, M, N, false, scratch.get());
      r = db.download();
    }
    EXPECT_TRUE(same_bits(runs[0], runs[1]));
  }
}

// ---------------------------------------------------------------------------------------------
// fp16 (fp16 training): the same GEMMs with CUDA_R_16F inputs and outputs, fp32 compute
// ---------------------------------------------------------------------------------------------

namespace {
// An fp16 device tensor with its host copy (fp16-rounded).
struct Tensor16 {
  std::vector<float> host;
  DeviceArray<f16> dev;
};
Tensor16 make_tensor16(std::size_t n, std::mt19937_64& rng, float stddev = 1.f) {
  Tensor16 t{test::round_f16(test::random_normal(n, rng, 0.f, stddev)), DeviceArray<f16>()};
  t.dev = DeviceArray<f16>(test::to_f16(t.host));
  return t;
}
// fp16 outputs keep 11 significant bits: one rounding of each output is at most 2^-11 relative,
// so 3e-3 (bf16's kBf16Tol is 1e-2 for 8 bits) still catches any real mistake.
constexpr double kF16Tol = 3e-3;
}  // namespace

TEST(GemmGpu, Fp16EveryOpMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  for (const Shape& s : kShapes) {
    auto x = make_tensor16(std::size_t(s.M) * s.K, rng);
    auto w = make_tensor16(std::size_t(s.N) * s.K, rng, 1.f / std::sqrt(float(s.K)));
    auto b = make_tensor16(s.N, rng, 0.5f);
    for (GemmEpilogue ep : {GemmEpilogue::None, GemmEpilogue::Bias, GemmEpilogue::BiasGeluTanh}) {
      SCOPED_TRACE(str(s) + " epilogue " + name(ep) + " fp16");
      const bool has_bias = ep != GemmEpilogue::None, gelu = ep == GemmEpilogue::BiasGeluTanh;
      if (gelu && std::size_t(s.M) * s.N < 64) continue;  // as in the bf16 test: GELU's tail
      DeviceArray<f16> y(std::size_t(s.M) * s.N), aux(gelu ? std::size_t(s.M) * s.N : 0);
      gemm.forward(nullptr, x.dev.get(), w.dev.get(), has_bias ? b.dev.get() : nullptr, y.get(), s.M, s.N, s.K, ep,
                   gelu ? aux.get() : nullptr);
      std::vector<double> pre;
      const auto want = ref::gemm_forward(x.host, w.host, has_bias ? b.host.data() : nullptr, s.M, s.N, s.K, gelu,
                                          gelu ? &pre : nullptr);
      expect_written_and_close(test::download_float(y), want, kF16Tol, "forward");
      if (gelu) expect_written_and_close(test::download_float(aux), pre, kF16Tol, "aux (pre-activation)");
    }
    {
      SCOPED_TRACE(str(s) + " forward_fp32 fp16");
      DeviceArray<float> y(std::size_t(s.M) * s.N);
      gemm.forward_fp32(nullptr, x.dev.get(), w.dev.get(), y.get(), s.M, s.N, s.K);
      expect_written_and_close(y.download(), ref::gemm_forward(x.host, w.host, nullptr, s.M, s.N, s.K), kF32GemmTol,
                               "forward_fp32");
    }
    auto dy = make_tensor16(std::size_t(s.M) * s.N, rng);
    for (bool beta : {false, true}) {
      SCOPED_TRACE(str(s) + (beta ? " grad_input beta 1" : " grad_input") + " fp16");
      const auto init = test::round_f16(test::random_normal(std::size_t(s.M) * s.K, rng));
      DeviceArray<f16> dx(std::size_t(s.M) * s.K);
      if (beta) dx.upload(test::to_f16(init));
      gemm.grad_input(nullptr, dy.dev.get(), w.dev.get(), dx.get(), s.M, s.N, s.K, beta ? 1.f : 0.f);
      const auto want = ref::gemm_grad_input(dy.host, w.host, s.M, s.N, s.K, beta ? 1.0 : 0.0, beta ? &init : nullptr);
      expect_written_and_close(test::download_float(dx), want, kF16Tol, "");
    }
    if (std::size_t(s.M) * s.K >= 64) {
      SCOPED_TRACE(str(s) + " grad_input dgelu fp16");
      const auto aux = test::round_f16(test::random_normal(std::size_t(s.M) * s.K, rng));
      DeviceArray<f16> daux(test::to_f16(aux)), dx(std::size_t(s.M) * s.K);
      gemm.grad_input(nullptr, dy.dev.get(), w.dev.get(), dx.get(), s.M, s.N, s.K, 0.f, daux.get());
      const auto want = ref::gemm_grad_input(dy.host, w.host, s.M, s.N, s.K, 0.0, nullptr, &aux);
      expect_written_and_close(test::download_float(dx), want, 1e-2, "");  // gelu' of the tail as in bf16
    }
    const std::size_t n = std::size_t(s.N) * s.K;
    const auto init = test::round_f16(test::random_normal(n, rng, 0.f, std::sqrt(float(s.M))));
    for (bool acc : {false, true}) {
      SCOPED_TRACE(str(s) + (acc ? " grad_weight accumulate" : " grad_weight") + " fp16");
      const auto want = ref::gemm_grad_weight(dy.host, x.host, s.M, s.N, s.K, acc ? &init : nullptr);
      DeviceArray<float> dw32(n);
      if (acc) dw32.upload(init);
      gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), dw32.get(), DType::F32, s.M, s.N, s.K, acc);
      expect_written_and_close(dw32.download(), want, kF32GemmTol, "fp32");
      DeviceArray<f16> dw16(n);
      if (acc) dw16.upload(test::to_f16(init));
      gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), dw16.get(), DType::F16, s.M, s.N, s.K, acc);
      expect_written_and_close(test::download_float(dw16), want, kF16Tol, "fp16");
    }
  }
  // A weight gradient of the other 16-bit type than the inputs is refused, naming both.
  auto x = make_tensor16(64, rng), dy = make_tensor16(64, rng);
  DeviceArray<bf16> wrong(64);
  const std::string err = test::error_of(
      [&] { gemm.grad_weight(nullptr, dy.dev.get(), x.dev.get(), wrong.get(), DType::BF16, 8, 8, 8, false); });
  EXPECT_NE(err.find("dw_type must be float16"), std::string::npos) << err;
}

TEST(BiasGradGpu, Fp16InputMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::vector<std::pair<int, int>> shapes = {{1, 1}, {7, 13}, {4097, 24}, {2048, 1024}, {3, 50000}, {300, 8193}};
  for (auto [M, N] : shapes) {
    auto dy = make_tensor16(std::size_t(M) * N, rng);
    const auto init = test::round_f16(test::random_normal(N, rng, 0.f, std::sqrt(float(M))));
    DeviceArray<float> scratch(kernels::bias_grad_scratch_bytes(M, N) / sizeof(float));
    for (bool acc : {false, true}) {
      SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + (acc ? " accumulate" : "") + " fp16");
      const auto want = ref::bias_grad(dy.host, M, N, acc ? &init : nullptr);
      DeviceArray<float> dbf(N);
      if (acc) dbf.upload(init);
      kernels::bias_grad(nullptr, dy.dev.get(), dbf.get(), DType::F32, M, N, acc, scratch.get());
      expect_written_and_close(dbf.download(), want, kF32SumTol, "fp32");
      DeviceArray<f16> dbh(N);
      if (acc) dbh.upload(test::to_f16(init));
      kernels::bias_grad(nullptr, dy.dev.get(), dbh.get(), DType::F16, M, N, acc, scratch.get());
      expect_written_and_close(test::download_float(dbh), want, kF16Tol, "fp16");
    }
  }
}
