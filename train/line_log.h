// @brief A log file of `cutrain train` written as the run goes (the loss CSV, the metrics JSONL):
// opened (truncated) before the first step, each line one write(2), so a killed run leaves every
// completed line in the file.
#pragma once

#include <filesystem>
#include <string>

namespace cutrain::train {

class LineLog {
 public:
  LineLog() = default;
  // Opens `path` for `flag` (its name in messages). Throws Error naming the flag and the path when
  // the folder does not exist or the file cannot be written.
  LineLog(const std::string& flag, const std::filesystem::path& path);
  ~LineLog();
  LineLog(LineLog&& other) noexcept;
  LineLog& operator=(LineLog&& other) noexcept;
  LineLog(const LineLog&) = delete;
  LineLog& operator=(const LineLog&) = delete;

  bool is_open() const { return fd_ >= 0; }
  // Writes `text` (whole lines, '\n'-terminated) in one write; it is in the file when this returns.
  void append(const std::string& text);

 private:
  std::string flag_;
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace cutrain::train
