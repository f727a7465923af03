// @brief GPU tests of Gemm::grad_weight_bias (kernels/gemm.cuh): the weight gradient with the bias
// gradient from cuBLASLt's BGRADB epilogue or from kernels::bias_grad after the GEMM, against the
// fp64 CPU references (tests/reference/gemm_ref.h): fresh random inputs, outputs poisoned with NaN
// first, odd shapes and the models' widths, bf16 and fp16 inputs with 16-bit and fp32 gradients as
// the models keep them, written and accumulated, every path (the measured rule, the epilogue
// forced, the kernel forced), the fallback (accumulation, a misaligned db, anything cuBLASLt
// refuses) and the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/gemm.cuh"
#include "tests/reference/gemm_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using kernels::BiasGradPath;
using kernels::Gemm;
using test::DeviceArray;

namespace {

struct Shape {
  int M, N, K;
};
std::string str(const Shape& s) {
  return std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
}

// Odd and tiny shapes; the models' widths at small M: N = 1024 (the BF16 example's out_proj and
// fc2: the rule's epilogue side), 768 (GPT-2's), 3072 and 1025 (the kernel's side of the rule).
const std::vector<Shape> kShapes = {{7, 13, 5},     {1, 1, 1},        {33, 17, 65},   {130, 1000, 24},
                                    {64, 1024, 1024}, {48, 1024, 4096}, {40, 768, 3072}, {96, 3072, 1024},
                                    {3, 1025, 8}};

const char* path_name(BiasGradPath p) {
  switch (p) {
    case BiasGradPath::Measured: return "measured";
    case BiasGradPath::Epilogue: return "epilogue";
    case BiasGradPath::Kernel: return "kernel";
  }
  return "?";
}

template <typename T>
constexpr double storage_tol() {
  return std::is_same_v<T, f16> ? 3e-3 : 1e-2;  // one rounding of 11 (fp16) or 8 (bf16) bits
}
// fp32 outputs of 16-bit inputs: only fp32 accumulation error is left (split-K orders, the
// epilogue's reduction order); a transposed or partial reduction is off by O(1).
constexpr double kF32GemmTol = 1e-3;
constexpr double kF32SumTol = 1e-4;

template <typename T>
struct Input {
  std::vector<float> host;  // rounded to T: the reference sees exactly the GPU's input
  DeviceArray<T> dev;
};
template <typename T>
Input<T> make_input(std::size_t n, std::mt19937_64& rng, float stddev = 1.f) {
  Input<T> t{test::round_to<T>(test::random_normal(n, rng, 0.f, stddev)), DeviceArray<T>()};
  t.dev = DeviceArray<T>(test::to_storage<T>(t.host));
  return t;
}

// A gradient buffer of G (T or float), `offset` elements in (a misaligned start), poisoned.
template <typename G>
struct GradBuf {
  DeviceArray<G> a;
  std::size_t offset;
  GradBuf(std::size_t n, std::size_t off) : a(n + off), offset(off) {}
  G* get() const { return a.get() + offset; }
  void upload(const std::vector<float>& v) {
    std::vector<G> all = a.download();
    std::vector<G> conv;
    if constexpr (std::is_same_v<G, float>) conv = v;
    else conv = test::to_storage<G>(v);
    std::copy(conv.begin(), conv.end(), all.begin() + std::ptrdiff_t(offset));
    a.upload(all);
  }
  std::vector<float> download() const {
    std::vector<float> all;
    if constexpr (std::is_same_v<G, float>) all = a.download();
    else all = test::download_float(a);
    return std::vector<float>(all.begin() + std::ptrdiff_t(offset), all.end());
  }
};

template <typename G, typename T>
constexpr DType grad_dtype() {
  if constexpr (std::is_same_v<G, float>) return DType::F32;
  else return dtype_of<T>();
}

void expect_written_and_close(const std::vector<float>& got, const std::vector<double>& want, double tol,
                              const std::string& what) {
  EXPECT_EQ(test::count_nan(got), 0u) << what << ": unwritten (NaN) outputs";
  EXPECT_LE(test::rel_error(got, want), tol) << what;
}

// One call of grad_weight_bias of gradient type G against the references; checks that the call
// took exactly the path its arguments and cuBLASLt allow (counted by the Gemm).
template <typename T, typename G>
void check_case(Gemm& gemm, const Shape& s, const Input<T>& dy, const Input<T>& x, bool acc, BiasGradPath path,
                std::size_t db_offset, const std::vector<float>& dw_init, const std::vector<float>& db_init,
                const std::vector<double>& want_dw, const std::vector<double>& want_db) {
  const std::string what = str(s) + " " + path_name(path) + (acc ? " accumulate" : "") +
                           (std::is_same_v<G, float> ? " fp32 grads" : " 16-bit grads") +
                           (db_offset ? " db misaligned" : "");
  SCOPED_TRACE(what);
  GradBuf<G> dw(std::size_t(s.N) * s.K, 0), db(std::size_t(s.N), db_offset);
  if (acc) {
    dw.upload(test::round_to<T>(dw_init));  // the 16-bit buffers hold 16-bit values; exact in fp32 too
    db.upload(test::round_to<T>(db_init));
  }
  DeviceArray<float> scratch(kernels::bias_grad_scratch_bytes(s.M, s.N) / sizeof(float));  // poisoned
  const std::size_t fused0 = gemm.bias_grad_epilogue_count(), fallbacks0 = gemm.fallback_count();
  gemm.grad_weight_bias(nullptr, dy.dev.get(), x.dev.get(), dw.get(), db.get(), grad_dtype<G, T>(), s.M, s.N, s.K,
                        acc, scratch.get(), path);
  const double tol_w = std::is_same_v<G, float> ? kF32GemmTol : storage_tol<T>();
  const double tol_b = std::is_same_v<G, float> ? kF32SumTol : storage_tol<T>();
  expect_written_and_close(dw.download(), want_dw, tol_w, "dW");
  expect_written_and_close(db.download(), want_db, tol_b, "db");

  const std::size_t fused = gemm.bias_grad_epilogue_count() - fused0, fallbacks = gemm.fallback_count() - fallbacks0;
  const bool asked = !acc && (path == BiasGradPath::Epilogue ||
                              (path == BiasGradPath::Measured && kernels::bias_grad_epilogue_wins(s.M, s.N, s.K)));
  if (asked) {
    EXPECT_EQ(fused + fallbacks, 1u) << "an epilogue request runs fused or is counted as a fallback";
  } else {
    EXPECT_EQ(fused, 0u) << "the kernel path must not run the epilogue";
    EXPECT_EQ(fallbacks, 0u) << "the kernel path by rule or accumulation is not a fallback";
  }
}

template <typename T>
void check_all_paths() {
  auto rng = test::fresh_rng();
  Gemm gemm;
  for (const Shape& s : kShapes) {
    const auto dy = make_input<T>(std::size_t(s.M) * s.N, rng);
    const auto x = make_input<T>(std::size_t(s.M) * s.K, rng);
    const auto dw_init = test::round_to<T>(test::random_normal(std::size_t(s.N) * s.K, rng, 0.f, std::sqrt(float(s.M))));
    const auto db_init = test::round_to<T>(test::random_normal(std::size_t(s.N), rng, 0.f, std::sqrt(float(s.M))));
    for (bool acc : {false, true}) {
      const auto want_dw = ref::gemm_grad_weight(dy.host, x.host, s.M, s.N, s.K, acc ? &dw_init : nullptr);
      const auto want_db = ref::bias_grad(dy.host, s.M, s.N, acc ? &db_init : nullptr);
      for (BiasGradPath path : {BiasGradPath::Measured, BiasGradPath::Epilogue, BiasGradPath::Kernel}) {
        check_case<T, T>(gemm, s, dy, x, acc, path, 0, dw_init, db_init, want_dw, want_db);
        check_case<T, float>(gemm, s, dy, x, acc, path, 0, dw_init, db_init, want_dw, want_db);
      }
      // db one element in: only element-aligned; cuBLASLt may refuse it (then the fallback runs).
      check_case<T, T>(gemm, s, dy, x, acc, BiasGradPath::Epilogue, 1, dw_init, db_init, want_dw, want_db);
      check_case<T, float>(gemm, s, dy, x, acc, BiasGradPath::Epilogue, 1, dw_init, db_init, want_dw, want_db);
    }
  }
}

}  // namespace

TEST(GemmBiasGradGpu, Bf16EveryPathMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  check_all_paths<bf16>();
}

TEST(GemmBiasGradGpu, Fp16EveryPathMatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  check_all_paths<f16>();
}

// At the models' shapes on the rule's epilogue side (N <= 1024, all dims multiples of 8, aligned
// buffers) with bf16 inputs and gradients (bf16_full) the bias gradient must come from the GEMM's
// epilogue: a silent fallback would still be correct but would give back the pass this saves.
// The other gradient types are printed, not required (whether cuBLASLt fuses them is its call).
TEST(GemmBiasGradGpu, ModelShapesRunInTheEpilogue) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  Gemm gemm;
  for (const Shape& s : std::vector<Shape>{{512, 1024, 1024}, {512, 1024, 4096}, {512, 768, 768}, {512, 768, 3072}}) {
    SCOPED_TRACE(str(s));
    ASSERT_TRUE(kernels::bias_grad_in_epilogue(s.M, s.N, s.K, false));
    const auto dy = make_input<bf16>(std::size_t(s.M) * s.N, rng);
    const auto x = make_input<bf16>(std::size_t(s.M) * s.K, rng);
    DeviceArray<float> scratch(kernels::bias_grad_scratch_bytes(s.M, s.N) / sizeof(float));
    {
      DeviceArray<bf16> dw(std::size_t(s.N) * s.K), db(std::size_t(s.N));
      const std::size_t fused0 = gemm.bias_grad_epilogue_count(), fallbacks0 = gemm.fallback_count();
      gemm.grad_weight_bias(nullptr, dy.dev.get(), x.dev.get(), dw.get(), db.get(), DType::BF16, s.M, s.N, s.K, false,
                            scratch.get());
      EXPECT_EQ(gemm.bias_grad_epilogue_count() - fused0, 1u);
      EXPECT_EQ(gemm.fallback_count(), fallbacks0);
      expect_written_and_close(test::download_float(db), ref::bias_grad(dy.host, s.M, s.N), 1e-2, "db");
    }
    {
      DeviceArray<float> dw(std::size_t(s.N) * s.K), db(std::size_t(s.N));
      const std::size_t fused0 = gemm.bias_grad_epilogue_count();
      gemm.grad_weight_bias(nullptr, dy.dev.get(), x.dev.get(), dw.get(), db.get(), DType::F32, s.M, s.N, s.K, false,
                            scratch.get());
      std::printf("[ info ] %s fp32 grads: bias gradient %s\n", str(s).c_str(),
                  gemm.bias_grad_epilogue_count() > fused0 ? "in the epilogue" : "by the fallback kernel");
      expect_written_and_close(db.download(), ref::bias_grad(dy.host, s.M, s.N), kF32SumTol, "db fp32");
    }
  }
}

// A bad call is refused before anything runs, naming the argument; the outputs stay poisoned.
TEST(GemmBiasGradGpu, RejectsBadArgumentsBeforeAnyWork) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const int M = 16, N = 32, K = 24;
  Gemm gemm;
  const auto dy = make_input<bf16>(std::size_t(M) * N, rng), x = make_input<bf16>(std::size_t(M) * K, rng);
  DeviceArray<bf16> dw(std::size_t(N) * K), db(N);
  DeviceArray<float> dwf(std::size_t(N) * K), dbf(N + 1);
  DeviceArray<float> scratch(kernels::bias_grad_scratch_bytes(M, N) / sizeof(float));
  auto expect_error = [](auto&& call, const char* needle) {
    const std::string err = test::error_of(call);
    EXPECT_NE(err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << err;
  };
  expect_error([&] {
    gemm.grad_weight_bias(nullptr, dy.dev.get(), x.dev.get(), dw.get(), db.get(), DType::BF16, M, N, K, false, nullptr);
  }, "scratch");
  expect_error([&] {
    gemm.grad_weight_bias(nullptr, dy.dev.get(), x.dev.get(), dw.get(), db.get(), DType::I32, M, N, K, false,
                          scratch.get());
  }, "int32");
  expect_error([&] {
    gemm.grad_weight_bias(nullptr, dy.dev.get(), x.dev.get(), dw.get(), dw.get(), DType::BF16, M, N, K, false,
                          scratch.get());
  }, "alias");
  expect_error([&] {
    gemm.grad_weight_bias(nullptr, dy.dev.get(), x.dev.get(), dwf.get(), reinterpret_cast<char*>(dbf.get()) + 2,
                          DType::F32, M, N, K, false, scratch.get());
  }, "aligned");
  expect_error([&] {
    gemm.grad_weight_bias<bf16>(nullptr, dy.dev.get(), x.dev.get(), dw.get(), nullptr, DType::BF16, M, N, K, false,
                                scratch.get());
  }, "`db`");
  expect_error([&] {
    gemm.grad_weight_bias(nullptr, dy.dev.get(), x.dev.get(), dw.get(), db.get(), DType::BF16, M, 0, K, false,
                          scratch.get());
  }, "N=0");
  expect_error([&] {
    gemm.grad_weight_bias(nullptr, dy.dev.get(), x.dev.get(), dw.get(), db.get(), DType::BF16, M, N, K, false,
                          scratch.get(), static_cast<BiasGradPath>(7));
  }, "path");
  EXPECT_EQ(gemm.plan_count(), 0u) << "a rejected call must not reach cuBLASLt";
  EXPECT_EQ(gemm.bias_grad_epilogue_count(), 0u);
  for (float v : test::download_float(dw)) ASSERT_TRUE(std::isnan(v));
  for (float v : test::download_float(db)) ASSERT_TRUE(std::isnan(v));
  for (float v : dwf.download()) ASSERT_TRUE(std::isnan(v));
  for (float v : dbf.download()) ASSERT_TRUE(std::isnan(v));
}
