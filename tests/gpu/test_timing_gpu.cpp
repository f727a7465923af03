// GPU tests of the region timer: kernels of known duration and a copy of known bytes timed by
// name, nesting and the step share, no allocation after warm-up, graph capture, measured peaks.
#include <gtest/gtest.h>

#include <string>

#include "runtime/peaks.h"
#include "runtime/timing.h"
#include "tests/gpu/spin_kernel.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {
const RegionTotals* find(const std::vector<RegionTotals>& t, const std::string& name) {
  for (const RegionTotals& r : t)
    if (r.name == name) return &r;
  return nullptr;
}
}  // namespace

TEST(RegionTimerGpu, TimesKnownKernelsByHierarchicalName) {
  CUTRAIN_REQUIRE_GPU();
  Stream s;
  test::DeviceArray<unsigned long long> sink(1);
  const std::size_t copy_bytes = std::size_t(256) << 20;
  test::DeviceArray<char> src(copy_bytes), dst(copy_bytes);
  RegionTimer t;
  t.set_enabled(true);
  const int steps = 3;
  std::size_t pool_after_first = 0;
  for (int i = 0; i < steps; ++i) {
    {
      TimedRegion step(t, "step", s);
      {
        TimedRegion a(t, "short", s, 1e9, 0);
        test::spin_for(s, 2000, sink.get());
      }
      {
        TimedRegion b(t, "long", s, 0, 0);
        test::spin_for(s, 6000, sink.get());
      }
      for (int k = 0; k < 2; ++k) {
        TimedRegion c(t, "copy", s, 0, 2.0 * copy_bytes);
        CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, s));
      }
    }
    t.collect();
    EXPECT_EQ(t.pending(), 0u);
    if (i == 0) pool_after_first = t.pooled_events();
  }
  // The pool was filled by the first step and reused afterwards.
  EXPECT_EQ(pool_after_first, 2u * 5u);
  EXPECT_EQ(t.pooled_events(), pool_after_first);

  const auto tot = t.totals();
  ASSERT_EQ(tot.size(), 4u);
  const RegionTotals *st = find(tot, "step"), *sh = find(tot, "step/short"), *lo = find(tot, "step/long"),
                     *cp = find(tot, "step/copy");
  ASSERT_TRUE(st && sh && lo && cp);
  EXPECT_EQ(st->calls, steps);
  EXPECT_EQ(sh->calls, steps);
  EXPECT_EQ(cp->calls, 2 * steps);
  // Spins are wall-clock exact to a few microseconds; allow launch gaps and clock granularity.
  EXPECT_NEAR(sh->total_ms / steps, 2.0, 0.2);
  EXPECT_NEAR(lo->total_ms / steps, 6.0, 0.4);
  EXPECT_NEAR(lo->total_ms / sh->total_ms, 3.0, 0.3);
  EXPECT_DOUBLE_EQ(sh->flops, steps * 1e9);
  EXPECT_DOUBLE_EQ(cp->bytes, 2.0 * steps * 2.0 * copy_bytes);
  // The step contains its children and not much else.
  EXPECT_GE(st->total_ms, sh->total_ms + lo->total_ms + cp->total_ms - 0.05);
  EXPECT_LE(st->total_ms, (sh->total_ms + lo->total_ms + cp->total_ms) * 1.2 + 0.5);
  const auto sms = t.step_ms();
  ASSERT_EQ(sms.size(), std::size_t(steps));
  for (double ms : sms) EXPECT_GT(ms, 8.0);

  const DevicePeaks pk = measure_peaks(s);
  TimingReport r = t.report(pk, 1e12, "test");
  const std::string table = format_timing_report(r);
  std::cout << table;
  for (const ReportRow& row : r.rows) {
    if (row.name == "step/long") {
      EXPECT_NEAR(row.pct_of_step, 100.0 * lo->total_ms / st->total_ms, 1e-9);
    }
    if (row.name == "step/copy") {
      // A device-to-device copy of 256 MiB runs near the measured copy bandwidth.
      EXPECT_GT(row.frac_copy_bw, 0.5) << table;
      EXPECT_LT(row.frac_copy_bw, 1.3) << table;
    }
  }
  ASSERT_EQ(r.mfu_measured.size(), std::size_t(steps));
  EXPECT_GT(r.mfu_measured[0], 0);
}

TEST(RegionTimerGpu, RegionsInsideGraphCaptureRecordNothingAndCaptureSucceeds) {
  CUTRAIN_REQUIRE_GPU();
  Stream s;
  test::DeviceArray<unsigned long long> sink(1);
  RegionTimer t;
  t.set_enabled(true);
  cudaGraph_t g = nullptr;
  CUTRAIN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  {
    TimedRegion r(t, "captured", s, 1, 1);
    test::spin_for(s, 10, sink.get());
  }
  CUTRAIN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  EXPECT_EQ(t.pending(), 0u);
  cudaGraphExec_t ge = nullptr;
  CUTRAIN_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  CUTRAIN_CUDA_CHECK(cudaGraphLaunch(ge, s));
  s.synchronize();
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  EXPECT_TRUE(t.totals().empty());
}

TEST(RegionTimerGpu, CollectInsideAnOpenRegionIsAnError) {
  CUTRAIN_REQUIRE_GPU();
  Stream s;
  RegionTimer t;
  t.set_enabled(true);
  {
    TimedRegion r(t, "open", s);
    EXPECT_THROW(t.collect(), Error);
  }
  t.collect();
  const auto tot = t.totals();
  ASSERT_EQ(tot.size(), 1u);
  EXPECT_EQ(tot[0].calls, 1);
  EXPECT_GE(tot[0].total_ms, 0.0);
}

TEST(RegionTimerGpu, ClearDropsARegionStillOpen) {
  CUTRAIN_REQUIRE_GPU();
  Stream s;
  RegionTimer t;
  t.set_enabled(true);
  {
    TimedRegion r(t, "old", s);
    t.clear();
    TimedRegion n(t, "new", s);
  }
  const auto tot = t.totals();
  ASSERT_EQ(tot.size(), 1u);
  EXPECT_EQ(tot[0].name, "old/new");
}

TEST(PeaksGpu, MeasuredPeaksAreSane) {
  CUTRAIN_REQUIRE_GPU();
  const DevicePeaks p = measure_peaks();
  std::cout << p.device << ": copy " << p.copy_gbps << " GB/s, bf16 GEMM " << p.gemm_tflops << " TFLOP/s, datasheet "
            << p.datasheet_tflops << "\n";
  EXPECT_FALSE(p.device.empty());
  EXPECT_GT(p.copy_gbps, 100.0);
  EXPECT_GT(p.gemm_tflops, 10.0);
  if (p.datasheet_tflops > 0) {
    // H100/H200 SXM: 3+ TB/s copies, several hundred TFLOP/s, never above the datasheet.
    EXPECT_GT(p.copy_gbps, 2000.0);
    EXPECT_GT(p.gemm_tflops, 300.0);
    EXPECT_LT(p.gemm_tflops, p.datasheet_tflops * 1.02);
  }
}
