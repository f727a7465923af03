// CPU tests of the timing report (synthetic timings), the disabled timer, and --profile_steps.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/profiler.h"
#include "runtime/timing.h"
#include "runtime/timing_report.h"

using namespace cutrain;

namespace {
DevicePeaks h200() {
  DevicePeaks p;
  p.device = "NVIDIA H200";
  p.copy_gbps = 4000;
  p.gemm_tflops = 800;
  p.datasheet_tflops = datasheet_bf16_tflops(p.device);
  return p;
}
const ReportRow& row(const std::vector<ReportRow>& rows, const std::string& name) {
  for (const ReportRow& r : rows)
    if (r.name == name) return r;
  throw std::runtime_error("no row " + name);
}
}  // namespace

TEST(TimingReport, DatasheetPeaks) {
  EXPECT_DOUBLE_EQ(datasheet_bf16_tflops("NVIDIA H200"), 989.4);
  EXPECT_DOUBLE_EQ(datasheet_bf16_tflops("NVIDIA H100 80GB HBM3"), 989.4);
  EXPECT_EQ(datasheet_bf16_tflops("NVIDIA H100 PCIe"), 0);
  EXPECT_EQ(datasheet_bf16_tflops("NVIDIA A100-SXM4-80GB"), 0);
}

TEST(TimingReport, FoldsOnlyWholeLayerComponents) {
  EXPECT_EQ(fold_layer_index("step/fwd/layer03/attn/qkv"), "step/fwd/layer*/attn/qkv");
  EXPECT_EQ(fold_layer_index("layer11"), "layer*");
  EXPECT_EQ(fold_layer_index("step/bwd/layer7/mlp"), "step/bwd/layer*/mlp");
  EXPECT_EQ(fold_layer_index("step/layers/layer"), "step/layers/layer");
  EXPECT_EQ(fold_layer_index("step/layer03x/a"), "step/layer03x/a");
  EXPECT_EQ(fold_layer_index("step/mylayer03"), "step/mylayer03");
  EXPECT_EQ(fold_layer_index(""), "");
  EXPECT_EQ(fold_layer_index("a//layer1/"), "a//layer*/");
}

TEST(TimingReport, RatesSharesAndMfuFromSyntheticTimings) {
  // Two steps of 10 and 30 ms; a GEMM region of 2 calls, 8 ms for 4 TFLOP in total; a copy of
  // 2 GB in 1 ms; per-layer regions that fold into one.
  std::vector<RegionTotals> regions = {
      {"step", 2, 40.0, 0, 0},
      {"step/fwd/layer00/gemm", 2, 8.0, 4e12, 0},
      {"step/fwd/layer01/gemm", 2, 2.0, 1e12, 0},
      {"step/copy", 1, 1.0, 0, 2e9},
      {"step/other", 3, 0.5, 0, 0},
  };
  const double model_flops = 5e12;
  TimingReport r = make_timing_report(regions, {10.0, 30.0}, h200(), "step", model_flops, "6N + 12LTC");
  EXPECT_DOUBLE_EQ(r.step_total_ms, 40.0);
  const ReportRow& g = row(r.rows, "step/fwd/layer00/gemm");
  EXPECT_NEAR(g.pct_of_step, 20.0, 1e-12);
  EXPECT_NEAR(g.ms_per_step, 4.0, 1e-12);
  EXPECT_NEAR(g.tflops, 4e12 / 8e-3 / 1e12, 1e-9);  // 500 TFLOP/s
  EXPECT_NEAR(g.frac_gemm_peak, 500.0 / 800.0, 1e-12);
  EXPECT_EQ(g.gbps, 0);
  const ReportRow& c = row(r.rows, "step/copy");
  EXPECT_NEAR(c.gbps, 2000.0, 1e-9);
  EXPECT_NEAR(c.frac_copy_bw, 0.5, 1e-12);
  EXPECT_EQ(c.tflops, 0);
  EXPECT_EQ(row(r.rows, "step/other").calls, 3);
  // Folded: both layers summed.
  const ReportRow& f = row(r.by_kind, "step/fwd/layer*/gemm");
  EXPECT_EQ(f.calls, 4);
  EXPECT_NEAR(f.total_ms, 10.0, 1e-12);
  EXPECT_NEAR(f.tflops, 5e12 / 10e-3 / 1e12, 1e-9);
  EXPECT_NEAR(f.pct_of_step, 25.0, 1e-12);
  EXPECT_EQ(r.by_kind.size(), 4u);
  EXPECT_EQ(r.by_kind[1].name, "step/fwd/layer*/gemm");  // first-seen order kept
  // MFU per step: 5 TFLOP / 10 ms = 500 TFLOP/s; / 30 ms = 166.7.
  ASSERT_EQ(r.mfu_datasheet.size(), 2u);
  EXPECT_NEAR(r.mfu_datasheet[0], 500.0 / 989.4, 1e-12);
  EXPECT_NEAR(r.mfu_datasheet[1], (5e12 / 30e-3 / 1e12) / 989.4, 1e-12);
  EXPECT_NEAR(r.mfu_measured[0], 500.0 / 800.0, 1e-12);
  EXPECT_NEAR(r.mfu_datasheet_mean, (1e13 / 40e-3 / 1e12) / 989.4, 1e-12);
  EXPECT_NEAR(r.mfu_measured_mean, 250.0 / 800.0, 1e-12);
}

TEST(TimingReport, UnknownPeaksAndNoStepRegionGiveZerosNotNan) {
  DevicePeaks none;
  TimingReport r = make_timing_report({{"fwd", 1, 3.0, 1e9, 1e9}}, {}, none, "step", 1e12, "x");
  EXPECT_EQ(r.step_total_ms, 0);
  EXPECT_EQ(r.rows[0].pct_of_step, 0);
  EXPECT_EQ(r.rows[0].ms_per_step, 0);
  EXPECT_EQ(r.rows[0].frac_gemm_peak, 0);
  EXPECT_EQ(r.rows[0].frac_copy_bw, 0);
  EXPECT_GT(r.rows[0].tflops, 0);
  EXPECT_EQ(r.mfu_datasheet_mean, 0);
  const std::string t = format_timing_report(r);
  EXPECT_EQ(t.find("nan"), std::string::npos) << t;
  EXPECT_NE(t.find("datasheet peak unknown"), std::string::npos) << t;
}

TEST(TimingReport, TableAndJsonCarryEveryField) {
  std::vector<RegionTotals> regions = {{"step", 1, 20.0, 0, 0}, {"step/fwd/layer00/qkv", 1, 5.0, 2e12, 1e9},
                                       {"step/fwd/layer01/qkv", 1, 5.0, 2e12, 1e9}};
  TimingReport r = make_timing_report(regions, {20.0}, h200(), "step", 6e12, "6N + 12LTC (PaLM)");
  const std::string folded = format_timing_report(r);
  EXPECT_NE(folded.find("step/fwd/layer*/qkv"), std::string::npos) << folded;
  EXPECT_EQ(folded.find("layer00"), std::string::npos) << folded;
  EXPECT_NE(folded.find("NVIDIA H200"), std::string::npos);
  EXPECT_NE(folded.find("989.4"), std::string::npos);
  EXPECT_NE(folded.find("400.0"), std::string::npos) << folded;  // 4 TFLOP in 10 ms
  EXPECT_NE(folded.find("50.0"), std::string::npos) << folded;   // % of step
  EXPECT_NE(folded.find("30.3%"), std::string::npos) << folded;  // 6 TFLOP / 20 ms / 989.4
  const std::string all = format_timing_report(r, true);
  EXPECT_NE(all.find("step/fwd/layer01/qkv"), std::string::npos) << all;

  nlohmann::json j = timing_report_json(r);
  EXPECT_EQ(j["device"], "NVIDIA H200");
  EXPECT_EQ(j["steps"], 1);
  EXPECT_DOUBLE_EQ(j["peaks"]["bf16_dense_tflops_datasheet"].get<double>(), 989.4);
  EXPECT_DOUBLE_EQ(j["peaks"]["gemm_tflops_measured"].get<double>(), 800.0);
  EXPECT_EQ(j["regions"].size(), 3u);
  EXPECT_EQ(j["regions_by_kind"].size(), 2u);
  EXPECT_NEAR(j["regions"][1]["tflops"].get<double>(), 400.0, 1e-9);
  EXPECT_NEAR(j["regions"][1]["gbps"].get<double>(), 200.0, 1e-9);
  EXPECT_NEAR(j["regions"][1]["ms_per_step"].get<double>(), 5.0, 1e-12);
  EXPECT_FALSE(j["regions"][0].contains("tflops"));
  EXPECT_NEAR(j["mfu_datasheet"][0].get<double>(), 300.0 / 989.4, 1e-12);
  EXPECT_EQ(j["flops_formula"], "6N + 12LTC (PaLM)");

  const auto path = std::filesystem::temp_directory_path() / ("cutrain_timing_" + std::to_string(getpid()) + ".json");
  write_timing_report(path, r);
  EXPECT_EQ(nlohmann::json::parse(read_text_file(path)), j);
  std::filesystem::remove(path);
  EXPECT_THROW(write_timing_report("/nonexistent-dir/x/report.json", r), Error);
}

TEST(RegionTimer, DisabledIsANoOpWithoutTouchingCuda) {
  // No device here: a disabled timer must not call CUDA at all (it would throw), and collect() on
  // nothing recorded is fine.
  RegionTimer t;
  EXPECT_FALSE(t.enabled());
  {
    TimedRegion a(t, "step", nullptr, 1e9, 1e9);
    TimedRegion b(t, "fwd", nullptr);
    EXPECT_EQ(NvtxRange::current_path(), "step/fwd");
  }
  EXPECT_EQ(NvtxRange::current_path(), "");
  EXPECT_EQ(t.pending(), 0u);
  EXPECT_EQ(t.pooled_events(), 0u);
  EXPECT_TRUE(t.totals().empty());
  EXPECT_TRUE(t.step_ms().empty());
  EXPECT_FALSE(region_timer().enabled());
}

TEST(ProfileWindow, ParsesAndRejects) {
  ProfileWindow w = ProfileWindow::parse("10:12");
  EXPECT_TRUE(w.active());
  EXPECT_EQ(w.first(), 10);
  EXPECT_EQ(w.last(), 12);
  EXPECT_EQ(ProfileWindow::parse("0:0").last(), 0);
  for (const char* bad : {"", "3", "3:", ":4", "a:b", "1:2:3", "-1:4", "1:-4", " 1:2", "1:2 ", "1.5:2", "1;2",
                          "99999999999:1"}) {
    try {
      ProfileWindow::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("--profile_steps"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("A:B"), std::string::npos) << e.message();
    }
  }
  try {
    ProfileWindow::parse("12:10");
    ADD_FAILURE() << "accepted 12:10";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("12:10"), std::string::npos) << e.message();
  }
  EXPECT_FALSE(ProfileWindow().active());
}

namespace {
// Runs steps [from, to] through a window, logging "start@N" / "stop@N".
std::vector<std::string> drive(ProfileWindow& w, int from, int to, bool finish = true) {
  std::vector<std::string> log;
  int cur = -1;
  w.set_hooks([&] { log.push_back("start@" + std::to_string(cur)); },
              [&] { log.push_back("stop@" + std::to_string(cur)); });
  for (cur = from; cur <= to; ++cur) {
    w.begin_step(cur);
    log.push_back(std::string(w.capturing() ? "S" : "s") + std::to_string(cur));
    w.end_step(cur);
  }
  cur = -2;
  if (finish) w.finish();
  return log;
}
using V = std::vector<std::string>;
}  // namespace

TEST(ProfileWindow, StartsAndStopsExactlyAroundTheSteps) {
  ProfileWindow w(2, 3);
  EXPECT_EQ(drive(w, 0, 5), (V{"s0", "s1", "start@2", "S2", "S3", "stop@3", "s4", "s5"}));
  ProfileWindow one(4, 4);
  EXPECT_EQ(drive(one, 3, 5), (V{"s3", "start@4", "S4", "stop@4", "s5"}));
  // A resumed run that starts inside the window still captures the rest of it.
  ProfileWindow resumed(2, 5);
  EXPECT_EQ(drive(resumed, 4, 6), (V{"start@4", "S4", "S5", "stop@5", "s6"}));
  // A run that ends inside the window stops at finish().
  ProfileWindow cut(1, 9);
  EXPECT_EQ(drive(cut, 0, 2), (V{"s0", "start@1", "S1", "S2", "stop@-2"}));
  // A run entirely past or before the window never starts the profiler.
  ProfileWindow past(1, 2);
  EXPECT_EQ(drive(past, 3, 4), (V{"s3", "s4"}));
  ProfileWindow before(10, 12);
  EXPECT_EQ(drive(before, 0, 2), (V{"s0", "s1", "s2"}));
  ProfileWindow inactive;
  EXPECT_EQ(drive(inactive, 0, 1), (V{"s0", "s1"}));
}

TEST(ProfileWindow, DestructorStopsAnOpenWindow) {
  int stops = 0;
  {
    ProfileWindow w(0, 5);
    w.set_hooks([] {}, [&] { ++stops; });
    w.begin_step(0);
    EXPECT_TRUE(w.capturing());
  }
  EXPECT_EQ(stops, 1);
}

TEST(GraphReplaySwitch, DefaultsOnAndToggles) {
  EXPECT_TRUE(graph_replay_allowed());
  set_graph_replay_allowed(false);
  EXPECT_FALSE(graph_replay_allowed());
  set_graph_replay_allowed(true);
  EXPECT_TRUE(graph_replay_allowed());
}
