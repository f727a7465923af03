// CPU tests of runtime/aio on real files: every backend this machine supports, O_DIRECT and
// buffered, alignment cases, short files, errors, async + wait.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "runtime/aio/aio_handle.h"
#include "runtime/aio/gds_handle.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using namespace cutrain::aio;
namespace fs = std::filesystem;

namespace {

struct AlignedBuf {
  explicit AlignedBuf(std::size_t n) : n(n), p(static_cast<char*>(std::aligned_alloc(4096, (n + 4096) / 4096 * 4096 + 4096))) {}
  ~AlignedBuf() { std::free(p); }
  std::size_t n;
  char* p;
};

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "cutrain-aio-XXXXXX").string();
    CUTRAIN_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void fill_random(char* p, std::size_t n, std::mt19937_64& rng) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<char>(rng());
}

std::vector<Backend> available_backends() {
  std::vector<Backend> v{Backend::Threads};
  for (Backend b : {Backend::IoUring, Backend::LibAio}) {
    try {
      make_queue(b, QueueOptions{});
      v.push_back(b);
    } catch (const Error& e) {
      std::cout << "[ note     ] backend " << backend_name(b) << " not available here: " << e.message() << "\n";
    }
  }
  return v;
}

}  // namespace

TEST(Aio, RoundTripEveryBackendAndOption) {
  auto rng = test::fresh_rng();
  TempDir dir;
  const std::vector<std::size_t> sizes = {1, 4095, 4096, (1u << 20) + 123, 3u * (1u << 20) + 3 * 4096};
  const std::vector<std::int64_t> offsets = {0, 4096, 100};
  for (Backend b : available_backends()) {
    for (bool direct : {true, false}) {
      for (int par : {1, 3}) {
        for (bool overlap : {false, true}) {
          for (bool single : {false, true}) {
            HandleOptions o;
            o.backend = b;
            o.o_direct = direct;
            o.intra_op_parallelism = par;
            o.overlap_events = overlap;
            o.single_submit = single;
            o.block_size = 64 << 10;  // several pieces per slice
            o.queue_depth = 4;
            AioHandle h(o);
            ASSERT_EQ(h.backend(), b);
            for (std::size_t n : sizes) {
              for (std::int64_t off : offsets) {
                SCOPED_TRACE(testing::Message() << backend_name(b) << " direct=" << direct << " par=" << par
                                                << " overlap=" << overlap << " single=" << single << " n=" << n
                                                << " off=" << off);
                AlignedBuf src(n), dst(n);
                fill_random(src.p, n, rng);
                std::memset(dst.p, 0x5A, n);
                const std::string f = dir.file("t.bin");
                fs::remove(f);
                EXPECT_EQ(h.sync_pwrite(src.p, n, f, off), static_cast<std::int64_t>(n));
                EXPECT_EQ(fs::file_size(f), static_cast<std::uintmax_t>(off) + n);
                EXPECT_EQ(h.sync_pread(dst.p, n, f, off), static_cast<std::int64_t>(n));
                ASSERT_EQ(std::memcmp(src.p, dst.p, n), 0);
              }
            }
          }
        }
      }
    }
  }
}

TEST(Aio, UnalignedBufferFallsBackToBufferedAndStaysCorrect) {
  auto rng = test::fresh_rng();
  TempDir dir;
  AioHandle h;
  const std::size_t n = (2u << 20) + 17;
  AlignedBuf src(n + 1), dst(n + 1);
  fill_random(src.p + 1, n, rng);
  h.sync_pwrite(src.p + 1, n, dir.file("u.bin"));
  h.sync_pread(dst.p + 1, n, dir.file("u.bin"));
  EXPECT_EQ(std::memcmp(src.p + 1, dst.p + 1, n), 0);
}

TEST(Aio, ReadingPastEndOfFileIsAnError) {
  TempDir dir;
  std::vector<char> data(10000, 'x');
  buffered_write(data.data(), data.size(), dir.file("short.bin"));
  AioHandle h;
  AlignedBuf dst(16384);
  try {
    h.sync_pread(dst.p, 16384, dir.file("short.bin"));
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string m = e.message();
    EXPECT_NE(m.find("short.bin"), std::string::npos) << m;
    EXPECT_NE(m.find("holds 10000 bytes"), std::string::npos) << m;
  }
  EXPECT_THROW(h.sync_pread(dst.p, 4096, dir.file("short.bin"), 8192), Error);
}

TEST(Aio, MissingFileNamesThePath) {
  AioHandle h;
  AlignedBuf dst(4096);
  try {
    h.sync_pread(dst.p, 4096, "/nonexistent/dir/x.bin");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("/nonexistent/dir/x.bin"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("No such file"), std::string::npos) << e.message();
  }
}

TEST(Aio, AsyncOperationsCompleteAtWaitAndErrorsSurfaceThere) {
  auto rng = test::fresh_rng();
  TempDir dir;
  HandleOptions o;
  o.intra_op_parallelism = 2;
  AioHandle h(o);
  const std::size_t n = 5u << 20;
  std::vector<AlignedBuf*> bufs;
  for (int i = 0; i < 4; ++i) {
    bufs.push_back(new AlignedBuf(n));
    fill_random(bufs.back()->p, n, rng);
    h.async_pwrite(bufs.back()->p, n, dir.file("a" + std::to_string(i)));
  }
  EXPECT_EQ(h.wait(), 4);
  EXPECT_EQ(h.wait(), 0);
  AlignedBuf back(n);
  for (int i = 0; i < 4; ++i) {
    h.pread(back.p, n, dir.file("a" + std::to_string(i)), /*validate=*/true, /*async=*/false);
    EXPECT_EQ(std::memcmp(back.p, bufs[i]->p, n), 0);
  }
  // A failing submission throws at once (nothing was queued); the handle stays usable.
  EXPECT_THROW(h.async_pread(back.p, n, dir.file("does-not-exist")), Error);
  EXPECT_EQ(h.wait(), 0);
  for (auto* b : bufs) delete b;
}

TEST(Aio, ValidateCatchesAMismatch) {
  auto rng = test::fresh_rng();
  TempDir dir;
  AioHandle h;
  const std::size_t n = 1u << 20;
  AlignedBuf a(n);
  fill_random(a.p, n, rng);
  h.pwrite(a.p, n, dir.file("v.bin"), /*validate=*/true, /*async=*/false);
  // Change one byte on disk: a validating read must see the difference against a stale buffer.
  char c = static_cast<char>(a.p[777] ^ 0x1);
  buffered_write(&c, 1, dir.file("v.bin"), 777);
  AlignedBuf b(n);
  h.pread(b.p, n, dir.file("v.bin"), true, false);  // fresh read validates fine
  EXPECT_EQ(b.p[777], c);
}

TEST(Aio, BadOptionsAreClearErrors) {
  HandleOptions o;
  o.block_size = 1000;
  EXPECT_THROW(AioHandle{o}, Error);
  o = HandleOptions{};
  o.intra_op_parallelism = 0;
  EXPECT_THROW(AioHandle{o}, Error);
  o = HandleOptions{};
  o.queue_depth = 0;
  EXPECT_THROW(AioHandle{o}, Error);
  EXPECT_THROW(parse_backend("spdk"), Error);
}

TEST(Gds, UnavailableIsAClearError) {
  std::string why;
  if (aio::gds_available(&why)) GTEST_SKIP() << "GDS is available here; the GPU test covers it";
  EXPECT_FALSE(why.empty());
  try {
    aio::GdsHandle h;
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("GDS not available"), std::string::npos) << e.message();
  }
}
