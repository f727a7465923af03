// @brief GPU tests of kernels/layernorm against the fp64 CPU reference: forward (sum, y, mean,
// rstd), backward (d_sum with/without d_extra and aliasing, dgamma/dbeta in fp32 and bf16,
// accumulate), determinism, odd shapes, every backward tile (team widths, the wide-row block path
// past 8192 columns) and the scalar fallback (cols % 8 != 0, misaligned pointers), bad shapes;
// the backward from the output (normalize_invertible) against its reference and against the
// backward from the input on the same data.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/layernorm.cuh"
#include "tests/reference/layernorm_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {

struct Case {
  int rows, cols;
  bool misalign = false;  // offset every activation pointer by one element: forces the scalar path
};

std::string name(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.cols) + (c.misalign ? " (misaligned)" : "");
}

// A bf16 device buffer of n elements, optionally starting one element into its allocation.
struct Buf {
  test::DeviceArray<bf16> a;
  int off;
  Buf(std::size_t n, bool misalign) : a(n + 1), off(misalign ? 1 : 0) {}
  bf16* get() const { return a.get() + off; }
  void upload(const std::vector<float>& v) {
    std::vector<bf16> h(a.size(), to_bf16(0.f));
    for (std::size_t i = 0; i < v.size(); ++i) h[i + off] = to_bf16(v[i]);
    a.upload(h);
  }
  std::vector<float> download(std::size_t n) const {
    auto h = test::to_float(a.download());
    return std::vector<float>(h.begin() + off, h.begin() + off + n);
  }
  std::vector<uint16_t> bits(std::size_t n) const {
    auto h = a.download();
    std::vector<uint16_t> b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = cutrain::bits(h[i + off]);
    return b;
  }
};

std::vector<uint32_t> float_bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {{7, 64},     {33, 1000},  {2049, 1536}, {5, 16384}, {3, 72},
                                      {17, 1032},  {9, 4104},   {2048, 1024}, {1, 64},    {4, 1030},
                                      {6, 130},    {65, 512},   {3, 16376},   {31, 1024, true},
                                      {5, 4096, true}};
  return c;
}

struct Inputs {
  std::vector<float> x, res, gamma, beta;
};
Inputs make_inputs(int rows, int cols, std::mt19937_64& rng) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  return {test::round_bf16(test::random_normal(n, rng, 0.5f, 1.5f)),
          test::round_bf16(test::random_normal(n, rng, -0.25f, 1.f)),
          test::round_bf16(test::random_normal(cols, rng, 1.f, 0.25f)),
          test::round_bf16(test::random_normal(cols, rng, 0.f, 0.25f))};
}

// One case's forward on the GPU: its inputs uploaded, the forward run.
struct Forward {
  Buf x, res, sum, y, g, b;
  test::DeviceArray<float> mean, rstd;
  Forward(const Case& c, const Inputs& in, bool with_res)
      : x(size(c), c.misalign), res(size(c), c.misalign), sum(size(c), c.misalign), y(size(c), c.misalign),
        g(c.cols, false), b(c.cols, false), mean(c.rows), rstd(c.rows) {
    x.upload(in.x);
    res.upload(in.res);
    g.upload(in.gamma);
    b.upload(in.beta);
    kernels::layernorm_residual_forward(nullptr, x.get(), with_res ? res.get() : nullptr, sum.get(), y.get(),
                                        mean.get(), rstd.get(), g.get(), b.get(), c.rows, c.cols);
  }
  static std::size_t size(const Case& c) { return static_cast<std::size_t>(c.rows) * c.cols; }
};

}  // namespace

TEST(LayerNormGpu, ForwardMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Case& c : cases()) {
    for (bool with_res : {true, false}) {
      SCOPED_TRACE(name(c) + (with_res ? " residual" : " no residual"));
      const std::size_t n = static_cast<std::size_t>(c.rows) * c.cols;
      Inputs in = make_inputs(c.rows, c.cols, rng);
      Forward f(c, in, with_res);
      CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
      auto want = ref::layernorm_forward(in.x.data(), with_res ? in.res.data() : nullptr, in.gamma.data(),
                                         in.beta.data(), c.rows, c.cols);
      auto got_sum = f.sum.download(n), got_y = f.y.download(n);
      auto got_mean = f.mean.download(), got_rstd = f.rstd.download();
      ASSERT_EQ(test::count_nan(got_sum), 0u) << "sum not fully written";
      ASSERT_EQ(test::count_nan(got_y), 0u) << "y not fully written";
      ASSERT_EQ(test::count_nan(got_mean) + test::count_nan(got_rstd), 0u) << "mean/rstd not fully written";
      EXPECT_EQ(float_bits(got_sum), float_bits(want.sum)) << "sum must be the bf16-rounded x + residual";
      EXPECT_LE(test::rel_error(got_y, want.y), 1e-2);
      EXPECT_LE(test::rel_error(got_mean, want.mean), 1e-5);
      EXPECT_LE(test::rel_error(got_rstd, want.rstd), 1e-5);
    }
  }
}

TEST(LayerNormGpu, ForwardWithoutSumOutput) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const int rows = 19, cols = 768;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  Inputs in = make_inputs(rows, cols, rng);
  Buf x(n, false), res(n, false), y(n, false), g(cols, false), b(cols, false);
  x.upload(in.x);
  res.upload(in.res);
  g.upload(in.gamma);
  b.upload(in.beta);
  test::DeviceArray<float> mean(rows), rstd(rows);
  kernels::layernorm_residual_forward(nullptr, x.get(), res.get(), nullptr, y.get(), mean.get(), rstd.get(), g.get(),
                                      b.get(), rows, cols);
  auto want = ref::layernorm_forward(in.x.data(), in.res.data(), in.gamma.data(), in.beta.data(), rows, cols);
  auto got_y = y.download(n);
  ASSERT_EQ(test::count_nan(got_y), 0u);
  EXPECT_LE(test::rel_error(got_y, want.y), 1e-2);
}

namespace {

struct BwdResult {
  std::vector<float> d_sum, dgamma, dbeta;
  std::vector<uint16_t> d_sum_bits;
};

// Runs forward then backward on the GPU for one configuration and checks it against the reference.
void check_backward(const Case& c, DType pt, bool accumulate, bool with_extra, bool alias,
                    std::mt19937_64& rng, BwdResult* out = nullptr, const std::vector<float>* fixed_dy = nullptr) {
  const std::size_t n = static_cast<std::size_t>(c.rows) * c.cols;
  Inputs in = make_inputs(c.rows, c.cols, rng);
  Forward f(c, in, true);
  const auto dy = fixed_dy ? *fixed_dy : test::round_bf16(test::random_normal(n, rng));
  const auto extra = test::round_bf16(test::random_normal(n, rng, 0.f, 0.5f));
  Buf dyb(n, c.misalign), extrab(n, c.misalign), dsum(n, c.misalign);
  dyb.upload(dy);
  extrab.upload(extra);
  bf16* d_sum = alias ? dyb.get() : dsum.get();

  // Parameter gradients: random starting values when accumulating, poison otherwise.
  const auto g0 = test::round_bf16(test::random_normal(c.cols, rng));
  const auto b0 = test::round_bf16(test::random_normal(c.cols, rng));
  test::DeviceArray<float> dg32(c.cols), db32(c.cols);
  Buf dg16(c.cols, false), db16(c.cols, false);
  if (accumulate) {
    dg32.upload(g0);
    db32.upload(b0);
    dg16.upload(g0);
    db16.upload(b0);
  }
  void* dgamma = pt == DType::F32 ? static_cast<void*>(dg32.get()) : dg16.get();
  void* dbeta = pt == DType::F32 ? static_cast<void*>(db32.get()) : db16.get();
  test::DeviceArray<uint8_t> scratch(kernels::layernorm_backward_scratch_bytes(c.rows, c.cols));
  kernels::layernorm_backward(nullptr, dyb.get(), f.sum.get(), f.mean.get(), f.rstd.get(), f.g.get(),
                              with_extra ? extrab.get() : nullptr, d_sum, dgamma, dbeta, pt, accumulate,
                              scratch.get(), c.rows, c.cols);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());

  const auto sum_h = f.sum.download(n);
  auto want = ref::layernorm_backward(dy.data(), sum_h.data(), in.gamma.data(), with_extra ? extra.data() : nullptr,
                                      accumulate ? g0.data() : nullptr, accumulate ? b0.data() : nullptr, c.rows,
                                      c.cols);
  const Buf& ds = alias ? dyb : dsum;
  BwdResult r;
  r.d_sum = ds.download(n);
  r.d_sum_bits = ds.bits(n);
  r.dgamma = pt == DType::F32 ? dg32.download() : dg16.download(c.cols);
  r.dbeta = pt == DType::F32 ? db32.download() : db16.download(c.cols);
  ASSERT_EQ(test::count_nan(r.d_sum), 0u) << "d_sum not fully written";
  ASSERT_EQ(test::count_nan(r.dgamma) + test::count_nan(r.dbeta), 0u) << "dgamma/dbeta not fully written";
  EXPECT_LE(test::rel_error(r.d_sum, want.d_sum), 1e-2);
  const double ptol = pt == DType::F32 ? 1e-4 : 1e-2;
  EXPECT_LE(test::rel_error(r.dgamma, want.dgamma), ptol);
  EXPECT_LE(test::rel_error(r.dbeta, want.dbeta), ptol);
  if (out) *out = std::move(r);
}

// Shapes that exercise every team layout of the backward (1, 2, 4, 8, 16 warps per row; several
// rows per team, so the prefetch of the next rows and the team-order combination of the partials
// run) and the other paths (cols > 8192: the block-per-row kernel; cols % 8 != 0: scalar).
const std::vector<Case>& tile_cases() {
  static const std::vector<Case> c = {{2500, 512}, {3000, 1024}, {700, 2048}, {600, 4096}, {1000, 8192},
                                      {333, 1032}, {530, 4104},  {9, 8200},   {41, 200},   {17, 4100}};
  return c;
}

}  // namespace

TEST(LayerNormGpu, BackwardMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    check_backward(c, DType::F32, false, false, false, rng);
    check_backward(c, DType::BF16, true, true, false, rng);
  }
  for (const Case& c : tile_cases()) {
    SCOPED_TRACE(name(c));
    check_backward(c, DType::F32, false, true, false, rng);
    check_backward(c, DType::F32, true, false, true, rng);
  }
}

TEST(LayerNormGpu, BackwardVariants) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Case& c : {Case{33, 1000}, Case{129, 2048}, Case{7, 64}, Case{11, 1030}, Case{700, 4096}}) {
    for (DType pt : {DType::F32, DType::BF16}) {
      for (int v = 0; v < 8; ++v) {
        const bool acc = v & 1, extra = v & 2, alias = v & 4;
        SCOPED_TRACE(name(c) + " " + dtype_name(pt) + (acc ? " accumulate" : "") + (extra ? " d_extra" : "") +
                     (alias ? " d_sum=dy" : ""));
        check_backward(c, pt, acc, extra, alias, rng);
      }
    }
  }
}

// Same inputs twice: identical bits in d_sum, dgamma and dbeta (deterministic reduction).
TEST(LayerNormGpu, BackwardIsDeterministic) {
  CUTRAIN_REQUIRE_GPU();
  for (const Case& c : {Case{2048, 1024}, Case{2049, 1536}, Case{5, 16384}, Case{333, 1000}, Case{64, 4096, true},
                        Case{1500, 4096}, Case{3000, 512}}) {
    for (DType pt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(name(c) + " " + dtype_name(pt));
      // The same seed for both runs gives the same inputs.
      const auto seed = test::fresh_rng()();
      std::mt19937_64 r1(seed), r2(seed);
      BwdResult a, b;
      check_backward(c, pt, false, true, false, r1, &a);
      check_backward(c, pt, false, true, false, r2, &b);
      EXPECT_EQ(a.d_sum_bits, b.d_sum_bits);
      EXPECT_EQ(float_bits(a.dgamma), float_bits(b.dgamma));
      EXPECT_EQ(float_bits(a.dbeta), float_bits(b.dbeta));
    }
  }
}

// ---- layernorm_backward_from_output (normalize_invertible) ----
namespace {

// Inputs whose gamma stays away from 0 (|gamma| in [0.5, 1.5], either sign), so x_hat =
// (y - beta) / gamma is well conditioned.
Inputs make_invertible_inputs(int rows, int cols, std::mt19937_64& rng) {
  Inputs in = make_inputs(rows, cols, rng);
  auto mag = test::random_uniform(cols, rng, 0.5f, 1.5f);
  auto sign = test::random_uniform(cols, rng, -1.f, 1.f);
  for (int c = 0; c < cols; ++c) in.gamma[c] = sign[c] < 0 ? -mag[c] : mag[c];
  in.gamma = test::round_bf16(in.gamma);
  return in;
}

// One configuration: the GPU forward gives y and rstd; the backward from y is checked against
// the fp64 reference on the same y/rstd, and against layernorm_backward (from `sum`, mean and
// rstd) on the same data: the recovered x_hat differs from the exact one by y's bf16 rounding.
void check_backward_from_output(const Case& c, DType pt, bool accumulate, bool with_extra, bool alias,
                                std::mt19937_64& rng, BwdResult* out = nullptr) {
  const std::size_t n = static_cast<std::size_t>(c.rows) * c.cols;
  Inputs in = make_invertible_inputs(c.rows, c.cols, rng);
  Forward f(c, in, true);
  const auto dy = test::round_bf16(test::random_normal(n, rng));
  const auto extra = test::round_bf16(test::random_normal(n, rng, 0.f, 0.5f));
  Buf dyb(n, c.misalign), dy_in(n, c.misalign), extrab(n, c.misalign), dsum(n, c.misalign), dsum_in(n, c.misalign);
  dyb.upload(dy);
  dy_in.upload(dy);
  extrab.upload(extra);
  bf16* d_sum = alias ? dyb.get() : dsum.get();

  const auto g0 = test::round_bf16(test::random_normal(c.cols, rng));
  const auto b0 = test::round_bf16(test::random_normal(c.cols, rng));
  // [0]: from the output, [1]: layernorm_backward. Poisoned unless accumulating.
  test::DeviceArray<float> dg32[2] = {test::DeviceArray<float>(c.cols), test::DeviceArray<float>(c.cols)};
  test::DeviceArray<float> db32[2] = {test::DeviceArray<float>(c.cols), test::DeviceArray<float>(c.cols)};
  Buf dg16[2] = {Buf(c.cols, false), Buf(c.cols, false)}, db16[2] = {Buf(c.cols, false), Buf(c.cols, false)};
  void* dgamma[2];
  void* dbeta[2];
  for (int k = 0; k < 2; ++k) {
    if (accumulate) {
      dg32[k].upload(g0);
      db32[k].upload(b0);
      dg16[k].upload(g0);
      db16[k].upload(b0);
    }
    dgamma[k] = pt == DType::F32 ? static_cast<void*>(dg32[k].get()) : dg16[k].get();
    dbeta[k] = pt == DType::F32 ? static_cast<void*>(db32[k].get()) : db16[k].get();
  }
  test::DeviceArray<uint8_t> scratch(kernels::layernorm_backward_scratch_bytes(c.rows, c.cols));
  const bf16* e = with_extra ? extrab.get() : nullptr;
  kernels::layernorm_backward_from_output(nullptr, dyb.get(), f.y.get(), f.rstd.get(), f.g.get(), f.b.get(), e,
                                          d_sum, dgamma[0], dbeta[0], pt, accumulate, scratch.get(), c.rows, c.cols);
  kernels::layernorm_backward(nullptr, dy_in.get(), f.sum.get(), f.mean.get(), f.rstd.get(), f.g.get(), e,
                              dsum_in.get(), dgamma[1], dbeta[1], pt, accumulate, scratch.get(), c.rows, c.cols);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());

  const auto y_h = f.y.download(n);
  const auto rstd_h = f.rstd.download();
  auto want = ref::layernorm_backward_from_output(dy.data(), y_h.data(), rstd_h.data(), in.gamma.data(),
                                                  in.beta.data(), with_extra ? extra.data() : nullptr,
                                                  accumulate ? g0.data() : nullptr, accumulate ? b0.data() : nullptr,
                                                  c.rows, c.cols);
  auto params = [&](int k, std::vector<float>& g, std::vector<float>& b) {
    g = pt == DType::F32 ? dg32[k].download() : dg16[k].download(c.cols);
    b = pt == DType::F32 ? db32[k].download() : db16[k].download(c.cols);
  };
  const Buf& ds = alias ? dyb : dsum;
  BwdResult r, o;
  r.d_sum = ds.download(n);
  r.d_sum_bits = ds.bits(n);
  params(0, r.dgamma, r.dbeta);
  o.d_sum = dsum_in.download(n);
  params(1, o.dgamma, o.dbeta);
  ASSERT_EQ(test::count_nan(r.d_sum), 0u) << "d_sum not fully written";
  ASSERT_EQ(test::count_nan(r.dgamma) + test::count_nan(r.dbeta), 0u) << "dgamma/dbeta not fully written";
  ASSERT_EQ(test::count_nan(o.d_sum) + test::count_nan(o.dgamma), 0u) << "layernorm_backward not fully written";
  // Against the reference on the same y and rstd.
  EXPECT_LE(test::rel_error(r.d_sum, want.d_sum), 1e-2);
  const double ptol = pt == DType::F32 ? 1e-4 : 1e-2;
  EXPECT_LE(test::rel_error(r.dgamma, want.dgamma), ptol);
  EXPECT_LE(test::rel_error(r.dbeta, want.dbeta), ptol);
  // Against the backward from the input: y's bf16 rounding (2^-9 relative) moves x_hat by about
  // 0.1% RMS; both d_sum are bf16.
  EXPECT_LE(test::rel_error(r.d_sum, o.d_sum), 1e-2);
  EXPECT_LE(test::rel_error(r.dgamma, o.dgamma), 1e-2);
  // dbeta = sum of dy does not involve x_hat: the same reduction gives the same bits.
  EXPECT_EQ(float_bits(r.dbeta), float_bits(o.dbeta));
  if (out) *out = std::move(r);
}

}  // namespace

TEST(LayerNormGpu, BackwardFromOutputMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    check_backward_from_output(c, DType::F32, false, false, false, rng);
    check_backward_from_output(c, DType::BF16, true, true, false, rng);
  }
  for (const Case& c : tile_cases()) {
    SCOPED_TRACE(name(c));
    check_backward_from_output(c, DType::F32, false, true, false, rng);
    check_backward_from_output(c, DType::BF16, true, false, true, rng);
  }
}

TEST(LayerNormGpu, BackwardFromOutputVariants) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Case& c : {Case{33, 1000}, Case{129, 2048}, Case{7, 64}, Case{11, 1030}, Case{700, 4096},
                        Case{13, 776, true}}) {
    for (DType pt : {DType::F32, DType::BF16}) {
      for (int v = 0; v < 8; ++v) {
        const bool acc = v & 1, extra = v & 2, alias = v & 4;
        SCOPED_TRACE(name(c) + " " + dtype_name(pt) + (acc ? " accumulate" : "") + (extra ? " d_extra" : "") +
                     (alias ? " d_sum=dy" : ""));
        check_backward_from_output(c, pt, acc, extra, alias, rng);
      }
    }
  }
}

TEST(LayerNormGpu, BackwardFromOutputIsDeterministic) {
  CUTRAIN_REQUIRE_GPU();
  for (const Case& c : {Case{2048, 1024}, Case{5, 16384}, Case{333, 1000}, Case{64, 4096, true}}) {
    SCOPED_TRACE(name(c));
    const auto seed = test::fresh_rng()();
    std::mt19937_64 r1(seed), r2(seed);
    BwdResult a, b;
    check_backward_from_output(c, DType::F32, false, true, false, r1, &a);
    check_backward_from_output(c, DType::F32, false, true, false, r2, &b);
    EXPECT_EQ(a.d_sum_bits, b.d_sum_bits);
    EXPECT_EQ(float_bits(a.dgamma), float_bits(b.dgamma));
    EXPECT_EQ(float_bits(a.dbeta), float_bits(b.dbeta));
  }
}

// Shape checks fire before any CUDA call, so these run on a machine without a GPU too.
TEST(LayerNormShapes, UnsupportedShapesAreClearErrors) {
  bf16* p = reinterpret_cast<bf16*>(std::uintptr_t{256});
  float* f = reinterpret_cast<float*>(std::uintptr_t{256});
  auto fwd = [&](int rows, int cols) {
    kernels::layernorm_residual_forward(nullptr, p, nullptr, nullptr, p, f, f, p, p, rows, cols);
  };
  for (int cols : {0, 8, 63, 16385, 1 << 20}) {
    try {
      fwd(4, cols);
      ADD_FAILURE() << "cols " << cols << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[64, 16384]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(cols)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(fwd(0, 64), Error);
  EXPECT_THROW(kernels::layernorm_backward_scratch_bytes(4, 20000), Error);
  EXPECT_THROW(kernels::layernorm_backward(nullptr, p, p, f, f, p, nullptr, p, f, f, DType::I32, false, f, 4, 64),
               Error);
  EXPECT_THROW(kernels::layernorm_backward(nullptr, p, p, f, f, p, nullptr, p, f, f, DType::F32, false, nullptr, 4, 64),
               Error);
  // From the output: the same shape rule, and beta (which it needs, unlike mean) must be given.
  auto from_output = [&](const bf16* beta, DType pt, int cols) {
    kernels::layernorm_backward_from_output(nullptr, p, p, f, p, beta, nullptr, p, f, f, pt, false, f, 4, cols);
  };
  try {
    from_output(p, DType::F32, 20000);
    ADD_FAILURE() << "cols 20000 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layernorm_backward_from_output"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[64, 16384]"), std::string::npos) << e.what();
  }
  try {
    from_output(nullptr, DType::F32, 64);
    ADD_FAILURE() << "null beta accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("beta"), std::string::npos) << e.what();
  }
  EXPECT_THROW(from_output(p, DType::I32, 64), Error);
}

// The fp16 instance (fp16 training): forward (sum bits, y, mean, rstd) and both backwards (from the
// input and from the output; fp16 and fp32 parameter gradients, accumulate, d_extra, d_sum aliasing
// dy) on every path (team widths, the wide-row block, the scalar fallback), against the fp64
// reference. Tolerance 3e-3 for 16-bit outputs (fp16 keeps 11 significant bits, against bf16's 8 and
// its 1e-2); fp32 parameter gradients 1e-4 as for bf16.
TEST(LayerNormGpu, Fp16MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::vector<Case> shapes = {{7, 64}, {33, 1000}, {2049, 1536}, {5, 16384}, {17, 1032}, {9, 4104}, {4, 1030},
                                    {31, 1024, true}};
  for (const Case& c : shapes) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool from_output = variant & 1, f32_params = variant & 2;
      const bool accumulate = (c.rows + variant) % 2 == 0, alias = c.rows % 3 == 0, with_extra = variant != 1;
      SCOPED_TRACE(name(c) + (from_output ? " from output" : " from input") + (f32_params ? " fp32" : " fp16") +
                   " params fp16");
      const std::size_t n = static_cast<std::size_t>(c.rows) * c.cols, off = c.misalign ? 1 : 0;
      auto up = [&](const std::vector<float>& v, std::size_t o) {
        std::vector<float> h(v.size() + 1, 0.f);
        std::copy(v.begin(), v.end(), h.begin() + o);
        return test::DeviceArray<f16>(test::to_f16(h));
      };
      auto down = [&](const test::DeviceArray<f16>& a, std::size_t o, std::size_t k) {
        auto h = test::download_float(a);
        return std::vector<float>(h.begin() + o, h.begin() + o + k);
      };
      const auto x = test::round_f16(test::random_normal(n, rng, 0.5f, 1.5f));
      const auto res = test::round_f16(test::random_normal(n, rng, -0.25f, 1.f));
      const auto gamma = test::round_f16(test::random_normal(c.cols, rng, 1.f, 0.25f));
      const auto beta = test::round_f16(test::random_normal(c.cols, rng, 0.f, 0.25f));
      auto dx_ = up(x, off), dres = up(res, off), dg = up(gamma, 0), db = up(beta, 0);
      test::DeviceArray<f16> dsum(n + 1), dy_out(n + 1);
      test::DeviceArray<float> mean(c.rows), rstd(c.rows);
      kernels::layernorm_residual_forward(nullptr, dx_.get() + off, dres.get() + off, dsum.get() + off,
                                          dy_out.get() + off, mean.get(), rstd.get(), dg.get(), db.get(), c.rows,
                                          c.cols);
      const auto fwd = ref::layernorm_forward(x.data(), res.data(), gamma.data(), beta.data(), c.rows, c.cols, 1e-5,
                                              DType::F16);
      const auto sum = down(dsum, off, n), y = down(dy_out, off, n);
      ASSERT_EQ(test::count_nan(sum) + test::count_nan(y), 0u) << "sum / y not fully written";
      EXPECT_EQ(sum, fwd.sum) << "sum must be the fp16-rounded x + residual";
      EXPECT_LE(test::rel_error(y, fwd.y), 3e-3);
      EXPECT_LE(test::rel_error(mean.download(), fwd.mean), 1e-5);
      EXPECT_LE(test::rel_error(rstd.download(), fwd.rstd), 1e-5);

      const auto dy = test::round_f16(test::random_normal(n, rng));
      const auto extra = test::round_f16(test::random_normal(n, rng, 0.f, 0.5f));
      const auto g0 = test::round_f16(test::random_normal(c.cols, rng)), b0 = test::round_f16(test::random_normal(c.cols, rng));
      auto ddy = up(dy, off), dextra = up(extra, off);
      test::DeviceArray<f16> dds(n + 1), dg16(test::to_f16(g0)), db16(test::to_f16(b0));
      test::DeviceArray<float> dg32(g0), db32(b0);
      if (!accumulate) {
        dg16.poison(), db16.poison(), dg32.poison(), db32.poison();
      }
      const DType pt = f32_params ? DType::F32 : DType::F16;
      void* dgamma = f32_params ? static_cast<void*>(dg32.get()) : dg16.get();
      void* dbeta = f32_params ? static_cast<void*>(db32.get()) : db16.get();
      f16* d_sum = alias ? ddy.get() + off : dds.get() + off;
      test::DeviceArray<uint8_t> scratch(kernels::layernorm_backward_scratch_bytes(c.rows, c.cols));
      if (from_output) {
        kernels::layernorm_backward_from_output(nullptr, ddy.get() + off, dy_out.get() + off, rstd.get(), dg.get(),
                                                db.get(), with_extra ? dextra.get() + off : nullptr, d_sum, dgamma,
                                                dbeta, pt, accumulate, scratch.get(), c.rows, c.cols);
      } else {
        kernels::layernorm_backward(nullptr, ddy.get() + off, dsum.get() + off, mean.get(), rstd.get(), dg.get(),
                                    with_extra ? dextra.get() + off : nullptr, d_sum, dgamma, dbeta, pt, accumulate,
                                    scratch.get(), c.rows, c.cols);
      }
      const auto rstd_h = rstd.download();
      const auto want =
          from_output
              ? ref::layernorm_backward_from_output(dy.data(), y.data(), rstd_h.data(), gamma.data(), beta.data(),
                                                    with_extra ? extra.data() : nullptr, accumulate ? g0.data() : nullptr,
                                                    accumulate ? b0.data() : nullptr, c.rows, c.cols)
              : ref::layernorm_backward(dy.data(), sum.data(), gamma.data(), with_extra ? extra.data() : nullptr,
                                        accumulate ? g0.data() : nullptr, accumulate ? b0.data() : nullptr, c.rows,
                                        c.cols);
      const auto got_ds = down(alias ? ddy : dds, off, n);
      const auto got_g = f32_params ? dg32.download() : down(dg16, 0, c.cols);
      const auto got_b = f32_params ? db32.download() : down(db16, 0, c.cols);
      ASSERT_EQ(test::count_nan(got_ds) + test::count_nan(got_g) + test::count_nan(got_b), 0u)
          << "an output was not fully written";
      EXPECT_LE(test::rel_error(got_ds, want.d_sum), 3e-3);
      EXPECT_LE(test::rel_error(got_g, want.dgamma), f32_params ? 1e-4 : 3e-3);
      EXPECT_LE(test::rel_error(got_b, want.dbeta), f32_params ? 1e-4 : 3e-3);
    }
  }
}
