// @brief Shared by the data tests: where the GPT-2 files and WikiText live (skip when absent),
// the golden ids, file helpers.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "data/gpt2_tokenizer.h"

namespace cutrain::test {

// $CUTRAIN_DATA_DIR, else ../shared/data next to the source tree.
inline std::string data_dir() {
  if (const char* env = std::getenv("CUTRAIN_DATA_DIR")) return env;
  return std::string(CUTRAIN_SOURCE_DIR) + "/../shared/data";
}
inline std::string vocab_path() { return data_dir() + "/gpt2/encoder.json"; }
inline std::string merges_path() { return data_dir() + "/gpt2/vocab.bpe"; }
inline std::string wikitext_path(const std::string& split) { return data_dir() + "/wikitext-2/" + split + ".txt"; }
inline bool have_gpt2_files() {
  return std::filesystem::exists(vocab_path()) && std::filesystem::exists(merges_path());
}

#define CUTRAIN_REQUIRE_GPT2_DATA()                                                                  \
  do {                                                                                               \
    if (!::cutrain::test::have_gpt2_files())                                                         \
      GTEST_SKIP() << "GPT-2 vocabulary not found under " << ::cutrain::test::data_dir()             \
                   << " (set CUTRAIN_DATA_DIR to the folder holding gpt2/ and wikitext-2/): skipped"; \
  } while (0)

// The tokenizer, loaded once per test binary.
inline const data::Gpt2Tokenizer& gpt2() {
  static const data::Gpt2Tokenizer tok = data::Gpt2Tokenizer::from_files(vocab_path(), merges_path());
  return tok;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A fresh empty folder under the system temp dir, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = std::filesystem::temp_directory_path() /
           ("cutrain_" + std::string(info ? info->name() : "data") + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

}  // namespace cutrain::test
