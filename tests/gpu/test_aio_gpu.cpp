// GPU tests of runtime/aio: device buffers through the pinned bounce buffers (several chunks,
// unaligned tails), async device I/O, pinned tensors from the handle.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "runtime/aio/aio_handle.h"
#include "runtime/aio/gds_handle.h"
#include "tests/support/test_support.h"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {
std::string temp_file(const char* name) {
  return (fs::temp_directory_path() / (std::string("cutrain-aio-gpu-") + std::to_string(::getpid()) + name)).string();
}
}  // namespace

TEST(AioGpu, DeviceBufferRoundTripThroughBounceBuffers) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  for (std::size_t n : {std::size_t(4096), std::size_t(5u << 20) + 1234, std::size_t(3u << 20)}) {
    for (int par : {1, 4}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " par=" << par);
      aio::HandleOptions o;
      o.bounce_bytes = 1u << 20;  // forces several chunks through both bounce buffers
      o.intra_op_parallelism = par;
      aio::AioHandle h(o);
      std::vector<unsigned char> host(n);
      for (auto& c : host) c = static_cast<unsigned char>(rng());
      test::DeviceArray<unsigned char> src(host), dst(n);
      const std::string f = temp_file("rt.bin");
      fs::remove(f);
      h.sync_pwrite(src.get(), n, f);
      ASSERT_EQ(fs::file_size(f), n);
      std::vector<unsigned char> on_disk(n);
      aio::buffered_read(on_disk.data(), n, f);
      ASSERT_EQ(on_disk, host);
      h.pread(dst.get(), n, f, /*validate=*/true, /*async=*/false);
      ASSERT_EQ(dst.download(), host);
      // A chunk of at most inline_bytes (the whole 4096, the 1234-byte last chunk) ran on the
      // calling thread, the 1 MiB chunks on the workers.
      const aio::RequestCounts c = h.request_counts();
      EXPECT_EQ(c.inline_requests, n % (1u << 20) != 0 ? 2u : 0u);
      EXPECT_EQ(c.queued_requests, 2 * (n >> 20));
      fs::remove(f);
    }
  }
}

TEST(AioGpu, AsyncDeviceReadsCompleteAtWait) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  aio::HandleOptions o;
  o.bounce_bytes = 2u << 20;
  aio::AioHandle h(o);
  const std::size_t n = 7u << 20;
  std::vector<unsigned char> host(n);
  for (auto& c : host) c = static_cast<unsigned char>(rng());
  const std::string f = temp_file("async.bin");
  aio::buffered_write(host.data(), n, f);
  test::DeviceArray<unsigned char> a(n), b(n);
  h.async_pread(a.get(), n, f);
  h.async_pread(b.get(), n, f);
  EXPECT_EQ(h.wait(), 2);
  EXPECT_EQ(a.download(), host);
  EXPECT_EQ(b.download(), host);
  fs::remove(f);
}

TEST(AioGpu, PinnedTensorsFromTheHandleAreAlignedAndReusable) {
  CUTRAIN_REQUIRE_GPU();
  aio::AioHandle h;
  void* p = h.new_cpu_locked_tensor(10000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % aio::AioHandle::get_alignment(), 0u);
  cudaPointerAttributes attr{};
  CUTRAIN_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  std::memset(p, 0x42, 10000);
  const std::string f = temp_file("pinned.bin");
  h.sync_pwrite(p, 10000, f);
  std::vector<char> back(10000);
  aio::buffered_read(back.data(), 10000, f);
  EXPECT_EQ(back[9999], 0x42);
  h.free_cpu_locked_tensor(p);
  fs::remove(f);
}

TEST(AioGpu, GdsRoundTripOrClearlyUnavailable) {
  CUTRAIN_REQUIRE_GPU();
  std::string why;
  if (!aio::gds_available(&why)) {
    try {
      aio::GdsHandle h;
      FAIL() << "GdsHandle constructed although gds_available() said no";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("GDS not available"), std::string::npos);
    }
    GTEST_SKIP() << "GDS not available on this machine: " << why;
  }
  auto rng = test::fresh_rng();
  aio::GdsHandle h(1u << 20, 2);
  const std::size_t n = (3u << 20) + 8192;
  // The driver may open and still refuse a file system (no nvidia-fs, no compat mode): that must
  // be the clear "GDS not available for <file>" error, and the test then has nothing to run.
  {
    const std::string probe = temp_file("gds-probe.bin");
    std::vector<char> z(4096, 1);
    aio::buffered_write(z.data(), z.size(), probe);
    test::DeviceArray<char> d(4096);
    try {
      h.sync_pread(d.get(), 4096, probe);
    } catch (const Error& e) {
      fs::remove(probe);
      ASSERT_NE(e.message().find("GDS not available"), std::string::npos) << e.message();
      GTEST_SKIP() << "GDS not usable on this file system: " << e.message();
    }
    fs::remove(probe);
  }
  std::vector<unsigned char> host(n);
  for (auto& c : host) c = static_cast<unsigned char>(rng());
  void* src = h.new_pinned_device_tensor(n);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(src, host.data(), n, cudaMemcpyHostToDevice));
  const std::string f = temp_file("gds.bin");
  h.sync_pwrite(src, n, f);
  test::DeviceArray<unsigned char> dst(n);
  h.sync_pread(dst.get(), n, f);
  EXPECT_EQ(dst.download(), host);
  std::vector<unsigned char> disk(n);
  aio::buffered_read(disk.data(), n, f);
  EXPECT_EQ(disk, host);
  h.free_pinned_device_tensor(src);
  fs::remove(f);
}
