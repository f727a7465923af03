// GPU tests of grad_norm_clip: the norm against the fp64 reference (bf16, fp16 and fp32 gradients,
// odd sizes, misaligned views), bitwise determinism, NaN/Inf detection, the clip coefficient, the
// device loss scale of fp16 training (the norm unscaled, 1/scale in the clip coefficient), n > 2^31.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/reduce.cuh"
#include "tests/reference/reduce_ref.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

using test::DeviceArray;

struct NormOut {
  float norm, clip;
  int nonfinite;
};

NormOut run_norm(const void* grads, DType gt, std::size_t n, float max_norm) {
  DeviceArray<float> norm(1), clip(1);
  DeviceArray<int> bad(1);
  DeviceArray<char> scratch(kernels::grad_norm_scratch_bytes(n));
  kernels::grad_norm_clip(nullptr, grads, gt, n, max_norm, norm.get(), clip.get(), bad.get(), scratch.get());
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  return {norm.download()[0], clip.download()[0], bad.download()[0]};
}

// Uploads `g` as `gt` (bf16 values must already be bf16-rounded) at an element offset `off`.
struct DeviceGrads {
  DeviceArray<bf16> b;
  DeviceArray<f16> h;
  DeviceArray<float> f;
  DType gt;
  std::size_t off;
  DeviceGrads(const std::vector<float>& g, DType t, std::size_t o) : gt(t), off(o) {
    if (gt == DType::BF16) {
      std::vector<float> padded(o, 0.f);
      padded.insert(padded.end(), g.begin(), g.end());
      b = DeviceArray<bf16>(test::to_bf16(padded));
    } else if (gt == DType::F16) {
      std::vector<float> padded(o, 0.f);
      padded.insert(padded.end(), g.begin(), g.end());
      h = DeviceArray<f16>(test::to_f16(padded));
    } else {
      std::vector<float> padded(o, 0.f);
      padded.insert(padded.end(), g.begin(), g.end());
      f = DeviceArray<float>(padded);
    }
  }
  const void* ptr() const {
    return gt == DType::BF16  ? static_cast<const void*>(b.get() + off)
           : gt == DType::F16 ? static_cast<const void*>(h.get() + off)
                              : static_cast<const void*>(f.get() + off);
  }
};

class GradNormGpu : public ::testing::TestWithParam<std::tuple<DType, std::size_t, std::size_t>> {};

TEST_P(GradNormGpu, MatchesReferenceAndIsDeterministic) {
  CUTRAIN_REQUIRE_GPU();
  auto [gt, n, off] = GetParam();
  auto rng = test::fresh_rng();
  auto g = test::random_normal(n, rng, 0.f, 1e-2f);
  if (gt == DType::BF16) g = test::round_bf16(g);
  if (gt == DType::F16) g = test::round_f16(g);
  DeviceGrads d(g, gt, off);
  const double want = ref::grad_norm(g);
  NormOut a = run_norm(d.ptr(), gt, n, 0.f);
  EXPECT_NEAR(a.norm, want, 1e-5 * want);
  EXPECT_EQ(a.nonfinite, 0);
  EXPECT_EQ(a.clip, 1.f);
  for (int rep = 0; rep < 3; ++rep) {
    NormOut b = run_norm(d.ptr(), gt, n, 0.f);
    EXPECT_EQ(std::memcmp(&a.norm, &b.norm, 4), 0) << "norm bits differ between runs";
  }
  // Clipping: half the norm -> coefficient ~0.5; twice the norm -> 1.
  NormOut c = run_norm(d.ptr(), gt, n, static_cast<float>(want / 2));
  EXPECT_NEAR(c.clip, ref::clip_scale(c.norm, want / 2), 1e-6);
  EXPECT_NEAR(c.clip, 0.5 * want / (want + 1e-6), 1e-5);
  NormOut e = run_norm(d.ptr(), gt, n, static_cast<float>(want * 2));
  EXPECT_EQ(e.clip, 1.f);
}

// The split path of data parallelism (ZeRO 1-2): grad_sumsq + grad_norm_from_sumsq gives exactly
// grad_norm_clip's bits on the whole buffer, and two halves' sums (added as an all-reduce would)
// give the whole's norm.
TEST_P(GradNormGpu, SumOfSquaresSplitGivesTheSameBits) {
  CUTRAIN_REQUIRE_GPU();
  auto [gt, n, off] = GetParam();
  auto rng = test::fresh_rng();
  auto g = test::random_normal(n, rng, 0.f, 1e-2f);
  if (gt == DType::BF16) g = test::round_bf16(g);
  if (gt == DType::F16) g = test::round_f16(g);
  DeviceGrads d(g, gt, off);
  const double want = ref::grad_norm(g);
  for (float max_norm : {0.f, static_cast<float>(want / 3)}) {
    const NormOut a = run_norm(d.ptr(), gt, n, max_norm);
    DeviceArray<double> sumsq(1);
    DeviceArray<float> norm(1), clip(1);
    DeviceArray<int> bad(1);
    DeviceArray<char> scratch(kernels::grad_norm_scratch_bytes(n));
    kernels::grad_sumsq(nullptr, d.ptr(), gt, n, sumsq.get(), scratch.get());
    kernels::grad_norm_from_sumsq(nullptr, sumsq.get(), max_norm, norm.get(), clip.get(), bad.get());
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    const float bn = norm.download()[0], bc = clip.download()[0];
    EXPECT_EQ(std::memcmp(&a.norm, &bn, 4), 0) << a.norm << " vs " << bn;
    EXPECT_EQ(std::memcmp(&a.clip, &bc, 4), 0) << a.clip << " vs " << bc;
    EXPECT_EQ(bad.download()[0], 0);
    EXPECT_NEAR(sumsq.download()[0], want * want, 1e-5 * want * want + 1e-30);
  }
  // Two halves (the first a whole number of 8-element vectors, as ZeRO partitions are).
  const std::size_t h = n / 16 * 8;
  const std::size_t es = dtype_size(gt);
  DeviceArray<double> s1(1), s2(1);
  DeviceArray<char> scratch(kernels::grad_norm_scratch_bytes(n));
  kernels::grad_sumsq(nullptr, d.ptr(), gt, h, s1.get(), scratch.get());
  kernels::grad_sumsq(nullptr, static_cast<const char*>(d.ptr()) + h * es, gt, n - h, s2.get(), scratch.get());
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_NEAR(std::sqrt(s1.download()[0] + s2.download()[0]), want, 1e-5 * want);
}

TEST(GradNormGpuNonfinite, SumOfSquaresCarriesNanToTheFlag) {
  CUTRAIN_REQUIRE_GPU();
  std::vector<float> g(1000, 0.5f);
  g[517] = std::nanf("");
  DeviceArray<float> d(g);
  DeviceArray<double> sumsq(1);
  DeviceArray<float> norm(1), clip(1);
  DeviceArray<int> bad(1);
  DeviceArray<char> scratch(kernels::grad_norm_scratch_bytes(g.size()));
  kernels::grad_sumsq(nullptr, d.get(), DType::F32, g.size(), sumsq.get(), scratch.get());
  kernels::grad_norm_from_sumsq(nullptr, sumsq.get(), 1.f, norm.get(), clip.get(), bad.get());
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(bad.download()[0], 1);
  EXPECT_EQ(clip.download()[0], 1.f);
}

INSTANTIATE_TEST_SUITE_P(Sizes, GradNormGpu,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F16, DType::F32),
                                            ::testing::Values(std::size_t(1), std::size_t(7), std::size_t(4097),
                                                              std::size_t(1000003), std::size_t(254128976)),
                                            ::testing::Values(std::size_t(0), std::size_t(1))),
                         [](const auto& i) {
                           return std::string(dtype_name(std::get<0>(i.param))) + "_n" +
                                  std::to_string(std::get<1>(i.param)) + "_off" + std::to_string(std::get<2>(i.param));
                         });

TEST(GradNormGpuNonfinite, NanAndInfAreFlagged) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::size_t n = 1000003;
  for (DType gt : {DType::BF16, DType::F16, DType::F32}) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      auto g = test::round_bf16(test::random_normal(n, rng, 0.f, 1.f));  // bf16 values are fp16 values here too
      const std::size_t where = test::random_ints(1, rng, 0, static_cast<int32_t>(n - 1))[0];
      g[where] = bad;
      DeviceGrads d(g, gt, 0);
      NormOut o = run_norm(d.ptr(), gt, n, 1.f);
      EXPECT_EQ(o.nonfinite, 1) << dtype_name(gt) << " " << bad << " at " << where;
      EXPECT_FALSE(std::isfinite(o.norm));
      EXPECT_EQ(o.clip, 1.f);
    }
    // The last element (the vector tail) is covered too.
    auto g = test::round_bf16(test::random_normal(n, rng, 0.f, 1.f));
    g[n - 1] = NAN;
    DeviceGrads d(g, gt, 0);
    EXPECT_EQ(run_norm(d.ptr(), gt, n, 1.f).nonfinite, 1);
  }
}

TEST(GradNormGpuLarge, MoreThan2Pow31Elements) {
  CUTRAIN_REQUIRE_GPU();
  const std::size_t n = (std::size_t(1) << 31) + 77;
  std::size_t free_b = 0, total_b = 0;
  CUTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < 2 * n + (std::size_t(1) << 30)) GTEST_SKIP() << "needs " << 2 * n / (1 << 30) << " GiB free";
  bf16* g = nullptr;
  CUTRAIN_CUDA_CHECK(cudaMalloc(&g, 2 * n));
  CUTRAIN_CUDA_CHECK(cudaMemset(g, 0x3C, 2 * n));  // every element bf16 0x3C3C
  NormOut o = run_norm(g, DType::BF16, n, 0.f);
  cudaFree(g);
  const double x = cutrain::bf16_bits_to_f32(0x3C3C);
  EXPECT_NEAR(o.norm, x * std::sqrt(static_cast<double>(n)), 1e-5 * x * std::sqrt(static_cast<double>(n)));
  EXPECT_EQ(o.nonfinite, 0);
}

TEST(GradNormGpuArgs, RejectsBadArguments) {
  CUTRAIN_REQUIRE_GPU();
  DeviceArray<float> g(8), norm(1);
  DeviceArray<char> scratch(kernels::grad_norm_scratch_bytes(8));
  EXPECT_THROW(kernels::grad_norm_clip(nullptr, g.get(), DType::I32, 8, 0.f, norm.get(), nullptr, nullptr, scratch.get()),
               Error);
  EXPECT_THROW(kernels::grad_norm_clip(nullptr, g.get(), DType::F32, 8, 0.f, nullptr, nullptr, nullptr, scratch.get()),
               Error);
  EXPECT_THROW(kernels::grad_norm_clip(nullptr, g.get(), DType::F32, 8, 0.f, norm.get(), nullptr, nullptr, nullptr),
               Error);
}

// fp16 loss scaling: the gradients are S times the true ones; with the device word S the norm is the
// unscaled one, the clip formula uses it and clip_scale carries 1/S (the optimizer's one factor);
// the split (ZeRO 1-2) path gives the same bits; an fp16 overflow (inf) sets the flag.
TEST(GradNormGpuLossScale, NormIsUnscaledAndClipCarriesTheInverseScale) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::size_t n = 100003;
  const float S = 1024.f;
  const auto g = test::round_f16(test::random_normal(n, rng, 0.f, 0.5f));  // scaled gradients, as stored
  const double want = ref::grad_norm(g) / S;
  DeviceGrads d(g, DType::F16, 0);
  DeviceArray<float> scale(std::vector<float>{S});
  for (float max_norm : {0.f, static_cast<float>(want / 4)}) {
    DeviceArray<float> norm(1), clip(1);
    DeviceArray<int> bad(1);
    DeviceArray<char> scratch(kernels::grad_norm_scratch_bytes(n));
    kernels::grad_norm_clip(nullptr, d.ptr(), DType::F16, n, max_norm, norm.get(), clip.get(), bad.get(),
                            scratch.get(), scale.get());
    const float got_norm = norm.download()[0], got_clip = clip.download()[0];
    EXPECT_NEAR(got_norm, want, 1e-5 * want);
    EXPECT_EQ(bad.download()[0], 0);
    EXPECT_NEAR(got_clip, ref::clip_scale(got_norm, max_norm) / S, 1e-6 / S) << "max_norm " << max_norm;
    DeviceArray<double> sumsq(1);
    DeviceArray<float> norm2(1), clip2(1);
    kernels::grad_sumsq(nullptr, d.ptr(), DType::F16, n, sumsq.get(), scratch.get());
    kernels::grad_norm_from_sumsq(nullptr, sumsq.get(), max_norm, norm2.get(), clip2.get(), bad.get(), scale.get());
    const float n2 = norm2.download()[0], c2 = clip2.download()[0];
    EXPECT_EQ(std::memcmp(&got_norm, &n2, 4), 0) << "split path norm";
    EXPECT_EQ(std::memcmp(&got_clip, &c2, 4), 0) << "split path clip";
  }
  auto over = g;
  over[n / 3] = INFINITY;  // what an fp16 gradient store that overflowed holds
  DeviceGrads o(over, DType::F16, 0);
  DeviceArray<float> norm(1), clip(1);
  DeviceArray<int> bad(1);
  DeviceArray<char> scratch(kernels::grad_norm_scratch_bytes(n));
  kernels::grad_norm_clip(nullptr, o.ptr(), DType::F16, n, 1.f, norm.get(), clip.get(), bad.get(), scratch.get(),
                          scale.get());
  EXPECT_EQ(bad.download()[0], 1);
}

}  // namespace
}  // namespace cutrain
