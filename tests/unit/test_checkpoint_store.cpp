// Checkpoints as folders, on the CPU backend: XXH64 against the reference's published values, the
// step-folder layout and its manifest, the verifier's refusals (truncated, flipped byte, missing
// file, mixed files, wrong step, `latest` naming a missing folder, the pre-manifest layout), the
// unlisted-file note, --save_interval / --keep_last bookkeeping, stale-temporary cleanup, and the
// training loop's checkpoint flags (interval saves, shape from the checkpoint, flag errors).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/xxhash64.h"
#include "tests/support/test_support.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/checkpoint_store.h"
#include "train/config.h"
#include "train/cpu_backend.h"
#include "train/train_loop.h"
#include "tests/support/cpu_test_util.h"
#include "tests/support/tiny_cpu_backend.h"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& tag) { return test::fresh_temp_dir("ckstore", tag); }

train::TrainConfig adamw_config() { return test::tiny_adamw_config("test:ckstore"); }

// A root with a saved step folder of `step` steps (a backend stepped once).
std::unique_ptr<train::TrainBackend> stepped_backend(std::uint64_t seed) {
  const train::BackendOptions o = test::tiny_backend(seed);
  auto be = train::make_cpu_backend(o, adamw_config());
  auto rng = test::fresh_rng();
  const std::size_t n = std::size_t(o.batch) * o.seq;
  const auto tok = test::random_ints(n, rng, 0, o.dims.vocab - 1), lab = test::random_ints(n, rng, 0, o.dims.vocab - 1);
  be->step(tok.data(), lab.data(), 1, 1e-2f);
  return be;
}

train::CheckpointMeta meta(int step) { return {step, "rng-" + std::to_string(step), "baseline", false}; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "expected '" << part << "' in: " << text;
}

void flip_byte(const fs::path& p, std::uint64_t at) {
  std::vector<std::byte> b = read_file(p);
  b.at(at) ^= std::byte{0x01};
  write_file_atomic(p, std::span<const std::byte>(b));
}

std::vector<std::string> names_in(const fs::path& d) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(d)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

train::TrainOptions tiny_run(std::uint64_t seed) { return test::tiny_train_options(seed); }

}  // namespace

TEST(Xxh64, MatchesTheReferenceValuesAndStreamsInAnyPieces) {
  EXPECT_EQ(xxh64("", 0), 0xef46db3751d8e999ULL);
  EXPECT_EQ(xxh64("abc", 3), 0x44bc2cf5ad770999ULL);
  const std::string s = "Nobody inspects the spammish repetition";  // python-xxhash's documented example
  EXPECT_EQ(xxh64(s.data(), s.size()), 0xfbcea83c8a378bf1ULL);
  EXPECT_EQ(xxh64("xxhash", 6, 20141025), 0xb559b98d844e0635ULL);
  EXPECT_EQ(xxh64_hex(0xfbcea83c8a378bf1ULL), "fbcea83c8a378bf1");
  auto rng = test::fresh_rng();
  std::vector<unsigned char> data(5000);
  for (auto& c : data) c = static_cast<unsigned char>(rng());
  const std::uint64_t whole = xxh64(data.data(), data.size());
  for (std::size_t piece : {1, 3, 31, 32, 33, 64, 1000}) {
    Xxh64 x;
    for (std::size_t off = 0; off < data.size(); off += piece) x.update(data.data() + off, std::min(piece, data.size() - off));
    EXPECT_EQ(x.digest(), whole) << "pieces of " << piece;
  }
  const fs::path dir = temp_dir("xxh");
  write_file_atomic(dir / "f", std::span<const std::byte>(reinterpret_cast<const std::byte*>(data.data()), data.size()));
  const FileDigest d = xxh64_file(dir / "f");
  EXPECT_EQ(d.bytes, data.size());
  EXPECT_EQ(d.xxh64, whole);
  fs::remove_all(dir);
}

TEST(CheckpointFolder, SaveWritesAStepFolderItsManifestAndLatest) {
  auto be = stepped_backend(1);
  const fs::path root = temp_dir("layout");
  const auto r = train::save_checkpoint(root, *be, meta(3), {train::CheckpointIo::Plain, true, 0});
  EXPECT_EQ(r.folder, root / "global_step3");
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"global_step3", "latest"}));
  EXPECT_EQ(read_text_file(root / "latest"), "global_step3");  // DeepSpeed's: the tag, no newline
  EXPECT_EQ(names_in(root / "global_step3"),
            (std::vector<std::string>{"config.json", "manifest.json", "model.safetensors", "optimizer.safetensors",
                                      "trainer_state.json"}));
  const nlohmann::json m = nlohmann::json::parse(read_text_file(root / "global_step3" / "manifest.json"));
  EXPECT_EQ(m["format"], "cutrain-checkpoint");
  EXPECT_EQ(m["format_version"], 1);
  EXPECT_EQ(m["step"], 3);
  EXPECT_EQ(m["tag"], "global_step3");
  EXPECT_EQ(m["checksum"], "xxh64");
  ASSERT_EQ(m["files"].size(), 4u);
  for (const auto& f : m["files"]) {
    const fs::path p = root / "global_step3" / f["name"].get<std::string>();
    const FileDigest d = xxh64_file(p);
    EXPECT_EQ(f["bytes"], d.bytes) << p;
    EXPECT_EQ(f["xxh64"], xxh64_hex(d.xxh64)) << p;
  }
  const nlohmann::json c = nlohmann::json::parse(read_text_file(root / "global_step3" / "config.json"));
  EXPECT_EQ(c, m["config"]);
  EXPECT_EQ(c["hidden_dim"], 32);
  EXPECT_EQ(c["num_layers"], 2);
  EXPECT_EQ(c["num_heads"], 2);
  EXPECT_EQ(c["vocab_size"], 64);
  EXPECT_EQ(c["embedding_rows"], 64);
  EXPECT_EQ(c["max_seq_len"], 8);
  EXPECT_EQ(c["ffn_dim"], 128);
  EXPECT_EQ(c["precision_layout"], "baseline");
  EXPECT_EQ(c["param_dtype"], "F32");  // the CPU backend's params
  EXPECT_EQ(c["num_params"], be->table().num_params());
  // Resolving: the root follows latest, the step folder is itself.
  EXPECT_EQ(train::open_checkpoint(root).folder, root / "global_step3");
  EXPECT_EQ(train::open_checkpoint(root / "global_step3").folder, root / "global_step3");
  EXPECT_EQ(train::open_checkpoint(root).manifest.step, 3);
  fs::remove_all(root);
}

TEST(CheckpointFolder, VerifierRefusesTruncatedFlippedMissingAndMixedFiles) {
  auto be = stepped_backend(2);
  auto other = stepped_backend(3);
  const fs::path root = temp_dir("verify");
  train::save_checkpoint(root, *be, meta(2), {train::CheckpointIo::Plain, true, 0});
  const fs::path pristine = temp_dir("pristine");
  fs::copy(root / "global_step2", pristine, fs::copy_options::recursive);
  auto fresh = [&] {
    fs::remove_all(root / "global_step2");
    fs::copy(pristine, root / "global_step2", fs::copy_options::recursive);
  };
  const fs::path model = root / "global_step2" / "model.safetensors";
  const std::uint64_t size = fs::file_size(model);

  fs::resize_file(model, size - 10);
  std::string e = error_of([&] { train::open_checkpoint(root); });
  expect_has(e, (root / "global_step2").string());
  expect_has(e, "model.safetensors");
  expect_has(e, "expected " + std::to_string(size) + " bytes, found " + std::to_string(size - 10) + " (truncated)");

  fresh();
  flip_byte(model, size / 2);
  e = error_of([&] { train::open_checkpoint(root); });
  expect_has(e, "model.safetensors: expected XXH64 ");
  expect_has(e, ", found ");

  fresh();
  fs::remove(root / "global_step2" / "optimizer.safetensors");
  e = error_of([&] { train::open_checkpoint(root); });
  expect_has(e, "optimizer.safetensors: expected ");
  expect_has(e, "found no such file");

  // Mixed: the new model file with the old optimizer state (same sizes, other content).
  fresh();
  const fs::path other_root = temp_dir("other");
  train::save_checkpoint(other_root, *other, meta(2), {train::CheckpointIo::Plain, true, 0});
  fs::copy_file(other_root / "global_step2" / "model.safetensors", model, fs::copy_options::overwrite_existing);
  e = error_of([&] { train::open_checkpoint(root); });
  expect_has(e, "model.safetensors: expected XXH64");

  // No manifest: the folder is incomplete, whatever else it holds.
  fresh();
  fs::remove(root / "global_step2" / "manifest.json");
  e = error_of([&] { train::open_checkpoint(root / "global_step2"); });
  expect_has(e, "incomplete");
  e = error_of([&] { train::open_checkpoint(root); });
  expect_has(e, "expected manifest.json");

  // An unlisted file is accepted and named in the notes (nothing reads it).
  fresh();
  write_file_atomic(root / "global_step2" / "README.txt", std::string_view("mine"));
  const train::OpenedCheckpoint c = train::open_checkpoint(root);
  ASSERT_EQ(c.notes.size(), 1u);
  expect_has(c.notes[0], "README.txt");
  auto into = train::make_cpu_backend(test::tiny_backend(9), adamw_config());
  EXPECT_EQ(train::load_checkpoint(c, *into).step, 2);
  EXPECT_TRUE(into->save_state().params == be->save_state().params);
  fs::remove_all(root);
  fs::remove_all(pristine);
  fs::remove_all(other_root);
}

TEST(CheckpointFolder, VerifierRefusesAWrongStepAndALatestNamingNothing) {
  auto be = stepped_backend(4);
  const fs::path root = temp_dir("step");
  train::save_checkpoint(root, *be, meta(4), {train::CheckpointIo::Plain, true, 0});
  // A step folder renamed: its name and its manifest disagree.
  fs::rename(root / "global_step4", root / "global_step6");
  std::string e = error_of([&] { train::open_checkpoint(root / "global_step6"); });
  expect_has(e, "the folder's name says step 6, manifest.json says step 4");
  // `latest` names a folder that is not there.
  e = error_of([&] { train::open_checkpoint(root); });
  expect_has(e, "latest names 'global_step4', found no folder " + (root / "global_step4").string());
  expect_has(e, "step folders there: global_step6");
  fs::rename(root / "global_step6", root / "global_step4");
  // trainer_state.json of another step, re-listed in the manifest with its true size and sum: the
  // manifest's step still disagrees.
  const fs::path f = root / "global_step4";
  write_file_atomic(f / "trainer_state.json", std::string_view(R"({"step": 5, "data_rng": "x", "num_params": 1})"));
  nlohmann::json m = nlohmann::json::parse(read_text_file(f / "manifest.json"));
  for (auto& x : m["files"])
    if (x["name"] == "trainer_state.json") {
      const FileDigest d = xxh64_file(f / "trainer_state.json");
      x["bytes"] = d.bytes;
      x["xxh64"] = xxh64_hex(d.xxh64);
    }
  write_file_atomic(f / "manifest.json", std::string_view(m.dump()));
  e = error_of([&] { train::open_checkpoint(root); });
  expect_has(e, "trainer_state.json: expected step 4 (the manifest's), found 5");
  // Another format version.
  m["format_version"] = 7;
  write_file_atomic(f / "manifest.json", std::string_view(m.dump()));
  e = error_of([&] { train::open_checkpoint(root); });
  expect_has(e, "format_version: expected 1");
  expect_has(e, "found 7");
  // Neither latest nor a manifest.
  const fs::path empty = temp_dir("empty");
  e = error_of([&] { train::open_checkpoint(empty); });
  expect_has(e, "found neither");
  e = error_of([&] { train::open_checkpoint(empty / "nope"); });
  expect_has(e, "does not exist");
  fs::remove_all(root);
  fs::remove_all(empty);
}

TEST(CheckpointFolder, TheLayoutBeforeManifestsIsRefusedUnlessAccepted) {
  auto be = stepped_backend(5);
  const fs::path root = temp_dir("legacy");
  train::save_checkpoint(root, *be, meta(1), {train::CheckpointIo::Plain, true, 0});
  const fs::path old = temp_dir("legacy_old");
  for (const char* n : {"model.safetensors", "optimizer.safetensors", "trainer_state.json"})
    fs::copy_file(root / "global_step1" / n, old / n);
  const std::string e = error_of([&] { train::open_checkpoint(old); });
  expect_has(e, old.string());
  expect_has(e, "the layout before manifests");
  expect_has(e, "--accept_legacy_checkpoint --save NEWDIR");
  const train::OpenedCheckpoint c = train::open_checkpoint(old, /*accept_legacy=*/true);
  EXPECT_TRUE(c.legacy);
  ASSERT_EQ(c.notes.size(), 1u);
  expect_has(c.notes[0], "warning");
  auto into = train::make_cpu_backend(test::tiny_backend(8), adamw_config());
  EXPECT_EQ(train::load_checkpoint(c, *into).step, 1);
  EXPECT_TRUE(into->save_state().params == be->save_state().params);
  // A temporary folder of a killed save is not mistaken for the old layout.
  fs::rename(old, root / "global_step9.tmp-12345");
  expect_has(error_of([&] { train::open_checkpoint(root / "global_step9.tmp-12345", true); }),
             "temporary folder of a save that did not finish");
  fs::remove_all(root);
}

TEST(CheckpointFolder, IntervalAndKeepLastBookkeeping) {
  EXPECT_FALSE(train::interval_save_due(3, 0));
  EXPECT_TRUE(train::interval_save_due(4, 2));
  EXPECT_FALSE(train::interval_save_due(5, 2));
  EXPECT_TRUE(train::interval_save_due(7, 1));
  using V = std::vector<int>;
  EXPECT_EQ(train::steps_to_prune({2, 4, 6, 8}, 8, 2), (V{2, 4}));
  EXPECT_EQ(train::steps_to_prune({8, 2, 6, 4}, 8, 1), (V{2, 4, 6}));
  EXPECT_EQ(train::steps_to_prune({2, 4, 6, 8}, 2, 2), (V{4}));  // latest (2) kept whatever its rank
  EXPECT_EQ(train::steps_to_prune({2, 4}, 4, 5), V{});
  EXPECT_EQ(train::steps_to_prune({2, 4, 6}, std::nullopt, 0), V{});  // 0: keep all
  EXPECT_EQ(train::step_tag(12), "global_step12");
  EXPECT_EQ(train::tag_step("global_step12"), 12);
  EXPECT_EQ(train::tag_step("global_step"), std::nullopt);
  EXPECT_EQ(train::tag_step("global_step1x"), std::nullopt);
  EXPECT_EQ(train::temp_folder_pid("global_step12.tmp-345"), 345);
  EXPECT_EQ(train::temp_folder_pid("global_step12.tmp-"), std::nullopt);
  EXPECT_EQ(train::temp_folder_pid("mine.tmp-345"), std::nullopt);

  auto be = stepped_backend(6);
  const fs::path root = temp_dir("keep");
  for (int s : {2, 4, 6}) train::save_checkpoint(root, *be, meta(s), {train::CheckpointIo::Plain, true, 2});
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"global_step4", "global_step6", "latest"}));
  // A run resumed from step 2 of another root saves step 4 again: the folder is replaced whole.
  const auto r = train::save_checkpoint(root, *be, {4, "again", "baseline", false}, {train::CheckpointIo::Plain, true, 1});
  EXPECT_EQ(read_text_file(root / "latest"), "global_step4");
  // keep_last 1 keeps the highest (6) and the one latest names (4).
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"global_step4", "global_step6", "latest"}));
  EXPECT_NE(read_text_file(root / "global_step4" / "trainer_state.json").find("again"), std::string::npos);
  EXPECT_EQ(train::open_checkpoint(root).manifest.step, 4);
  fs::remove_all(root);
}

TEST(CheckpointFolder, StaleTemporariesAreRemovedAtTheNextSave) {
  auto be = stepped_backend(7);
  const fs::path root = temp_dir("stale");
  train::save_checkpoint(root, *be, meta(2), {train::CheckpointIo::Plain, true, 0});
  // Left by killed saves: a half-written step folder and latest's temp file. Not ours: a folder of
  // another naming, a file that only looks alike, and a temp of a live process (this test's parent).
  const long dead_pid = 999999999;  // above pid_max: no such process
  fs::create_directories(root / ("global_step4.tmp-" + std::to_string(dead_pid)));
  write_file_atomic(root / ("global_step4.tmp-" + std::to_string(dead_pid)) / "model.safetensors", std::string_view("half"));
  write_file_atomic(root / ".latest.tmp.999999999.0", std::string_view("global_step4"));
  fs::create_directories(root / "backup.tmp-1");
  write_file_atomic(root / "global_step5.tmp-1.txt", std::string_view("user file"));
  const std::string live = "global_step6.tmp-" + std::to_string(::getppid());
  fs::create_directories(root / live);
  EXPECT_EQ(train::open_checkpoint(root).manifest.step, 2);  // the temps change nothing for resume
  const auto r = train::save_checkpoint(root, *be, meta(3), {train::CheckpointIo::Plain, true, 0});
  ASSERT_EQ(r.notes.size(), 1u);  // one line
  expect_has(r.notes[0], "global_step4.tmp-999999999");
  expect_has(r.notes[0], ".latest.tmp.999999999.0");
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"backup.tmp-1", "global_step2", "global_step3",
                                                      "global_step5.tmp-1.txt", live, "latest"}));
  fs::remove_all(root);
}

TEST(CheckpointLoop, IntervalSavesResumeWithoutShapeFlagsAndFlagErrors) {
  auto rng = test::fresh_rng();
  const std::uint64_t seed = rng();
  const fs::path dir = temp_dir("loop");
  std::ostringstream out;
  const train::TrainResult full = train::run_training(tiny_run(seed), out);

  train::TrainOptions a = tiny_run(seed);
  a.num_steps = 5;
  a.save_dir = dir / "ck";
  a.save_interval = 2;
  a.keep_last = 2;
  std::ostringstream outa;
  train::run_training(a, outa);
  // Saves after steps 2 and 4 and at the end (5); keep_last 2 leaves 4 and 5.
  EXPECT_EQ(names_in(dir / "ck"), (std::vector<std::string>{"global_step4", "global_step5", "latest"}));
  expect_has(outa.str(), "Checkpoint saved to: " + (dir / "ck" / "global_step2").string() + " (step 2)");
  expect_has(outa.str(), "--keep_last 2: deleted " + (dir / "ck" / "global_step2").string());

  // Resume from a step folder with no shape flags: config.json gives them.
  train::TrainOptions b = tiny_run(seed);
  b.hidden_dim = 999, b.num_layers = 7, b.num_heads = 3, b.vocab_size = 5, b.seq_length = 3;  // not "given"
  b.shape_given = {false, false, false, false, false, false};
  b.num_steps = 2;
  b.resume_dir = dir / "ck" / "global_step4";
  std::ostringstream outb;
  const train::TrainResult rb = train::run_training(b, outb);
  expect_has(outb.str(), "Resumed from " + (dir / "ck" / "global_step4").string() + " at step 4");
  expect_has(outb.str(), "hidden_dim=32, num_layers=2, num_heads=2, vocab_size=64");
  ASSERT_EQ(rb.losses.size(), 2u);
  EXPECT_EQ(rb.losses[0], full.losses[4]);
  EXPECT_EQ(rb.losses[1], full.losses[5]);

  // A given shape flag that contradicts the checkpoint names the flag and both values.
  train::TrainOptions c = tiny_run(seed);
  c.resume_dir = dir / "ck";
  c.hidden_dim = 64, c.num_heads = 4;
  std::string e = error_of([&] { train::run_training(c, out); });
  expect_has(e, "--hidden_dim gives hidden_dim 64, the checkpoint (" + (dir / "ck" / "global_step5" / "config.json").string() + ") has 32");
  // Another precision layout than the checkpoint's.
  c = tiny_run(seed);
  c.resume_dir = dir / "ck";
  c.deepspeed_config = "configs/bf16_full.json";
  e = error_of([&] { train::run_training(c, out); });
  expect_has(e, "gives the precision layout bf16_full, the checkpoint");
  expect_has(e, "has baseline");

  // Flag errors before any work.
  train::TrainOptions f = tiny_run(seed);
  f.save_dir = dir / "ck2";
  f.save_interval = 0;
  expect_has(error_of([&] { train::run_training(f, out); }), "--save_interval: expected N >= 1 (save after every N steps), found 0");
  f.save_interval.reset();
  f.keep_last = -1;
  expect_has(error_of([&] { train::run_training(f, out); }), "--keep_last: expected K >= 1");
  f.keep_last.reset();
  f.save_interval = 2;
  f.save_dir.clear();
  expect_has(error_of([&] { train::run_training(f, out); }), "--save_interval: expected --save DIR with it, found none");
  f = tiny_run(seed);
  write_file_atomic(dir / "a_file", std::string_view("x"));
  f.save_dir = dir / "a_file";
  expect_has(error_of([&] { train::run_training(f, out); }), "--save: expected a folder");
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(dir / "ro");
    fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    f.save_dir = dir / "ro";
    expect_has(error_of([&] { train::run_training(f, out); }), "--save: expected a writable folder");
    fs::permissions(dir / "ro", fs::perms::owner_all);
  }
  EXPECT_FALSE(fs::exists(dir / "ck2"));
  fs::remove_all(dir);
}
