// The training loop end to end on the CPU backend: the BF16 example's output lines, the loss CSV,
// the metrics JSON, a loss that falls on a fixed batch, config errors, and bit-identical resume.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "data/token_shard.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"
#include "tests/support/tiny_cpu_backend.h"
#include "train/config.h"
#include "train/train_loop.h"
#include "tests/support/cpu_test_util.h"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& tag) { return test::fresh_temp_dir("train", tag); }

// The tiny run with the config's learning rate, two warm-up steps, every second step logged.
train::TrainOptions tiny(std::uint64_t seed) {
  train::TrainOptions o = test::tiny_train_options(seed);
  o.warmup_steps = 2, o.log_interval = 2;
  o.learning_rate.reset();
  return o;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST(TrainLoop, OutputLinesCsvAndMetrics) {
  auto rng = test::fresh_rng();
  const fs::path dir = temp_dir("out");
  train::TrainOptions o = tiny(rng());
  o.fixed_batch = true;
  o.learning_rate = 1e-2f;
  o.loss_log_file = dir / "loss.csv";
  o.metrics_file = dir / "metrics.jsonl";
  std::ostringstream out;
  train::TrainResult r = train::run_training(o, out);
  const std::string text = out.str();
  SCOPED_TRACE(text);

  // 2 embeddings + 2 layers * (12h^2 + 13h) + output (V*h + V)
  const std::size_t h = 32, V = 64, n = V * h + 8 * h + 2 * (12 * h * h + 13 * h) + V * h + V;
  EXPECT_EQ(r.params, n);
  EXPECT_NE(text.find("Model parameters: " + train::with_commas(n) + " total, " + train::with_commas(n) + " trainable"),
            std::string::npos);
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(Memory after init: allocated=\d+\.\d\d GB, reserved=\d+\.\d\d GB)")));
  for (int s : {0, 2, 4, 5})
    EXPECT_TRUE(std::regex_search(
        text, std::regex("Step " + std::to_string(s) + R"(: loss=\d+\.\d{4}, time=\d+\.\d{3}s, alloc_mem=\d+\.\d\d GB, peak_mem=\d+\.\d\d GB)")))
        << "step " << s;
  for (int s : {1, 3}) EXPECT_EQ(text.find("Step " + std::to_string(s) + ":"), std::string::npos);
  EXPECT_NE(text.find("FINAL RESULTS"), std::string::npos);
  EXPECT_NE(text.find("  Model: hidden_dim=32, num_layers=2"), std::string::npos);
  EXPECT_NE(text.find("  Batch size: 2, Seq length: 8"), std::string::npos);
  // The step time also in milliseconds to 1e-4, with the count it averages.
  std::smatch avg;
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(\n  Average step time: \d+\.\d{3}s\n)")));
  ASSERT_TRUE(std::regex_search(text, avg, std::regex(R"(\n  Mean step time: (\d+\.\d{4}) ms over (\d+) timed steps\n)")));
  EXPECT_NEAR(std::stod(avg[1].str()), 1e3 * r.avg_step_time, 1e-4);
  EXPECT_GT(std::stoi(avg[2].str()), 0);
  EXPECT_TRUE(std::regex_search(
      text, std::regex("SUMMARY: config=configs/baseline.json params=" + std::to_string(n) +
                       R"( peak_mem_bytes=\d+ alloc_mem_bytes=\d+ avg_step_time=\d+\.\d{4}\n)")));

  // Loss CSV: header + one row per step, values as the loop saw them.
  std::istringstream csv(slurp(o.loss_log_file));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "step,loss");
  for (int s = 0; s < 6; ++s) {
    ASSERT_TRUE(std::getline(csv, line));
    const auto comma = line.find(',');
    EXPECT_EQ(std::stoi(line.substr(0, comma)), s);
    EXPECT_EQ(float(std::stod(line.substr(comma + 1))), float(r.losses[s]));
  }
  EXPECT_FALSE(std::getline(csv, line));

  std::istringstream mj(slurp(o.metrics_file));
  int rows = 0;
  double elapsed = 0, steps_sum = 0;
  while (std::getline(mj, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"].get<int>(), rows);
    for (const char* k : {"loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "allocated_bytes", "reserved_bytes",
                          "peak_bytes", "elapsed_s"})
      EXPECT_TRUE(j.contains(k)) << k;
    // elapsed_s: the loop's clock from its first step, so it grows and holds every step's time.
    steps_sum += j["step_time_s"].get<double>();
    EXPECT_GT(j["elapsed_s"].get<double>(), elapsed) << rows;
    EXPECT_GE(j["elapsed_s"].get<double>(), steps_sum) << rows;
    elapsed = j["elapsed_s"].get<double>();
    EXPECT_FALSE(j.contains("eval_time_s")) << "no evaluation in this run";
    EXPECT_FLOAT_EQ(j["lr"].get<float>(), 1e-2f);
    EXPECT_GT(j["grad_norm"].get<double>(), 0);
    ++rows;
  }
  EXPECT_EQ(rows, 6);
  // A fixed batch, lr 1e-2: the loss must fall well below its start.
  EXPECT_LT(r.losses.back(), r.losses.front() - 0.3) << r.losses.front() << " -> " << r.losses.back();
  fs::remove_all(dir);
}

TEST(TrainLoop, ConfigErrorsNameTheFile) {
  train::TrainOptions o = tiny(1);
  o.deepspeed_config = "configs/does_not_exist.json";
  std::ostringstream out;
  try {
    train::run_training(o, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does_not_exist.json"), std::string::npos) << e.what();
  }
  const fs::path dir = temp_dir("badcfg");
  std::ofstream(dir / "bad.json") << "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"fast\"}}}";
  o.deepspeed_config = dir / "bad.json";
  try {
    train::run_training(o, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lr"), std::string::npos) << e.what();
  }
  o = tiny(1);
  o.deepspeed_config.clear();
  EXPECT_THROW(train::run_training(o, out), Error);
  o = tiny(1);
  o.num_heads = 3;
  EXPECT_THROW(train::run_training(o, out), Error);
  fs::remove_all(dir);
}

TEST(TrainLoop, ResumeGivesBitIdenticalLosses) {
  auto rng = test::fresh_rng();
  const std::uint64_t seed = rng();
  const fs::path dir = temp_dir("resume");
  std::ostringstream out;
  train::TrainOptions full = tiny(seed);
  full.learning_rate = 3e-3f;
  train::TrainResult a = train::run_training(full, out);

  train::TrainOptions first = full;
  first.num_steps = 3;
  first.save_dir = dir / "ckpt";
  train::TrainResult b = train::run_training(first, out);
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json", "config.json", "manifest.json"})
    ASSERT_TRUE(fs::exists(dir / "ckpt" / "global_step3" / f)) << f;
  ASSERT_TRUE(fs::exists(dir / "ckpt" / "latest"));

  train::TrainOptions second = full;
  second.num_steps = 3;
  second.resume_dir = dir / "ckpt";
  second.loss_log_file = dir / "loss.csv";
  std::ostringstream out2;
  train::TrainResult c = train::run_training(second, out2);
  ASSERT_EQ(c.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b.losses[i], a.losses[i]) << i;
    EXPECT_EQ(c.losses[i], a.losses[3 + i]) << "step " << 3 + i;
  }
  // The resumed run numbers its steps from the checkpoint.
  EXPECT_NE(out2.str().find("Step 4: loss="), std::string::npos) << out2.str();
  EXPECT_EQ(out2.str().find("Step 0: loss="), std::string::npos) << out2.str();
  EXPECT_NE(slurp(second.loss_log_file).find("\n5,"), std::string::npos);
  // A model size other than the checkpoint's is refused, the flag and both sizes named.
  train::TrainOptions other = second;
  other.hidden_dim = 64;
  other.num_heads = 4;
  try {
    train::run_training(other, out2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--hidden_dim gives hidden_dim 64, the checkpoint ("), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(") has 32"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(TrainLoop, RealDataFromTokenShards) {
  auto rng = test::fresh_rng();
  const fs::path dir = temp_dir("real");
  // A shard of GPT-2 token ids (any value below 50257), written in llm.c's format.
  const std::vector<std::int32_t> toks = test::random_ints(4000, rng, 0, 50256);
  data::write_shard((dir / "train_000.bin").string(), toks);
  train::TrainOptions o = tiny(rng());
  o.vocab_size = 64;  // raised to the tokenizer's 50257 with real data, as the BF16 example does
  o.num_steps = 3;
  o.use_real_data = true;
  o.data = {(dir / "train_*.bin").string()};
  std::ostringstream out;
  train::TrainResult r = train::run_training(o, out);
  EXPECT_NE(out.str().find("vocab_size=50257"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("Dataset loaded: 4000 tokens"), std::string::npos) << out.str();
  ASSERT_EQ(r.losses.size(), 3u);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  // Without --data it is an error that says what is missing.
  o.data.clear();
  try {
    train::run_training(o, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--data"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(TrainLoop, LogInAMissingFolderFailsBeforeTheFirstStep) {
  for (const bool metrics : {false, true}) {
    train::TrainOptions o = tiny(2);
    const fs::path bad = temp_dir("nolog") / "missing" / "log.txt";
    (metrics ? o.metrics_file : o.loss_log_file) = bad;
    std::ostringstream out;
    try {
      train::run_training(o, out);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      const std::string flag = metrics ? "--metrics_file " : "--loss_log_file ";
      EXPECT_NE(e.message().find(flag + bad.string()), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("does not exist"), std::string::npos) << e.message();
    }
    EXPECT_EQ(out.str().find("Step 0"), std::string::npos) << out.str();
    EXPECT_EQ(out.str().find("Creating model"), std::string::npos) << "checked before the model is built";
  }
}

TEST(TrainLoop, StepsPerPrintWhenNoLogInterval) {
  const fs::path dir = temp_dir("spp");
  std::ofstream(dir / "c.json") << R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 4, "bf16": {"enabled": true}})";
  train::TrainOptions o = tiny(3);
  o.deepspeed_config = dir / "c.json";
  o.num_steps = 9;
  o.log_interval.reset();
  std::ostringstream out;
  train::run_training(o, out);
  for (int s = 0; s < 9; ++s)
    EXPECT_EQ(out.str().find("Step " + std::to_string(s) + ":") != std::string::npos, s % 4 == 0 || s == 8) << s;
  // --log_interval given wins over steps_per_print.
  o.log_interval = 3;
  std::ostringstream out3;
  train::run_training(o, out3);
  EXPECT_NE(out3.str().find("Step 3:"), std::string::npos);
  EXPECT_EQ(out3.str().find("Step 4:"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TrainLoop, ProgressLineOnlyWhenAsked) {
  train::TrainOptions o = tiny(4);
  std::ostringstream plain;
  train::run_training(o, plain);
  EXPECT_EQ(plain.str().find('\r'), std::string::npos);
  EXPECT_EQ(plain.str().find("ETA"), std::string::npos);
  o.progress = true;
  std::ostringstream tty;
  train::run_training(o, tty);
  const std::string t = tty.str();
  EXPECT_TRUE(std::regex_search(t, std::regex(R"(\r\[step 1/6\] ETA \d+s, [0-9,]+ tokens/s, mem \d+\.\d\d GB \(peak \d+\.\d\d GB\))")))
      << t;
  EXPECT_NE(t.find("[step 5/6]"), std::string::npos);
  EXPECT_EQ(t.find("[step 6/6]"), std::string::npos) << "no progress line after the last step";
  // Cleared before the next line: the Step and FINAL lines start clean.
  EXPECT_NE(t.find("\r\033[K[Rank 0] Step 2:"), std::string::npos) << t;
}

TEST(TrainLoop, WallClockBreakdownTurnsOnTheTimingReport) {
  const fs::path dir = temp_dir("wcb");
  std::ofstream(dir / "c.json") << R"({"train_micro_batch_size_per_gpu": 2, "wall_clock_breakdown": true, "bf16": {"enabled": true}})";
  train::TrainOptions o = tiny(5);
  o.deepspeed_config = dir / "c.json";
  std::ostringstream out;
  train::run_training(o, out);
  EXPECT_NE(out.str().find("wall_clock_breakdown: the timing report is on"), std::string::npos) << out.str();
  // The CPU backend has no CUDA events: it says so, as for --timing_report.
  EXPECT_NE(out.str().find("--timing_report: no report on the CPU backend"), std::string::npos) << out.str();
  fs::remove_all(dir);
}

TEST(TrainLoop, ConfigKeysNotActedOnAreWarnedAtStart) {
  const fs::path dir = temp_dir("warn");
  std::ofstream(dir / "c.json")
      << R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage3_max_live_parameters": 1e9}})";
  train::TrainOptions o = tiny(6);
  o.deepspeed_config = dir / "c.json";
  std::ostringstream out;
  train::run_training(o, out);
  const std::string t = out.str();
  const std::size_t w = t.find("[Rank 0] warning: config key zero_optimization.stage3_max_live_parameters is read but not acted on (");
  EXPECT_NE(w, std::string::npos) << t;
  EXPECT_LT(w, t.find("Step 0")) << "at start";
  std::ofstream(dir / "fp16.json") << R"({"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true}})";
  o.deepspeed_config = dir / "fp16.json";
  try {
    train::run_training(o, out);
    FAIL() << "fp16.enabled: true trained on the CPU backend (in fp32)";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("fp16.enabled: true with --device cpu: the CPU backend computes in fp32"),
              std::string::npos)
        << e.message();
  }
  fs::remove_all(dir);
}
