// GPU test of the training loop's profiling glue without the engine: regions opened the way the
// engine opens them, the timer and graph-replay switch per step, the report and its JSON.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "runtime/file_util.h"
#include "runtime/profiler.h"
#include "runtime/timing.h"
#include "tests/gpu/spin_kernel.h"
#include "tests/support/test_support.h"
#include "train/step_profiler.h"

using namespace cutrain;

TEST(StepProfilerGpu, TimesTheWindowEagerlyAndWritesTheReport) {
  CUTRAIN_REQUIRE_GPU();
  model::TransformerParams t(model::ModelDims{64, 2, 4, 512, 32});
  const auto path = std::filesystem::temp_directory_path() / ("cutrain_steps_" + std::to_string(getpid()) + ".json");
  train::ProfilingOptions o;
  o.timing_report = true;
  o.timing_report_file = path;
  o.timing_steps = 3;
  o.profile_steps = "4:5";  // cudaProfilerStart/Stop without a profiler attached are no-ops
  train::StepProfiler p(o, t, 2, 32, 1, false, true);
  p.set_steps(0, 7, 2);
  EXPECT_TRUE(p.timing());
  EXPECT_EQ(p.timed_first(), 2);
  EXPECT_EQ(p.timed_last(), 4);
  Stream s;
  test::DeviceArray<unsigned long long> sink(1);
  for (int step = 0; step <= 7; ++step) {
    p.begin_step(step);
    const bool timed = step >= 2 && step <= 4, windowed = step >= 4 && step <= 5;
    EXPECT_EQ(region_timer().enabled(), timed) << step;
    EXPECT_EQ(graph_replay_allowed(), !(timed || windowed)) << step;
    EXPECT_EQ(p.window().capturing(), windowed) << step;
    {
      TimedRegion r("step", s);
      {
        TimedRegion f("fwd", s, 1e9, 1e6);
        test::spin_for(s, 1000, sink.get());
      }
      TimedRegion b("bwd", s);
      test::spin_for(s, 2000, sink.get());
    }
    s.synchronize();
    p.end_step(step);
    EXPECT_TRUE(graph_replay_allowed());
  }
  std::ostringstream out;
  p.finish(out);
  EXPECT_NE(out.str().find("step/fwd"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("MFU per step"), std::string::npos) << out.str();
  const nlohmann::json j = nlohmann::json::parse(read_text_file(path));
  std::filesystem::remove(path);
  EXPECT_EQ(j["steps"], 3);
  ASSERT_EQ(j["regions"].size(), 3u);
  EXPECT_EQ(j["regions"][1]["name"], "step/fwd");
  EXPECT_EQ(j["regions"][1]["calls"], 3);
  EXPECT_NEAR(j["regions"][1]["total_ms"].get<double>(), 3.0, 0.3);
  EXPECT_NEAR(j["regions"][2]["total_ms"].get<double>(), 6.0, 0.5);
  EXPECT_GT(j["regions"][1]["tflops"].get<double>(), 0);
  EXPECT_NEAR(j["regions"][2]["pct_of_step"].get<double>(), 66.7, 4.0);
  EXPECT_GT(j["mfu_datasheet_mean"].get<double>() + j["mfu_measured_peak_mean"].get<double>(), 0);
  EXPECT_GT(j["peaks"]["gemm_tflops_measured"].get<double>(), 0);
}
