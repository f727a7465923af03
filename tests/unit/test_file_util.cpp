// CPU tests of the file helpers: atomic writes (content, replacement, no temp left behind, failure
// cleanup), reads with errors that name the path, positioned reads.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/file_util.h"
#include "tests/support/test_support.h"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("cutrain_fileutil_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, ec);
    fs::remove_all(path, ec);
  }
  std::size_t entries() const { return static_cast<std::size_t>(std::distance(fs::directory_iterator(path), fs::directory_iterator())); }
};

std::vector<std::byte> random_bytes(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
  return v;
}


}  // namespace

TEST(FileUtil, AtomicWriteRoundTripsAndLeavesNoTemp) {
  TempDir d;
  auto rng = test::fresh_rng();
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{1} << 20}) {
    auto bytes = random_bytes(n, rng);
    fs::path p = d.path / "blob.bin";
    write_file_atomic(p, std::span<const std::byte>(bytes));
    EXPECT_EQ(read_file(p), bytes) << n;
    EXPECT_EQ(d.entries(), 1u) << "temp file left behind";
  }
}

TEST(FileUtil, AtomicWriteReplacesAndConcatenatesPieces) {
  TempDir d;
  fs::path p = d.path / "x.txt";
  write_file_atomic(p, std::string_view("old content that is longer"));
  auto rng = test::fresh_rng();
  auto a = random_bytes(1000, rng), b = random_bytes(37, rng);
  std::span<const std::byte> pieces[] = {a, b};
  write_file_atomic(p, std::span<const std::span<const std::byte>>(pieces));
  std::vector<std::byte> want(a);
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(read_file(p), want);
  EXPECT_EQ(d.entries(), 1u);
}

TEST(FileUtil, AbandonedWriterRemovesTempAndKeepsOldFile) {
  TempDir d;
  fs::path p = d.path / "keep.txt";
  write_file_atomic(p, std::string_view("previous"));
  fs::path temp;
  {
    AtomicFileWriter w(p);
    temp = w.temp_path();
    w.write(std::string_view("partial new content"));
    EXPECT_TRUE(fs::exists(temp));
    EXPECT_EQ(temp.parent_path(), p.parent_path()) << "temp must be in the same directory (rename is atomic only there)";
  }  // no commit: as if an exception unwound the save
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_EQ(read_text_file(p), "previous");
  EXPECT_EQ(d.entries(), 1u);
}

TEST(FileUtil, AtomicWriteFailuresNamePath) {
  TempDir d;
  fs::path missing_dir = d.path / "no_such_dir" / "f.bin";
  std::string msg = test::error_of([&] { write_file_atomic(missing_dir, std::string_view("x")); });
  EXPECT_NE(msg.find(missing_dir.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
  // Renaming onto a directory fails after the temp was written: the temp must be gone.
  fs::create_directories(d.path / "adir" / "inner");
  fs::path onto_dir = d.path / "adir";
  msg = test::error_of([&] { write_file_atomic(onto_dir, std::string_view("x")); });
  EXPECT_NE(msg.find(onto_dir.string()), std::string::npos) << msg;
  EXPECT_EQ(d.entries(), 1u) << "temp left after a failed rename";
  msg = test::error_of([&] { AtomicFileWriter w(d.path / "c.bin"); w.commit(); w.commit(); });
  EXPECT_NE(msg.find("twice"), std::string::npos) << msg;
}

TEST(FileUtil, ReadErrorsNamePathAndReason) {
  TempDir d;
  fs::path missing = d.path / "nope.bin";
  std::string msg = test::error_of([&] { read_file(missing); });
  EXPECT_NE(msg.find(missing.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;
  msg = test::error_of([&] { read_text_file(d.path); });
  EXPECT_NE(msg.find(d.path.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
  if (::geteuid() != 0) {  // root reads anything
    fs::path locked = d.path / "locked.txt";
    write_file_atomic(locked, std::string_view("secret"));
    ::chmod(locked.c_str(), 0);
    msg = test::error_of([&] { read_file(locked); });
    EXPECT_NE(msg.find(locked.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("Permission denied"), std::string::npos) << msg;
  }
}

TEST(FileUtil, PositionedReadsAndBounds) {
  TempDir d;
  auto rng = test::fresh_rng();
  auto bytes = random_bytes(10007, rng);
  fs::path p = d.path / "r.bin";
  write_file_atomic(p, std::span<const std::byte>(bytes));
  ReadOnlyFile f(p);
  EXPECT_EQ(f.size(), bytes.size());
  std::vector<std::byte> got(333);
  f.read_at(1234, got.data(), got.size());
  EXPECT_EQ(0, std::memcmp(got.data(), bytes.data() + 1234, got.size()));
  f.read_at(bytes.size(), got.data(), 0);  // empty read at the end is fine
  std::string msg = test::error_of([&] { f.read_at(bytes.size() - 10, got.data(), 11); });
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;
}
