#include "train/checkpoint_store.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "runtime/error.h"
#include "runtime/file_util.h"

namespace cutrain::train {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTagPrefix = "global_step";
constexpr std::string_view kTempInfix = ".tmp-";

// A non-empty run of decimal digits, the whole of `s`.
std::optional<long> digits(std::string_view s) {
  if (s.empty() || s.size() > 18 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  long v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

// `.latest.tmp.<pid>.<n>`: AtomicFileWriter's temp file for `latest`.
bool is_latest_temp(std::string_view name) {
  constexpr std::string_view p = ".latest.tmp.";
  if (name.substr(0, p.size()) != p) return false;
  name.remove_prefix(p.size());
  const auto dot = name.find('.');
  return dot != std::string_view::npos && digits(name.substr(0, dot)) && digits(name.substr(dot + 1));
}

bool process_alive(long pid) {
  if (pid == long(::getpid())) return false;  // one save at a time per process: ours are leftovers
  return ::kill(pid_t(pid), 0) == 0 || errno == EPERM;
}

std::string errno_text(int err) { return detail::concat(std::strerror(err), " (errno ", err, ")"); }

}  // namespace

std::string step_tag(int step) { return detail::concat(kTagPrefix, step); }

std::optional<int> tag_step(std::string_view name) {
  if (name.substr(0, kTagPrefix.size()) != kTagPrefix) return std::nullopt;
  const auto n = digits(name.substr(kTagPrefix.size()));
  if (!n || *n > 0x7fffffff) return std::nullopt;
  return int(*n);
}

std::optional<long> temp_folder_pid(std::string_view name) {
  const auto at = name.rfind(kTempInfix);
  if (at == std::string_view::npos || !tag_step(name.substr(0, at))) return std::nullopt;
  return digits(name.substr(at + kTempInfix.size()));
}

std::vector<int> list_step_folders(const fs::path& root) {
  std::vector<int> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory(ec)) continue;
    if (const auto s = tag_step(e.path().filename().string())) steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::optional<std::string> read_latest(const fs::path& root) {
  const fs::path p = root / kLatestFile;
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::nullopt;
  std::string tag = read_text_file(p);
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) tag.pop_back();
  CUTRAIN_CHECK(!tag.empty() && tag.find_first_of("/\n\r") == std::string::npos && tag != "." && tag != "..",
                "checkpoint: ", p.string(), ": expected one folder name (a tag such as global_step100), found '", tag,
                "'");
  return tag;
}

std::vector<std::string> remove_stale_temps(const fs::path& root) {
  std::vector<std::string> removed;
  std::error_code ec;
  std::vector<fs::path> victims;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (const auto pid = temp_folder_pid(name); pid && e.is_directory(ec) && !process_alive(*pid)) {
      victims.push_back(e.path());
    } else if (is_latest_temp(name) && e.is_regular_file(ec)) {
      victims.push_back(e.path());
    }
  }
  for (const fs::path& v : victims) {
    std::error_code rec;
    fs::remove_all(v, rec);
    CUTRAIN_CHECK(!rec, "checkpoint: cannot remove the stale temporary ", v.string(), ": ", rec.message());
    removed.push_back(v.filename().string());
  }
  if (!removed.empty()) fsync_folder(root);
  return removed;
}

std::vector<int> steps_to_prune(std::vector<int> steps, std::optional<int> latest_step, int keep_last) {
  if (keep_last <= 0) return {};
  std::sort(steps.begin(), steps.end(), std::greater<>());
  std::vector<int> out;
  for (std::size_t i = std::size_t(keep_last); i < steps.size(); ++i)
    if (!latest_step || steps[i] != *latest_step) out.push_back(steps[i]);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> prune_step_folders(const fs::path& root, int keep_last) {
  std::optional<int> latest_step;
  if (const auto tag = read_latest(root)) latest_step = tag_step(*tag);
  std::vector<std::string> deleted;
  for (int s : steps_to_prune(list_step_folders(root), latest_step, keep_last)) {
    const fs::path from = root / step_tag(s);
    const fs::path doomed = root / detail::concat(step_tag(s), kTempInfix, ::getpid());
    if (::rename(from.c_str(), doomed.c_str()) != 0)
      CUTRAIN_FAIL("checkpoint: --keep_last: cannot rename ", from.string(), " to ", doomed.string(), ": ",
                   errno_text(errno));
    fsync_folder(root);
    checkpoint_fault_point("prune", s);
    std::error_code ec;
    fs::remove_all(doomed, ec);
    CUTRAIN_CHECK(!ec, "checkpoint: --keep_last: cannot remove ", doomed.string(), ": ", ec.message());
    deleted.push_back(step_tag(s));
  }
  if (!deleted.empty()) fsync_folder(root);
  return deleted;
}

void check_checkpoint_root(const fs::path& root, std::string_view what) {
  std::error_code ec;
  fs::create_directories(root, ec);
  CUTRAIN_CHECK(!ec, what, ": expected a folder checkpoints can be written to, found '", root.string(),
                "' cannot be created: ", ec.message());
  CUTRAIN_CHECK(fs::is_directory(root, ec), what, ": expected a folder, found '", root.string(),
                "' is not a directory");
  const fs::path probe = root / detail::concat(".cutrain_write_probe.", ::getpid());
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0)
    CUTRAIN_FAIL(what, ": expected a writable folder, found '", root.string(), "' refuses a new file: ",
                 errno_text(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

StepFolderWriter::StepFolderWriter(fs::path root, int step)
    : root_(std::move(root)), tag_(step_tag(step)), step_(step) {
  tmp_ = root_ / detail::concat(tag_, kTempInfix, ::getpid());
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // this process's own leftover of an earlier failed save
  fs::create_directories(tmp_, ec);
  CUTRAIN_CHECK(!ec, "checkpoint: cannot create ", tmp_.string(), ": ", ec.message());
}

StepFolderWriter::~StepFolderWriter() {
  if (published_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

fs::path StepFolderWriter::publish() {
  checkpoint_fault_point("manifest", step_);
  fsync_folder(tmp_);
  const fs::path final_dir = root_ / tag_;
  bool exchanged = false;
  if (::rename(tmp_.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    CUTRAIN_CHECK(err == ENOTEMPTY || err == EEXIST, "checkpoint: cannot rename ", tmp_.string(), " to ",
                  final_dir.string(), ": ", errno_text(err));
    // A folder of this step exists (a run resumed from an earlier step): swap the two in one step,
    // so `root/<tag>` is always a complete folder, then delete the old one under the temp name.
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
      CUTRAIN_FAIL("checkpoint: ", final_dir.string(), " exists and cannot be exchanged with ", tmp_.string(),
                   " (renameat2 RENAME_EXCHANGE): ", errno_text(errno), "; remove ", final_dir.string(),
                   " or save to another folder");
    exchanged = true;
  }
  published_ = true;
  fsync_folder(root_);
  checkpoint_fault_point("rename", step_);
  write_file_atomic(root_ / kLatestFile, std::string_view(tag_));  // temp + fsync + rename + fsync of root
  checkpoint_fault_point("latest", step_);
  if (exchanged) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);  // the replaced folder; a failure leaves a stale temp for the next save
  }
  return final_dir;
}

namespace {
// Whether `env` (<stage> or <stage>@<step>) names this point of a save.
bool fault_named(const char* env, const char* stage, int step) {
  if (!env || !*env) return false;
  std::string_view want(env);
  const auto at = want.find('@');
  if (want.substr(0, at) != stage) return false;
  return at == std::string_view::npos || digits(want.substr(at + 1)) == std::optional<long>(step);
}
}  // namespace

void checkpoint_fault_point(const char* stage, int step) {
  if (fault_named(std::getenv("CUTRAIN_TEST_CHECKPOINT_KILL"), stage, step)) ::raise(SIGKILL);
  if (fault_named(std::getenv("CUTRAIN_TEST_CHECKPOINT_FAIL"), stage, step))
    CUTRAIN_FAIL("checkpoint: the write of step ", step, " failed at '", stage,
                 "' (CUTRAIN_TEST_CHECKPOINT_FAIL, a test-only fault)");
}

}  // namespace cutrain::train
