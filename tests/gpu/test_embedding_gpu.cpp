// @brief GPU tests of kernels/embedding against the fp64 CPU reference: forward, backward into
// both tables (fp32 and bf16, accumulate or overwrite), heavily repeated tokens, out-of-range ids
// (reported through the status flag, rows zeroed, never read: huge ids would fault), C % 8 != 0,
// widths of several 1024-column chunks, determinism of the backward.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/embedding.cuh"
#include "tests/reference/embedding_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {

struct Shape {
  int B, T, C, vocab;
};
const Shape kShapes[] = {{2, 3, 64, 10},   {4, 512, 1024, 50000}, {3, 7, 100, 37}, {1, 5, 8, 3},
                         {8, 129, 72, 500}, {2, 33, 1030, 4},      {1, 1, 1, 1}};

// Tokens with many repeats: half drawn from a handful of ids, half from the whole vocabulary.
std::vector<int32_t> tokens_for(const Shape& s, std::mt19937_64& rng) {
  const int N = s.B * s.T;
  auto few = test::random_ints(N, rng, 0, std::min(s.vocab - 1, 3));
  auto any = test::random_ints(N, rng, 0, s.vocab - 1);
  auto pick = test::random_ints(N, rng, 0, 1);
  std::vector<int32_t> t(N);
  for (int i = 0; i < N; ++i) t[i] = pick[i] ? few[i] : any[i];
  return t;
}

// "B4 T512 C1024 V50000" (an ostringstream: GCC 12 warns falsely on "literal" + std::string chains).
std::string label(const Shape& s) {
  std::ostringstream os;
  os << "B" << s.B << " T" << s.T << " C" << s.C << " V" << s.vocab;
  return os.str();
}

std::vector<uint32_t> float_bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

}  // namespace

TEST(EmbeddingGpu, ForwardMatchesReferenceAndReportsBadIds) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Shape& s : kShapes) {
    for (bool with_bad : {false, true}) {
      SCOPED_TRACE(label(s) + (with_bad ? " bad ids" : ""));
      const int N = s.B * s.T;
      auto tok = tokens_for(s, rng);
      if (with_bad) {
        // Huge ids would fault if read; the first bad one is somewhere in the middle.
        const int first = N / 2;
        const int32_t bad[] = {s.vocab, -1, INT_MAX, INT_MIN, s.vocab + 1000};
        for (int k = 0; first + k < N && k < 5; ++k) tok[first + k * 1] = bad[k];
      }
      const auto wte = test::round_bf16(test::random_normal(static_cast<std::size_t>(s.vocab) * s.C, rng));
      const auto wpe = test::round_bf16(test::random_normal(static_cast<std::size_t>(s.T) * s.C, rng));
      test::DeviceArray<int32_t> dtok(tok);
      test::DeviceArray<bf16> dwte(test::to_bf16(wte)), dwpe(test::to_bf16(wpe)),
          out(static_cast<std::size_t>(N) * s.C);
      test::DeviceArray<int> status(1);  // poisoned: the launcher must reset it
      kernels::embedding_forward(nullptr, dtok.get(), dwte.get(), dwpe.get(), out.get(), s.B, s.T, s.C, s.vocab,
                                 status.get());
      int want_bad = 0;
      auto want = ref::embedding_forward(tok.data(), wte.data(), wpe.data(), s.B, s.T, s.C, s.vocab, &want_bad);
      auto got = test::download_float(out);
      ASSERT_EQ(test::count_nan(got), 0u) << "out not fully written";
      EXPECT_LE(test::rel_error(got, want), 1e-2);
      EXPECT_EQ(status.download()[0], want_bad);
      if (with_bad) {
        EXPECT_EQ(want_bad, N / 2 + 1);
        for (int c = 0; c < s.C; ++c) EXPECT_EQ(got[static_cast<std::size_t>(N / 2) * s.C + c], 0.f);
      }
      // Null status is allowed.
      kernels::embedding_forward(nullptr, dtok.get(), dwte.get(), dwpe.get(), out.get(), s.B, s.T, s.C, s.vocab,
                                 nullptr);
      CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
}

namespace {

struct BwdOut {
  std::vector<float> dwte, dwpe;
};

BwdOut run_backward(const Shape& s, const std::vector<int32_t>& tok, const std::vector<float>& dout, DType gt,
                    bool accumulate, const std::vector<float>& wte0, const std::vector<float>& wpe0) {
  const std::size_t nte = static_cast<std::size_t>(s.vocab) * s.C, npe = static_cast<std::size_t>(s.T) * s.C;
  test::DeviceArray<int32_t> dtok(tok);
  test::DeviceArray<bf16> ddout(test::to_bf16(dout));
  test::DeviceArray<float> te32(nte), pe32(npe);
  test::DeviceArray<bf16> te16(nte), pe16(npe);
  if (accumulate) {
    te32.upload(wte0);
    pe32.upload(wpe0);
    te16.upload(test::to_bf16(wte0));
    pe16.upload(test::to_bf16(wpe0));
  }
  test::DeviceArray<uint8_t> scratch(kernels::embedding_backward_scratch_bytes(s.B, s.T, s.C, s.vocab));
  void* te = gt == DType::F32 ? static_cast<void*>(te32.get()) : te16.get();
  void* pe = gt == DType::F32 ? static_cast<void*>(pe32.get()) : pe16.get();
  kernels::embedding_backward(nullptr, ddout.get(), dtok.get(), te, pe, gt, accumulate, s.B, s.T, s.C, s.vocab,
                              scratch.get());
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  if (gt == DType::F32) return {te32.download(), pe32.download()};
  return {test::download_float(te16), test::download_float(pe16)};
}

}  // namespace

TEST(EmbeddingGpu, BackwardMatchesReferenceAndIsDeterministic) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Shape& s : kShapes) {
    for (DType gt : {DType::F32, DType::BF16}) {
      for (int v = 0; v < 4; ++v) {
        const bool accumulate = v & 1, with_bad = v & 2;
        SCOPED_TRACE(label(s) + " " + dtype_name(gt) + (accumulate ? " accumulate" : "") +
                     (with_bad ? " bad ids" : ""));
        const int N = s.B * s.T;
        auto tok = tokens_for(s, rng);
        if (with_bad) {
          tok[0] = -7;
          tok[N - 1] = INT_MAX;
          if (N > 2) tok[N / 2] = s.vocab;
        }
        const auto dout = test::round_bf16(test::random_normal(static_cast<std::size_t>(N) * s.C, rng));
        auto wte0 = test::random_normal(static_cast<std::size_t>(s.vocab) * s.C, rng);
        auto wpe0 = test::random_normal(static_cast<std::size_t>(s.T) * s.C, rng);
        if (gt == DType::BF16) {
          wte0 = test::round_bf16(wte0);
          wpe0 = test::round_bf16(wpe0);
        }
        auto want = ref::embedding_backward(dout.data(), tok.data(), accumulate ? wte0.data() : nullptr,
                                            accumulate ? wpe0.data() : nullptr, s.B, s.T, s.C, s.vocab);
        auto a = run_backward(s, tok, dout, gt, accumulate, wte0, wpe0);
        ASSERT_EQ(test::count_nan(a.dwte), 0u) << "dwte not fully written";
        ASSERT_EQ(test::count_nan(a.dwpe), 0u) << "dwpe not fully written";
        const double tol = gt == DType::F32 ? 1e-5 : 1e-2;
        EXPECT_LE(test::rel_error(a.dwte, want.dwte), tol);
        EXPECT_LE(test::rel_error(a.dwpe, want.dwpe), tol);
        // Rows of tokens absent from the batch: exactly the old value (accumulate) or zero.
        std::vector<bool> present(s.vocab, false);
        for (int32_t t : tok)
          if (t >= 0 && t < s.vocab) present[t] = true;
        for (int r = 0; r < s.vocab; ++r) {
          if (present[r]) continue;
          for (int c = 0; c < s.C; ++c) {
            const std::size_t i = static_cast<std::size_t>(r) * s.C + c;
            ASSERT_EQ(a.dwte[i], accumulate ? wte0[i] : 0.f) << "absent row " << r << " col " << c;
          }
        }
        auto b = run_backward(s, tok, dout, gt, accumulate, wte0, wpe0);
        EXPECT_EQ(float_bits(a.dwte), float_bits(b.dwte)) << "dwte differs between two runs";
        EXPECT_EQ(float_bits(a.dwpe), float_bits(b.dwpe)) << "dwpe differs between two runs";
      }
    }
  }
}

// Every position holds the same token: one run of B*T rows summed by one warp.
TEST(EmbeddingGpu, BackwardAllSameToken) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const Shape s{4, 512, 1024, 100};
  std::vector<int32_t> tok(s.B * s.T, 42);
  const auto dout = test::round_bf16(test::random_normal(static_cast<std::size_t>(s.B) * s.T * s.C, rng));
  auto want = ref::embedding_backward(dout.data(), tok.data(), nullptr, nullptr, s.B, s.T, s.C, s.vocab);
  auto got = run_backward(s, tok, dout, DType::F32, false, {}, {});
  ASSERT_EQ(test::count_nan(got.dwte), 0u);
  EXPECT_LE(test::rel_error(got.dwte, want.dwte), 1e-5);
  EXPECT_LE(test::rel_error(got.dwpe, want.dwpe), 1e-5);
}

// Batches with many repeats, bad ids, widths with a column remainder and more than one
// 1024-column chunk, 4097 tokens: every element written, the reference matched, the same bits
// on a second run.
TEST(EmbeddingGpu, BackwardRepeatsAndWideRows) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Shape& s : {Shape{4, 512, 1024, 50000}, Shape{8, 512, 2056, 300}, Shape{1, 4097, 64, 20},
                         Shape{3, 100, 1030, 7}, Shape{2, 2048, 16, 5000}}) {
    for (DType gt : {DType::F32, DType::BF16}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(label(s) + " " + dtype_name(gt) + (accumulate ? " accumulate" : ""));
        const int N = s.B * s.T;
        auto tok = tokens_for(s, rng);
        tok[N / 3] = -1;
        tok[N - 2] = s.vocab;
        const auto dout = test::round_bf16(test::random_normal(static_cast<std::size_t>(N) * s.C, rng));
        auto wte0 = test::round_bf16(test::random_normal(static_cast<std::size_t>(s.vocab) * s.C, rng));
        auto wpe0 = test::round_bf16(test::random_normal(static_cast<std::size_t>(s.T) * s.C, rng));
        auto a = run_backward(s, tok, dout, gt, accumulate, wte0, wpe0);
        auto b = run_backward(s, tok, dout, gt, accumulate, wte0, wpe0);
        ASSERT_EQ(test::count_nan(a.dwte) + test::count_nan(a.dwpe), 0u) << "elements left unwritten";
        EXPECT_EQ(float_bits(a.dwte), float_bits(b.dwte)) << "dwte differs between two runs";
        EXPECT_EQ(float_bits(a.dwpe), float_bits(b.dwpe)) << "dwpe differs between two runs";
        auto want = ref::embedding_backward(dout.data(), tok.data(), accumulate ? wte0.data() : nullptr,
                                            accumulate ? wpe0.data() : nullptr, s.B, s.T, s.C, s.vocab);
        const double tol = gt == DType::F32 ? 1e-5 : 1e-2;
        EXPECT_LE(test::rel_error(a.dwte, want.dwte), tol);
        EXPECT_LE(test::rel_error(a.dwpe, want.dwpe), tol);
      }
    }
  }
}

TEST(EmbeddingArgs, BadArgumentsAreErrors) {
  auto* t = reinterpret_cast<int32_t*>(std::uintptr_t{256});
  auto* p = reinterpret_cast<bf16*>(std::uintptr_t{256});
  EXPECT_THROW(kernels::embedding_forward(nullptr, t, p, p, p, 0, 4, 8, 10, nullptr), Error);
  EXPECT_THROW(kernels::embedding_forward(nullptr, t, p, p, p, 2, 4, 8, 0, nullptr), Error);
  EXPECT_THROW(kernels::embedding_forward(nullptr, nullptr, p, p, p, 2, 4, 8, 10, nullptr), Error);
  EXPECT_THROW(kernels::embedding_backward(nullptr, p, t, p, p, DType::F16, false, 2, 4, 8, 10, p), Error);
  EXPECT_THROW(kernels::embedding_backward(nullptr, p, t, p, p, DType::F32, false, 2, 4, 8, 10, nullptr), Error);
}

// The fp16 instance (fp16 training): forward and backward into fp16 and fp32 tables (accumulate
// or overwrite) against the fp64 reference. Tolerance 3e-3 for fp16 outputs (11 significant bits;
// a sum of repeated tokens' rows rounds once), 1e-5 for fp32 tables.
TEST(EmbeddingGpu, Fp16MatchesReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (const Shape& s : kShapes) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool f32_tables = variant & 1, accumulate = variant & 2;
      SCOPED_TRACE(label(s) + (f32_tables ? " fp32 grads" : " fp16 grads") + (accumulate ? " accumulate" : "") +
                   " fp16");
      const int N = s.B * s.T;
      const auto tok = tokens_for(s, rng);
      const std::size_t nte = static_cast<std::size_t>(s.vocab) * s.C, npe = static_cast<std::size_t>(s.T) * s.C;
      const auto wte = test::round_f16(test::random_normal(nte, rng));
      const auto wpe = test::round_f16(test::random_normal(npe, rng));
      test::DeviceArray<int32_t> dtok(tok);
      test::DeviceArray<f16> dwte(test::to_f16(wte)), dwpe(test::to_f16(wpe)), out(static_cast<std::size_t>(N) * s.C);
      kernels::embedding_forward(nullptr, dtok.get(), dwte.get(), dwpe.get(), out.get(), s.B, s.T, s.C, s.vocab,
                                 nullptr);
      auto want = ref::embedding_forward(tok.data(), wte.data(), wpe.data(), s.B, s.T, s.C, s.vocab, nullptr);
      const auto got = test::download_float(out);
      ASSERT_EQ(test::count_nan(got), 0u) << "out not fully written";
      EXPECT_LE(test::rel_error(got, want), 3e-3);

      const auto dout = test::round_f16(test::random_normal(static_cast<std::size_t>(N) * s.C, rng));
      const auto te0 = test::round_f16(test::random_normal(nte, rng)), pe0 = test::round_f16(test::random_normal(npe, rng));
      test::DeviceArray<f16> ddout(test::to_f16(dout)), gte16(test::to_f16(te0)), gpe16(test::to_f16(pe0));
      test::DeviceArray<float> gte32(te0), gpe32(pe0);
      test::DeviceArray<uint8_t> scratch(kernels::embedding_backward_scratch_bytes(s.B, s.T, s.C, s.vocab));
      void* dte = f32_tables ? static_cast<void*>(gte32.get()) : gte16.get();
      void* dpe = f32_tables ? static_cast<void*>(gpe32.get()) : gpe16.get();
      kernels::embedding_backward(nullptr, ddout.get(), dtok.get(), dte, dpe, f32_tables ? DType::F32 : DType::F16,
                                  accumulate, s.B, s.T, s.C, s.vocab, scratch.get());
      const auto wb = ref::embedding_backward(dout.data(), tok.data(), accumulate ? te0.data() : nullptr,
                                              accumulate ? pe0.data() : nullptr, s.B, s.T, s.C, s.vocab);
      const auto got_te = f32_tables ? gte32.download() : test::download_float(gte16);
      auto got_pe = f32_tables ? gpe32.download() : test::download_float(gpe16);
      ASSERT_EQ(test::count_nan(got_te) + test::count_nan(got_pe), 0u) << "a gradient table was not fully written";
      EXPECT_LE(test::rel_error(got_te, wb.dwte), f32_tables ? 1e-5 : 3e-3);
      EXPECT_LE(test::rel_error(got_pe, wb.dwpe), f32_tables ? 1e-5 : 3e-3);
    }
  }
}
