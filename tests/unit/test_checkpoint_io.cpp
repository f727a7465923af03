// Checkpoint I/O through the aio handle against plain buffered I/O, on the CPU backend: the aio
// file layer (chunked atomic writes, ranged reads, errors), byte-identical checkpoint files from
// both paths, and a bit-identical resume from a checkpoint written and read either way.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "runtime/aio/aio_file.h"
#include "runtime/error.h"
#include "runtime/file_util.h"
#include "tests/support/test_support.h"
#include "train/checkpoint.h"
#include "train/checkpoint_io.h"
#include "train/config.h"
#include "train/cpu_backend.h"
#include "tests/support/cpu_test_util.h"
#include "tests/support/tiny_cpu_backend.h"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& tag) { return test::fresh_temp_dir("ckptio", tag); }

std::vector<std::byte> random_bytes(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng() & 0xFF);
  return v;
}

train::TrainConfig adamw_config() { return test::tiny_adamw_config("test:ckptio"); }

struct Batches {
  std::vector<std::vector<std::int32_t>> tok, lab;
};
Batches make_batches(int steps, const train::BackendOptions& o, std::mt19937_64& rng) {
  Batches b;
  const std::size_t n = std::size_t(o.batch) * o.seq;
  for (int i = 0; i < steps; ++i) {
    b.tok.push_back(test::random_ints(n, rng, 0, o.dims.vocab - 1));
    b.lab.push_back(test::random_ints(n, rng, 0, o.dims.vocab - 1));
  }
  return b;
}

std::vector<double> run_steps(train::TrainBackend& be, const Batches& b, int from, int to) {
  std::vector<double> losses;
  for (int i = from; i < to; ++i) losses.push_back(be.step(b.tok[i].data(), b.lab[i].data(), i + 1, 1e-2f).loss);
  return losses;
}

}  // namespace

TEST(AioFile, WriteIsAtomicAndEqualsThePiecesForEveryChunkBoundary) {
  auto rng = test::fresh_rng();
  const fs::path dir = temp_dir("write");
  aio::AioHandle h;
  // Pieces of odd sizes: chunk boundaries fall inside pieces, and the file ends unaligned.
  std::vector<std::vector<std::byte>> parts{random_bytes(13, rng), random_bytes(8192 * 3 + 7, rng),
                                            random_bytes(0, rng), random_bytes(4096, rng), random_bytes(5001, rng)};
  std::vector<std::byte> expect;
  std::vector<std::span<const std::byte>> pieces;
  for (const auto& p : parts) {
    pieces.emplace_back(p);
    expect.insert(expect.end(), p.begin(), p.end());
  }
  for (std::size_t chunk : {std::size_t(4096), std::size_t(8192), std::size_t(1) << 20}) {
    const fs::path f = dir / ("f" + std::to_string(chunk));
    write_file_atomic(f, std::string_view("old content"));
    aio::write_file_atomic(h, f, pieces, chunk);
    EXPECT_EQ(read_file(f), expect) << "chunk " << chunk;
  }
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++entries;
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "temp file left: " << e.path();
  }
  EXPECT_EQ(entries, 3u);
  EXPECT_THROW(aio::write_file_atomic(h, dir / "x", pieces, 1000), Error);  // not a multiple of 4096
}

TEST(AioFile, ReadRangesScattersAnyOrderAndNamesTheFileAtEof) {
  auto rng = test::fresh_rng();
  const fs::path dir = temp_dir("read");
  const std::vector<std::byte> data = random_bytes(70000, rng);
  const fs::path f = dir / "data.bin";
  write_file_atomic(f, std::span<const std::byte>(data));
  aio::AioHandle h;
  // Unsorted, unaligned ranges crossing 8 KiB chunks, one covering several chunks, one empty.
  const std::vector<std::pair<std::uint64_t, std::size_t>> spans{{69999, 1}, {5, 20000}, {30001, 4096}, {0, 3}, {40000, 0}, {20005, 10000}};
  for (std::size_t chunk : {std::size_t(4096), std::size_t(8192), std::size_t(1) << 20}) {
    std::vector<std::vector<std::byte>> dst;
    std::vector<aio::FileRange> ranges;
    dst.reserve(spans.size());
    for (auto [off, n] : spans) {
      dst.emplace_back(n, std::byte{0});
      ranges.push_back({off, dst.back().data(), n});
    }
    aio::read_ranges(h, f, ranges, chunk);
    for (std::size_t i = 0; i < spans.size(); ++i)
      EXPECT_TRUE(std::equal(dst[i].begin(), dst[i].end(), data.begin() + spans[i].first))
          << "range " << i << " chunk " << chunk;
  }
  std::vector<std::byte> past(10);
  const std::vector<aio::FileRange> bad{{69995, past.data(), 10}};
  try {
    aio::read_ranges(h, f, bad);
    FAIL() << "expected an error reading past the end";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("data.bin"), std::string::npos) << e.message();
  }
}

TEST(CheckpointIo, ParsesNamesAndTheEnvironmentOverride) {
  EXPECT_EQ(train::parse_checkpoint_io("aio"), train::CheckpointIo::Aio);
  EXPECT_EQ(train::parse_checkpoint_io("plain"), train::CheckpointIo::Plain);
  EXPECT_EQ(train::parse_checkpoint_io("auto"), train::CheckpointIo::Auto);
  EXPECT_THROW(train::parse_checkpoint_io("odirect"), Error);
  EXPECT_EQ(train::CheckpointFiles(train::CheckpointIo::Plain).io(), train::CheckpointIo::Plain);
  EXPECT_EQ(train::CheckpointFiles(train::CheckpointIo::Aio).io(), train::CheckpointIo::Aio);
  ::setenv("CUTRAIN_CHECKPOINT_IO", "plain", 1);
  EXPECT_EQ(train::CheckpointFiles().io(), train::CheckpointIo::Plain);
  ::setenv("CUTRAIN_CHECKPOINT_IO", "aio", 1);
  EXPECT_EQ(train::CheckpointFiles().io(), train::CheckpointIo::Aio);
  EXPECT_EQ(train::CheckpointFiles(train::CheckpointIo::Plain).io(), train::CheckpointIo::Plain);  // an explicit choice wins
  ::setenv("CUTRAIN_CHECKPOINT_IO", "fast", 1);
  try {
    train::CheckpointFiles f;
    ADD_FAILURE() << "expected an error for CUTRAIN_CHECKPOINT_IO=fast";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("CUTRAIN_CHECKPOINT_IO=fast"), std::string::npos) << e.message();
  }
  ::unsetenv("CUTRAIN_CHECKPOINT_IO");
  const train::CheckpointIo chosen = train::CheckpointFiles().io();
  EXPECT_TRUE(chosen == train::CheckpointIo::Aio || chosen == train::CheckpointIo::Plain);
}

TEST(CheckpointIo, BothPathsWriteByteIdenticalFiles) {
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::tiny_backend(rng());
  auto be = train::make_cpu_backend(o, adamw_config());
  const Batches b = make_batches(2, o, rng);
  run_steps(*be, b, 0, 2);
  const fs::path plain = temp_dir("plain"), viaaio = temp_dir("aio");
  train::save_checkpoint(plain, *be, {2, "rng-state", "baseline", false}, {train::CheckpointIo::Plain, true, 0});
  train::save_checkpoint(viaaio, *be, {2, "rng-state", "baseline", false}, {train::CheckpointIo::Aio, true, 0});
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json", "config.json",
                        "manifest.json"}) {
    const auto a = read_file(plain / "global_step2" / f), c = read_file(viaaio / "global_step2" / f);
    EXPECT_GT(a.size(), 0u) << f;
    EXPECT_TRUE(a == c) << f << ": plain " << a.size() << " bytes, aio " << c.size() << " bytes";
  }
}

TEST(CheckpointIo, ResumeIsBitIdenticalWhicheverPathWroteOrReads) {
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::tiny_backend(rng());
  const train::TrainConfig c = adamw_config();
  const Batches b = make_batches(5, o, rng);
  auto ref = train::make_cpu_backend(o, c);
  run_steps(*ref, b, 0, 2);
  const fs::path dir = temp_dir("resume");
  train::save_checkpoint(dir, *ref, {2, "rng-state", "baseline", false}, {train::CheckpointIo::Aio, true, 0});
  const std::vector<double> want = run_steps(*ref, b, 2, 5);
  const train::HostState want_state = ref->save_state();
  for (train::CheckpointIo io : {train::CheckpointIo::Aio, train::CheckpointIo::Plain}) {
    auto be = train::make_cpu_backend(test::tiny_backend(o.seed + 1), c);  // other initial weights: everything must come from the file
    const train::CheckpointMeta meta = train::load_checkpoint(dir, *be, io);
    EXPECT_EQ(meta.step, 2);
    EXPECT_EQ(meta.data_rng, "rng-state");
    EXPECT_EQ(run_steps(*be, b, 2, 5), want) << train::checkpoint_io_name(io);
    const train::HostState got = be->save_state();
    EXPECT_TRUE(got.params == want_state.params) << train::checkpoint_io_name(io);
    EXPECT_TRUE(got.master == want_state.master) << train::checkpoint_io_name(io);
    EXPECT_TRUE(got.exp_avg == want_state.exp_avg) << train::checkpoint_io_name(io);
    EXPECT_TRUE(got.exp_avg_sq == want_state.exp_avg_sq) << train::checkpoint_io_name(io);
  }
}

// fp16's dynamic loss scaler rides in trainer_state.json under DeepSpeed's names and comes back as
// saved; a checkpoint without it (no fp16) loads with none.
TEST(CheckpointIo, LossScalerStateRoundTrips) {
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::tiny_backend(rng());
  auto be = train::make_cpu_backend(o, adamw_config());
  const fs::path with = temp_dir("scaler"), without = temp_dir("noscaler");
  train::CheckpointMeta meta{4, "rng-state", "baseline", false};
  train::LossScalerState ls;
  ls.scale = 16384;
  ls.iter = 4;
  ls.last_overflow_iter = 2;
  ls.hysteresis = 1;
  meta.loss_scaler = ls;
  train::save_checkpoint(with, *be, meta);
  train::save_checkpoint(without, *be, {4, "rng-state", "baseline", false});
  const std::string text = read_text_file(with / "global_step4" / "trainer_state.json");
  for (const char* key : {"\"cur_scale\": 16384", "\"cur_iter\": 4", "\"last_overflow_iter\": 2", "\"cur_hysteresis\": 1"})
    EXPECT_NE(text.find(key), std::string::npos) << key << " in " << text;
  EXPECT_EQ(read_text_file(without / "global_step4" / "trainer_state.json").find("loss_scaler"), std::string::npos);

  const train::CheckpointMeta got = train::load_checkpoint(with / "global_step4", *be);
  ASSERT_TRUE(got.loss_scaler.has_value());
  EXPECT_EQ(got.loss_scaler->scale, 16384);
  EXPECT_EQ(got.loss_scaler->iter, 4);
  EXPECT_EQ(got.loss_scaler->last_overflow_iter, 2);
  EXPECT_EQ(got.loss_scaler->hysteresis, 1);
  EXPECT_FALSE(train::load_checkpoint(without / "global_step4", *be).loss_scaler.has_value());
}
