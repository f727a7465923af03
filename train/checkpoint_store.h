// @brief The folder protocol of checkpoints, apart from what the files hold. A checkpoint root
// DIR holds step folders `global_step<N>` (DeepSpeed's naming) and `latest` (the tag of the
// newest complete one, DeepSpeed's convention). A save fills `DIR/global_step<N>.tmp-<pid>`,
// fsyncs it, renames it to `DIR/global_step<N>` in one rename and then replaces `latest`
// atomically, so a kill at any instant leaves `latest` naming a complete folder (the previous or
// the new one). Leftovers of a killed save (`global_step<N>.tmp-<pid>` folders, `.latest.tmp.*`
// files) are removed by the next save; `keep_last` prunes old step folders, never the one
// `latest` names. docs/training.md describes the layout.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cutrain::train {

inline constexpr const char* kLatestFile = "latest";

std::string step_tag(int step);                      // "global_step<N>"
std::optional<int> tag_step(std::string_view name);  // N of "global_step<N>", else nullopt
// "global_step<N>.tmp-<pid>" (a save in progress or killed) -> pid, else nullopt.
std::optional<long> temp_folder_pid(std::string_view name);

// The step folders of `root` by their names (complete ones: the temp names are not listed),
// ascending by step.
std::vector<int> list_step_folders(const std::filesystem::path& root);
// The tag `root/latest` holds (trimmed), nullopt when there is no such file; an empty or
// multi-line file is an error naming it.
std::optional<std::string> read_latest(const std::filesystem::path& root);

// Removes what killed saves left in `root`: temp folders of dead processes and `latest`'s temp
// files. Returns one description per entry removed (for the log).
std::vector<std::string> remove_stale_temps(const std::filesystem::path& root);

// keep_last bookkeeping (pure): of `steps`, the ones to delete so that the `keep_last` highest
// remain, plus `latest_step` whatever its rank. keep_last <= 0 keeps all.
std::vector<int> steps_to_prune(std::vector<int> steps, std::optional<int> latest_step, int keep_last);
// Deletes those folders (each renamed to a temp name first, so a kill mid-delete leaves a stale
// temp, never a half-deleted step folder). Returns the tags deleted.
std::vector<std::string> prune_step_folders(const std::filesystem::path& root, int keep_last);

// --save_interval bookkeeping (pure): after `steps_done` steps, is an interval save due?
inline bool interval_save_due(int steps_done, int interval) { return interval > 0 && steps_done % interval == 0; }

// Checks `root` can hold checkpoints: creates it if missing, probes that a file can be created in
// it. `what` names the flag in errors ("--save").
void check_checkpoint_root(const std::filesystem::path& root, std::string_view what);

// One save's folder. The constructor creates `root/<tag>.tmp-<pid>` (the caller writes the files
// into dir()); publish() fsyncs it, renames it to `root/<tag>` (exchanged atomically with an
// existing folder of that name) and points `latest` at it. Destroyed unpublished, it removes the
// temp folder.
class StepFolderWriter {
 public:
  StepFolderWriter(std::filesystem::path root, int step);
  ~StepFolderWriter();
  StepFolderWriter(const StepFolderWriter&) = delete;
  StepFolderWriter& operator=(const StepFolderWriter&) = delete;

  const std::filesystem::path& dir() const { return tmp_; }
  const std::string& tag() const { return tag_; }
  std::filesystem::path publish();  // the final folder

 private:
  std::filesystem::path root_, tmp_;
  std::string tag_;
  int step_ = 0;
  bool published_ = false;
};

// Test-only fault injection (docs/training.md): with CUTRAIN_TEST_CHECKPOINT_KILL=<stage> or
// <stage>@<step>, the process sends itself SIGKILL at that point of a save (of that step); with
// CUTRAIN_TEST_CHECKPOINT_FAIL=<stage>[@<step>] the write throws cutrain::Error there (a failed
// write: the temp folder is removed, the previous checkpoint stays). Stages in save order: start
// (temp folder created, nothing written), files (payload files written, no manifest), manifest
// (manifest written, folder not renamed), rename (folder renamed, latest not updated), latest
// (latest updated, nothing pruned), prune (one old folder renamed away, not deleted).
void checkpoint_fault_point(const char* stage, int step);

}  // namespace cutrain::train
