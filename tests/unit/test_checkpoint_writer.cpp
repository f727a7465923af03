// Background checkpoint writes on the CPU backend: the snapshot is the state of the step boundary
// whatever training does meanwhile, the async files are byte-identical to a synchronous save's,
// one save in flight at a time, a failed write (test-only fault) leaves no step folder and comes
// back as an outcome (async) or an error (sync), and the training loop reports it at the next step
// and goes on; bf16 moments are stored as BF16 and load back exactly.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "runtime/file_util.h"
#include "runtime/safetensors.h"
#include "tests/support/cpu_test_util.h"
#include "tests/support/test_support.h"
#include "tests/support/tiny_cpu_backend.h"
#include "train/checkpoint.h"
#include "train/checkpoint_store.h"
#include "train/checkpoint_writer.h"
#include "train/train_loop.h"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {

train::TrainConfig config() { return test::tiny_adamw_config("test:ckwriter"); }

struct Batch {
  std::vector<std::int32_t> tok, lab;
};
Batch random_batch(const train::BackendOptions& o, std::mt19937_64& rng) {
  const std::size_t n = std::size_t(o.batch) * o.seq;
  return {test::random_ints(n, rng, 0, o.dims.vocab - 1), test::random_ints(n, rng, 0, o.dims.vocab - 1)};
}

std::vector<std::string> names_in(const fs::path& d) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(d)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  ScopedEnv(const char* k, const char* v) : key(k) { ::setenv(k, v, 1); }
  ~ScopedEnv() { ::unsetenv(key); }
  const char* key;
};

void expect_same_state(const train::HostState& a, const train::HostState& b) {
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.exp_avg, b.exp_avg);
  EXPECT_EQ(a.exp_avg_sq, b.exp_avg_sq);
}

}  // namespace

TEST(CheckpointWriter, AsyncSaveHoldsTheStepBoundaryStateAndMatchesASyncSaveByteForByte) {
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::tiny_backend(rng());
  auto be = train::make_cpu_backend(o, config());
  Batch b = random_batch(o, rng);
  be->step(b.tok.data(), b.lab.data(), 1, 1e-2f);
  const train::HostState at_save = be->save_state();
  const fs::path dir = test::fresh_temp_dir("ckwriter", "async");

  train::CheckpointWriter w({dir / "async", train::CheckpointIo::Plain, 0, /*async=*/true, true});
  w.save(*be, {1, "rng-1", "baseline", false});
  // Training goes on while the write runs: later steps change the backend, not the snapshot.
  for (int s = 2; s <= 4; ++s) {
    b = random_batch(o, rng);
    be->step(b.tok.data(), b.lab.data(), s, 1e-2f);
  }
  w.wait();
  EXPECT_FALSE(w.in_flight());
  const auto done = w.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok) << done[0].error;
  EXPECT_TRUE(done[0].background);
  EXPECT_EQ(done[0].step, 1);
  EXPECT_GT(done[0].report.bytes, 0u);
  EXPECT_TRUE(w.take_finished().empty());  // reported once

  auto into = train::make_cpu_backend(o, config());
  EXPECT_EQ(train::load_checkpoint(dir / "async", *into).step, 1);
  expect_same_state(into->save_state(), at_save);

  // The same state saved synchronously: the same files, byte for byte (the manifest's checksums).
  train::save_checkpoint(dir / "sync", *into, {1, "rng-1", "baseline", false}, {train::CheckpointIo::Plain, true, 0});
  const auto ma = train::open_checkpoint(dir / "async").manifest, ms = train::open_checkpoint(dir / "sync").manifest;
  ASSERT_EQ(ma.files.size(), ms.files.size());
  for (std::size_t i = 0; i < ma.files.size(); ++i) {
    EXPECT_EQ(ma.files[i].name, ms.files[i].name);
    EXPECT_EQ(ma.files[i].xxh64, ms.files[i].xxh64) << ma.files[i].name;
  }
  fs::remove_all(dir);
}

TEST(CheckpointWriter, OneSaveInFlightAndKeepLastAcrossBackgroundSaves) {
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::tiny_backend(rng());
  auto be = train::make_cpu_backend(o, config());
  const fs::path dir = test::fresh_temp_dir("ckwriter", "inflight");
  train::CheckpointWriter w({dir, train::CheckpointIo::Aio, 2, /*async=*/true, true});
  for (int s = 1; s <= 4; ++s) {
    const Batch b = random_batch(o, rng);
    be->step(b.tok.data(), b.lab.data(), s, 1e-2f);
    w.save(*be, {s, "rng", "baseline", false});  // waits for the previous write first
  }
  w.wait();
  const auto done = w.take_finished();
  ASSERT_EQ(done.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(done[i].step, i + 1);
    EXPECT_TRUE(done[i].ok) << done[i].error;
  }
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"global_step3", "global_step4", "latest"}));
  auto into = train::make_cpu_backend(o, config());
  EXPECT_EQ(train::load_checkpoint(dir, *into).step, 4);
  expect_same_state(into->save_state(), be->save_state());
  fs::remove_all(dir);
}

TEST(CheckpointWriter, AFailedWriteLeavesNoStepFolderAndIsReported) {
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::tiny_backend(rng());
  auto be = train::make_cpu_backend(o, config());
  const fs::path dir = test::fresh_temp_dir("ckwriter", "fail");
  for (const char* stage : {"start", "files", "manifest"}) {
    SCOPED_TRACE(stage);
    fs::remove_all(dir);
    train::CheckpointWriter w({dir, train::CheckpointIo::Plain, 0, /*async=*/true, true});
    w.save(*be, {2, "rng", "baseline", false});
    w.wait();
    const std::string fault = std::string(stage) + "@4";
    ScopedEnv env("CUTRAIN_TEST_CHECKPOINT_FAIL", fault.c_str());
    w.save(*be, {4, "rng", "baseline", false});
    w.wait();
    const auto done = w.take_finished();
    ASSERT_EQ(done.size(), 2u);
    EXPECT_TRUE(done[0].ok);
    EXPECT_FALSE(done[1].ok);
    EXPECT_HAS(done[1].error, "the write of step 4 failed at '" + std::string(stage) + "'");
    // Nothing of step 4 is left; latest names the complete save of step 2.
    EXPECT_EQ(names_in(dir), (std::vector<std::string>{"global_step2", "latest"}));
    EXPECT_EQ(train::open_checkpoint(dir).manifest.step, 2);
    // Sync: the same failure is an error of save() itself.
    train::CheckpointWriter sync({dir, train::CheckpointIo::Plain, 0, /*async=*/false, true});
    EXPECT_HAS(test::message_of([&] { sync.save(*be, {4, "rng", "baseline", false}); }), "failed at '" + std::string(stage));
    EXPECT_EQ(names_in(dir), (std::vector<std::string>{"global_step2", "latest"}));
  }
  fs::remove_all(dir);
}

TEST(CheckpointWriter, Bf16MomentsAreStoredAsBf16AndLoadBackExactly) {
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::tiny_backend(rng());
  auto be = train::make_cpu_backend(o, config());
  train::HostState h = be->save_state();
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto* v : {&h.exp_avg, &h.exp_avg_sq})
    for (float& x : *v) x = round_bf16(u(rng));  // what bf16 moments can hold
  h.moment_dtype = DType::BF16;
  train::StateSnapshot snap;
  train::snapshot_from_host_state(h, snap);
  EXPECT_EQ(snap.exp_avg.dtype(), DType::BF16);
  EXPECT_EQ(snap.bytes(), h.params.size() * (4 + 2 + 2));  // fp32 params (CPU), no master, bf16 moments
  const fs::path dir = test::fresh_temp_dir("ckwriter", "bf16");
  train::write_checkpoint(dir, be->table(), snap, {3, "rng", "bf16_full", false}, {train::CheckpointIo::Plain, true, 0});
  const auto c = train::open_checkpoint(dir);
  EXPECT_EQ(c.manifest.config.value("optimizer_dtype", std::string()), "BF16");
  SafetensorsReader r(c.folder / train::kCheckpointOptimFile);
  for (const auto& t : r.tensors()) EXPECT_EQ(t.dtype, DType::BF16) << t.name;
  auto into = train::make_cpu_backend(o, config());
  train::load_checkpoint(c, *into);
  const train::HostState back = into->save_state();
  std::size_t checked = 0;
  for (const auto& t : be->table().tensors())  // the real elements (the flat layout's padding is not stored)
    for (std::size_t i = t.offset; i < t.offset + t.count; ++i, ++checked) {
      ASSERT_EQ(back.exp_avg[i], h.exp_avg[i]) << t.name << " " << i;
      ASSERT_EQ(back.exp_avg_sq[i], h.exp_avg_sq[i]) << t.name << " " << i;
      ASSERT_EQ(back.params[i], h.params[i]) << t.name << " " << i;
    }
  EXPECT_EQ(checked, be->table().num_params());
  fs::remove_all(dir);
}

namespace {
train::TrainOptions tiny_run(std::uint64_t seed, const fs::path& save) {
  train::TrainOptions o = test::tiny_train_options(seed);
  o.save_dir = save;
  o.save_interval = 2;
  return o;
}
}  // namespace

TEST(CheckpointWriter, TheLoopReportsAFailedBackgroundSaveAndTrainsOn) {
  auto rng = test::fresh_rng();
  const std::uint64_t seed = rng();
  const fs::path dir = test::fresh_temp_dir("ckwriter", "loop");
  std::ostringstream ref_out;
  const train::TrainResult ref = train::run_training(tiny_run(seed, dir / "ref"), ref_out);
  EXPECT_HAS(ref_out.str(), "in the background");
  EXPECT_TRUE(ref.saves.async);
  EXPECT_EQ(ref.saves.saves, 3);  // after 2 and 4, and the final one (6)
  EXPECT_TRUE(ref.saves.failed_steps.empty());

  std::ostringstream out;
  train::TrainResult r;
  {
    ScopedEnv env("CUTRAIN_TEST_CHECKPOINT_FAIL", "files@4");
    r = train::run_training(tiny_run(seed, dir / "ck"), out);
  }
  EXPECT_EQ(r.losses, ref.losses);  // training went on, unchanged
  EXPECT_EQ(r.saves.failed_steps, std::vector<int>{4});
  EXPECT_HAS(out.str(), "error: the checkpoint of step 4 was not saved: checkpoint: the write of step 4 failed at 'files'");
  EXPECT_HAS(out.str(), "the last complete checkpoint is " + (dir / "ck" / "global_step2").string());
  EXPECT_HAS(out.str(), "[Rank 0] checkpoint: 1 of 3 saves failed (step 4)");
  EXPECT_EQ(names_in(dir / "ck"), (std::vector<std::string>{"global_step2", "global_step6", "latest"}));

  EXPECT_HAS(ref_out.str(), "[Rank 0] checkpoint: saves in the background from a ");
  // Sync saves: the same folders and losses, no background line.
  train::TrainOptions so = tiny_run(seed, dir / "sync");
  so.save_mode = train::SaveMode::Sync;
  std::ostringstream sync_out;
  const train::TrainResult rs = train::run_training(so, sync_out);
  EXPECT_EQ(rs.losses, ref.losses);
  EXPECT_FALSE(rs.saves.async);
  EXPECT_EQ(rs.saves.saves, 3);
  EXPECT_EQ(sync_out.str().find("in the background"), std::string::npos) << sync_out.str();
  EXPECT_HAS(sync_out.str(), "Checkpoint saved to: " + (dir / "sync" / "global_step6").string() + " (step 6)");
  EXPECT_EQ(train::open_checkpoint(dir / "sync").manifest.step, 6);

  // --save_mode without --save is refused before any work.
  train::TrainOptions nosave = tiny_run(seed, "");
  nosave.save_interval.reset();
  nosave.save_mode = train::SaveMode::Async;
  EXPECT_HAS(test::message_of([&] { train::run_training(nosave, sync_out); }),
             "--save_mode async: expected --save DIR with it, found none");

  // The final save failing fails the run (after its lines), sync or async.
  for (auto mode : {train::SaveMode::Async, train::SaveMode::Sync}) {
    train::TrainOptions f = tiny_run(seed, dir / ("final_" + std::string(train::name(mode))));
    f.save_mode = mode;
    ScopedEnv env("CUTRAIN_TEST_CHECKPOINT_FAIL", "files@6");
    std::ostringstream fo;
    EXPECT_HAS(test::message_of([&] { train::run_training(f, fo); }), "failed at 'files'");
    EXPECT_EQ(train::open_checkpoint(f.save_dir).manifest.step, 4);
  }
  fs::remove_all(dir);
}

// A resume reads each payload file once: the checksums computed in the same pass (aio: with the
// header in the read; plain: a second pass), a damaged file refused at load before the backend's
// state changes, with the verifier's message.
TEST(CheckpointWriter, ChecksumsOnLoadReadOnceAndRefuseADamagedFileBeforeTheStateChanges) {
  auto rng = test::fresh_rng();
  const train::BackendOptions o = test::tiny_backend(rng());
  auto be = train::make_cpu_backend(o, config());
  const Batch b = random_batch(o, rng);
  be->step(b.tok.data(), b.lab.data(), 1, 1e-2f);
  const fs::path dir = test::fresh_temp_dir("ckwriter", "onload");
  train::save_checkpoint(dir, *be, {1, "rng", "baseline", false}, {train::CheckpointIo::Plain, true, 0});
  for (auto io : {train::CheckpointIo::Aio, train::CheckpointIo::Plain}) {
    const auto c = train::open_checkpoint(dir, false, /*checksum_on_load=*/true);
    EXPECT_EQ(c.checksum_on_load.size(), 2u);
    auto into = train::make_cpu_backend(o, config());
    EXPECT_EQ(train::load_checkpoint(c, *into, io).step, 1);
    expect_same_state(into->save_state(), be->save_state());
  }
  // One flipped byte in the optimizer file's last tensor: the size is right, the open passes.
  const fs::path f = dir / "global_step1" / train::kCheckpointOptimFile;
  std::string bytes = read_text_file(f);
  bytes[bytes.size() - 3] ^= 0x40;
  write_file_atomic(f, std::string_view(bytes));
  for (auto io : {train::CheckpointIo::Aio, train::CheckpointIo::Plain}) {
    const auto c = train::open_checkpoint(dir, false, /*checksum_on_load=*/true);
    auto into = train::make_cpu_backend(o, config());
    const train::HostState before = into->save_state();
    EXPECT_HAS(test::message_of([&] { train::load_checkpoint(c, *into, io); }),
               "checkpoint " + (dir / "global_step1").string() + ": file optimizer.safetensors: expected XXH64 ");
    expect_same_state(into->save_state(), before);
  }
  // Without checksum_on_load the open itself refuses it.
  EXPECT_HAS(test::message_of([&] { train::open_checkpoint(dir); }), "file optimizer.safetensors: expected XXH64 ");
  fs::remove_all(dir);
}
