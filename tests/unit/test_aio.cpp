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

// Small synchronous host requests run on the calling thread (HandleOptions::inline_bytes); the
// same bytes land in the file and come back as through the workers, for every backend, O_DIRECT
// or buffered, aligned or not (unaligned buffer or offset: all buffered; aligned with a tail: an
// O_DIRECT body and a buffered tail), and the counts say which path each request took.
TEST(Aio, SmallSyncRequestsRunInlineWithTheWorkersResults) {
  auto rng = test::fresh_rng();
  TempDir dir;
  const std::vector<std::size_t> sizes = {1, 100, 4095, 4096, 4096 + 17, 3 * 4096, 65536};
  const std::vector<std::int64_t> offsets = {0, 4096, 100};
  for (Backend b : available_backends()) {
    for (bool direct : {true, false}) {
      for (int par : {1, 3}) {
        HandleOptions o;
        o.backend = b;
        o.o_direct = direct;
        o.intra_op_parallelism = par;
        HandleOptions q = o;
        q.inline_bytes = 0;  // the same requests through the workers
        AioHandle h(o), w(q);
        for (std::size_t n : sizes) {
          for (std::int64_t off : offsets) {
            for (std::size_t shift : {std::size_t{0}, std::size_t{1}}) {  // buffer aligned, or not
              SCOPED_TRACE(testing::Message() << backend_name(b) << " direct=" << direct << " par=" << par << " n=" << n
                                              << " off=" << off << " shift=" << shift);
              AlignedBuf src(n + shift), dst(n + shift), ref(n + shift), disk(n);
              fill_random(src.p + shift, n, rng);
              std::memset(dst.p, 0x5A, n + shift);
              std::memset(ref.p, 0xA5, n + shift);
              const std::string fi = dir.file("inline.bin"), fw = dir.file("worker.bin");
              fs::remove(fi);
              fs::remove(fw);
              const RequestCounts c0 = h.request_counts(), w0 = w.request_counts();
              EXPECT_EQ(h.sync_pwrite(src.p + shift, n, fi, off), static_cast<std::int64_t>(n));
              EXPECT_EQ(w.sync_pwrite(src.p + shift, n, fw, off), static_cast<std::int64_t>(n));
              EXPECT_EQ(fs::file_size(fi), static_cast<std::uintmax_t>(off) + n);
              buffered_read(disk.p, n, fi, off);
              ASSERT_EQ(std::memcmp(disk.p, src.p + shift, n), 0);
              EXPECT_EQ(h.sync_pread(dst.p + shift, n, fi, off), static_cast<std::int64_t>(n));
              EXPECT_EQ(w.sync_pread(ref.p + shift, n, fw, off), static_cast<std::int64_t>(n));
              ASSERT_EQ(std::memcmp(dst.p + shift, src.p + shift, n), 0);
              ASSERT_EQ(std::memcmp(ref.p + shift, src.p + shift, n), 0);
              // Nothing outside the request was touched.
              if (shift) {
                EXPECT_EQ(dst.p[0], 0x5A);
              }
              EXPECT_EQ(h.request_counts().inline_requests, c0.inline_requests + 2);
              EXPECT_EQ(h.request_counts().queued_requests, c0.queued_requests);
              EXPECT_EQ(w.request_counts().inline_requests, w0.inline_requests);
              EXPECT_EQ(w.request_counts().queued_requests, w0.queued_requests + 2);
            }
          }
        }
      }
    }
  }
}

TEST(Aio, InlineThresholdIsInlineBytesAndAtMostOneBlock) {
  TempDir dir;
  HandleOptions o;
  o.inline_bytes = 8192;
  o.block_size = 1 << 20;
  AioHandle h(o);
  AlignedBuf buf(3 * 4096);
  std::memset(buf.p, 1, 3 * 4096);
  const std::string f = dir.file("t.bin");
  h.sync_pwrite(buf.p, 8192, f);
  EXPECT_EQ(h.request_counts().inline_requests, 1u);
  h.sync_pwrite(buf.p, 8193, f);
  EXPECT_EQ(h.request_counts().queued_requests, 1u);
  h.sync_pread(buf.p, 8192, f);
  EXPECT_EQ(h.request_counts().inline_requests, 2u);
  // inline_bytes above the block size: one block at most.
  o.inline_bytes = 1 << 20;
  o.block_size = 4096;
  AioHandle small_blocks(o);
  small_blocks.sync_pwrite(buf.p, 4096, f);
  small_blocks.sync_pwrite(buf.p, 8192, f);
  EXPECT_EQ(small_blocks.request_counts().inline_requests, 1u);
  EXPECT_EQ(small_blocks.request_counts().queued_requests, 1u);
  // fdatasync after every write holds inline too.
  o = HandleOptions{};
  o.fsync = true;
  AioHandle synced(o);
  std::memset(buf.p, 3, 4096);
  synced.sync_pwrite(buf.p, 4096, f, 4096);
  AlignedBuf back(4096);
  buffered_read(back.p, 4096, f, 4096);
  EXPECT_EQ(std::memcmp(back.p, buf.p, 4096), 0);
  EXPECT_EQ(synced.request_counts().inline_requests, 1u);
}

// The inline path fails as the workers' does: the same messages, before any I/O, and the handle
// stays usable.
TEST(Aio, InlineErrorsMatchTheWorkerPath) {
  TempDir dir;
  HandleOptions q;
  q.inline_bytes = 0;
  AioHandle h, w(q);
  std::vector<char> data(10000, 'x');
  buffered_write(data.data(), data.size(), dir.file("short.bin"));
  AlignedBuf dst(16384);
  auto message = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.message();
    }
    return "no throw";
  };
  struct Case {
    const char* name;
    std::size_t bytes;
    std::string path;
    std::int64_t off;
    bool read;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"past the end", 8192, dir.file("short.bin"), 4096, true, "the file holds 10000 bytes"},
      {"past the end, unaligned", 100, dir.file("short.bin"), 9999, true, "the file holds 10000 bytes"},
      {"missing file", 4096, dir.file("missing.bin"), 0, true, "No such file"},
      {"missing folder (write)", 4096, dir.file("no/such/dir.bin"), 0, false, "No such file"},
      {"negative offset", 4096, dir.file("short.bin"), -4096, true, "file offset must be >= 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto run = [&](AioHandle& x) {
      return message([&] {
        if (c.read)
          x.sync_pread(dst.p, c.bytes, c.path, c.off);
        else
          x.sync_pwrite(dst.p, c.bytes, c.path, c.off);
      });
    };
    const std::string mi = run(h), mw = run(w);
    EXPECT_EQ(mi, mw);
    EXPECT_NE(mi.find(c.expect), std::string::npos) << mi;
    EXPECT_NE(mi.find(c.path), std::string::npos) << mi;
  }
  EXPECT_EQ(h.request_counts().queued_requests, 0u);  // every failing request was an inline one
  // Still usable after the errors.
  EXPECT_EQ(h.sync_pread(dst.p, 4096, dir.file("short.bin"), 4096), 4096);
  EXPECT_EQ(dst.p[0], 'x');
}

// Async requests always go to the workers, and a small sync request issued while some are queued
// goes behind them (it must not overtake a queued write of the same file); after wait() small
// sync requests run inline again.
TEST(Aio, AsyncRequestsGoToTheWorkersAndSyncDoesNotOvertakeThem) {
  auto rng = test::fresh_rng();
  TempDir dir;
  AioHandle h;
  const std::string f = dir.file("o.bin");
  AlignedBuf a(4096), b(4096), back(4096);
  fill_random(a.p, 4096, rng);
  fill_random(b.p, 4096, rng);
  buffered_write(b.p, 4096, f);  // the old bytes: the read's size check passes at submission
  h.async_pwrite(a.p, 4096, f);
  EXPECT_EQ(h.request_counts().queued_requests, 1u);
  EXPECT_EQ(h.request_counts().inline_requests, 0u);
  h.sync_pread(back.p, 4096, f);  // queued behind the write on the same worker: sees its bytes
  EXPECT_EQ(std::memcmp(back.p, a.p, 4096), 0);
  EXPECT_EQ(h.request_counts().queued_requests, 2u);
  EXPECT_EQ(h.request_counts().inline_requests, 0u);
  EXPECT_EQ(h.wait(), 1);
  h.async_pread(back.p, 100, f, 7);
  EXPECT_EQ(h.request_counts().queued_requests, 3u);
  EXPECT_EQ(h.wait(), 1);
  EXPECT_EQ(std::memcmp(back.p, a.p + 7, 100), 0);
  h.sync_pwrite(b.p, 4096, f);
  h.sync_pread(back.p, 4096, f);
  EXPECT_EQ(std::memcmp(back.p, b.p, 4096), 0);
  EXPECT_EQ(h.request_counts().inline_requests, 2u);
  EXPECT_EQ(h.request_counts().queued_requests, 3u);
  // pread/pwrite's async form queues as well; the sync form takes the inline path.
  h.pwrite(a.p, 4096, f, /*validate=*/false, /*async=*/true);
  EXPECT_EQ(h.request_counts().queued_requests, 4u);
  EXPECT_EQ(h.wait(), 1);
  h.pread(back.p, 4096, f, /*validate=*/true, /*async=*/false);
  EXPECT_EQ(std::memcmp(back.p, a.p, 4096), 0);
  EXPECT_EQ(h.request_counts().inline_requests, 3u);
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
