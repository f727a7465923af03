// CPU tests of the I/O tools' shared part (tools/io_measure): the GB/sec unit (1024^3, as ds_io),
// sizes, nvme-tune's sweep config and its errors, the {"aio": ...} block's keys, the per-run log
// names, and one small read and write job in a temp folder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>

#include "runtime/error.h"
#include "runtime/json_util.h"
#include "tools/io_measure.h"
#include "tests/support/cpu_test_util.h"

using namespace cutrain;
using namespace cutrain::tools;

namespace {
using test::message_of;

std::filesystem::path temp_folder(const std::string& name) {
  auto p = std::filesystem::path(testing::TempDir()) / (name + std::to_string(::getpid()));
  std::filesystem::create_directories(p);
  return p;
}
}  // namespace

TEST(IoTools, GigabytesAreDsIosPowersOf1024) {
  EXPECT_DOUBLE_EQ(kBytesPerGB, 1073741824.0);
  EXPECT_DOUBLE_EQ(gb_per_s(2.0 * 1024 * 1024 * 1024), 2.0);
  EXPECT_NEAR(gb_per_s(1e9), 0.9313, 1e-4);
  EXPECT_EQ(parse_size("1G"), 1u << 30);
  EXPECT_EQ(parse_size("400M"), 400u << 20);
  EXPECT_EQ(parse_size("128K"), 128u << 10);
  EXPECT_EQ(size_string(1u << 20), "1M");
  EXPECT_EQ(size_string(8u << 20), "8M");
  EXPECT_EQ(size_string(128u << 10), "128K");
  EXPECT_EQ(size_string(1u << 30), "1G");
  EXPECT_EQ(size_string(1000), "1000");
}

TEST(IoTools, SweepConfig) {
  SweepConfig d;  // the default sweep
  EXPECT_EQ(d.block_size, (std::vector<std::size_t>{1u << 20, 8u << 20}));
  EXPECT_EQ(d.queue_depth, (std::vector<int>{32, 128}));
  auto c = parse_sweep_config(
      R"({"block_size": ["128K", 1048576], "queue_depth": [4, 16], "io_parallel": [2],
          "single_submit": [false], "overlap_events": [true, false]})",
      "sweep.json");
  EXPECT_EQ(c.block_size, (std::vector<std::size_t>{128u << 10, 1u << 20}));
  EXPECT_EQ(c.queue_depth, (std::vector<int>{4, 16}));
  EXPECT_EQ(c.io_parallel, (std::vector<int>{2}));
  EXPECT_EQ(c.single_submit, (std::vector<bool>{false}));
  EXPECT_EQ(c.overlap_events, (std::vector<bool>{true, false}));
  // ds_io's inverse spelling; keys left out keep the default.
  auto s = parse_sweep_config(R"({"sequential_requests": [true]})", "s.json");
  EXPECT_EQ(s.overlap_events, (std::vector<bool>{false}));
  EXPECT_EQ(s.io_parallel, d.io_parallel);
}

TEST(IoTools, SweepConfigErrorsNameFileKeyExpectedFound) {
  auto m = message_of([] { parse_sweep_config(R"({"queue_depth": 32})", "sw.json"); });
  EXPECT_HAS(m, "sw.json: queue_depth: expected a non-empty list of integers >= 1, found number 32");
  m = message_of([] { parse_sweep_config(R"({"queue_depth": []})", "sw.json"); });
  EXPECT_HAS(m, "queue_depth: expected a non-empty list");
  m = message_of([] { parse_sweep_config(R"({"io_parallel": [0]})", "sw.json"); });
  EXPECT_HAS(m, "sw.json: io_parallel: expected integers >= 1, found number 0");
  m = message_of([] { parse_sweep_config(R"({"block_size": ["1X"]})", "sw.json"); });
  EXPECT_HAS(m, "block_size: expected a size such as \"1M\" or 1048576, found string \"1X\"");
  m = message_of([] { parse_sweep_config(R"({"single_submit": ["false"]})", "sw.json"); });
  EXPECT_HAS(m, "single_submit: expected true or false, found string \"false\"");
  m = message_of([] { parse_sweep_config(R"({"threads": [1]})", "sw.json"); });
  EXPECT_HAS(m, "sw.json: expected keys block_size");
  EXPECT_HAS(m, "found 'threads'");
  m = message_of([] { parse_sweep_config(R"({"overlap_events": [true], "sequential_requests": [true]})", "sw.json"); });
  EXPECT_HAS(m, "found both");
  m = message_of([] { parse_sweep_config(R"([1, 2])", "sw.json"); });
  EXPECT_HAS(m, "sw.json: expected a JSON object of lists");
  EXPECT_THROW(parse_sweep_config(R"({"queue_depth": [1], "queue_depth": [2]})", "sw.json"), Error);  // duplicate
  EXPECT_THROW(parse_sweep_config("{", "sw.json"), Error);
  m = message_of([] { read_sweep_config("/nonexistent/sweep.json"); });
  EXPECT_HAS(m, "--sweep_config /nonexistent/sweep.json: expected a JSON file");
  const auto dir = temp_folder("sweep");
  std::ofstream(dir / "s.json") << R"({"queue_depth": [8]})";
  EXPECT_EQ(read_sweep_config((dir / "s.json").string()).queue_depth, (std::vector<int>{8}));
  std::filesystem::remove_all(dir);
}

TEST(IoTools, AioBlockHasDeepSpeedsKeys) {
  aio::HandleOptions h;
  h.block_size = 8u << 20;
  h.queue_depth = 32;
  h.intra_op_parallelism = 4;
  h.single_submit = false;
  h.overlap_events = true;
  const auto j = parse_json_strict(aio_config_json(h, /*use_gds=*/true), "block");
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j.size(), 1u);
  const auto& a = j.at("aio");
  std::vector<std::string> keys;
  for (const auto& [k, v] : a.items()) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"block_size", "intra_op_parallelism", "overlap_events", "queue_depth",
                                            "single_submit", "use_gds"}));
  EXPECT_EQ(a["block_size"], 8388608);
  EXPECT_EQ(a["queue_depth"], 32);
  EXPECT_EQ(a["intra_op_parallelism"], 4);
  EXPECT_EQ(a["single_submit"], false);
  EXPECT_EQ(a["overlap_events"], true);
  EXPECT_EQ(a["use_gds"], true);
  EXPECT_EQ(run_log_name(true, h), "read_block_overlap_p4_d32_bs8M.txt");
  h.single_submit = true;
  h.overlap_events = false;
  EXPECT_EQ(run_log_name(false, h), "write_single_sequential_p4_d32_bs8M.txt");
}

TEST(IoTools, SmallWriteAndReadJob) {
  const auto dir = temp_folder("iojob");
  IoJob job;
  job.folders = {dir.string(), dir.string()};  // two files in one folder, driven at once
  job.io_size = 1u << 20;
  job.loops = 1;
  job.handle.block_size = 256u << 10;
  job.handle.queue_depth = 4;
  job.read = false;
  IoResult w = run_io_job(job);
  EXPECT_GT(w.task_bytes_per_s, 0);
  EXPECT_GE(w.task_bytes_per_s, w.e2e_bytes_per_s);
  EXPECT_EQ(std::filesystem::file_size(file_for(dir.string(), 1)), job.io_size);
  job.read = true;
  job.validate = true;
  IoResult r = run_io_job(job);
  EXPECT_GT(r.task_bytes_per_s, 0);
  EXPECT_FALSE(r.backend.empty());
  std::filesystem::remove_all(dir);
}

TEST(IoTools, SizeFlagErrorsNameTheFlag) {
  EXPECT_EQ(parse_size_flag("--io_size", "4M"), 4u << 20);
  auto m = message_of([] { parse_size_flag("--io_size", "4X"); });
  EXPECT_HAS(m, "--io_size: expected a size in bytes");
  EXPECT_HAS(m, "found '4X'");
}
