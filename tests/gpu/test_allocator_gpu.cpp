// GPU tests of the caching allocator: real cudaMalloc segments that hold data, record_stream
// with a real second stream kept busy, empty_cache giving memory back to the device, the pinned
// source, the process-wide instances, and a device OOM that leaves no CUDA error behind.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

std::size_t device_free_bytes() {
  std::size_t f = 0, t = 0;
  CUTRAIN_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return f;
}

// Writes a byte pattern into device memory with cudaMemset and reads it back.
void expect_usable(void* p, std::size_t bytes, unsigned char value, cudaStream_t s) {
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, s));
  std::vector<unsigned char> h(bytes, 0);
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(h.data(), p, bytes, cudaMemcpyDeviceToHost, s));
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
  std::size_t bad = 0;
  for (unsigned char c : h) bad += c != value;
  EXPECT_EQ(bad, 0u) << "block at " << p << " of " << bytes << " bytes did not hold its data";
}

// Blocks a stream until the host releases it: work queued behind it cannot start.
struct StreamGate {
  std::atomic<bool> open{false};
  static void CUDART_CB wait(void* self) {
    auto* g = static_cast<StreamGate*>(self);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!g->open.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void close_on(cudaStream_t s) { CUTRAIN_CUDA_CHECK(cudaLaunchHostFunc(s, &StreamGate::wait, this)); }
};

}  // namespace

TEST(AllocatorGpu, DeviceSegmentsAreRealAndUsable) {
  CUTRAIN_REQUIRE_GPU();
  CachingAllocator a(make_device_source());
  Stream s;
  const std::size_t sizes[] = {1000, 3 * MiB + 7, 64 * MiB};
  std::vector<void*> ps;
  unsigned char v = 0x11;
  for (std::size_t n : sizes) {
    void* p = a.allocate(n, s);
    cudaPointerAttributes attr{};
    CUTRAIN_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
    expect_usable(p, n, v++, s);
    ps.push_back(p);
  }
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.reserved_bytes.current, static_cast<std::int64_t>((2 + 20 + 64) * MiB));
  EXPECT_EQ(st.num_raw_allocs, 3);
  EXPECT_TRUE(a.source().is_device());
  // Device-to-device between two blocks: the first bytes of the 64 MiB block land in the 3 MiB one.
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(ps[1], ps[2], 1 * MiB, cudaMemcpyDeviceToDevice, s));
  std::vector<unsigned char> h(MiB);
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(h.data(), ps[1], MiB, cudaMemcpyDeviceToHost, s));
  s.synchronize();
  for (unsigned char c : h) ASSERT_EQ(c, 0x13);
  for (void* p : ps) a.deallocate(p);
  void* again = a.allocate(64 * MiB, s);  // cached: no new cudaMalloc
  EXPECT_EQ(again, ps[2]);
  EXPECT_EQ(a.stats().num_raw_allocs, 3);
  a.deallocate(again);
}

TEST(AllocatorGpu, RecordStreamKeepsBlockUntilOtherStreamIsDone) {
  CUTRAIN_REQUIRE_GPU();
  CachingAllocator a(make_device_source());
  Stream s1, s2;
  const std::size_t n = 64 * MiB;
  void* src = a.allocate(n, s1);
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(src, 0x5A, n, s1));
  s1.synchronize();
  test::DeviceArray<unsigned char> dst(n);
  // s2 reads `src`, but only after the gate opens; a long copy chain keeps it busy after that.
  StreamGate gate;
  gate.close_on(s2);
  for (int i = 0; i < 20; ++i)
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src, n, cudaMemcpyDeviceToDevice, s2));
  a.record_stream(src, s2);
  a.deallocate(src);
  EXPECT_EQ(a.snapshot()["segments"][0]["blocks"][0]["state"], "pending_free");
  // The same request on s1 must not get `src` while s2 still has to read it; overwrite what it gets.
  void* other = a.allocate(n, s1);
  EXPECT_NE(other, src);
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(other, 0x00, n, s1));
  s1.synchronize();
  gate.open = true;
  s2.synchronize();
  std::vector<unsigned char> h = dst.download();
  std::size_t bad = 0;
  for (unsigned char c : h) bad += c != 0x5A;
  EXPECT_EQ(bad, 0u) << "the block was reused while another stream still read it";
  void* reused = a.allocate(n, s1);  // the event has completed now
  EXPECT_EQ(reused, src);
  a.deallocate(other);
  a.deallocate(reused);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(AllocatorGpu, EmptyCacheGivesMemoryBackToTheDevice) {
  CUTRAIN_REQUIRE_GPU();
  CachingAllocator a(make_device_source());
  const std::size_t n = 1024 * MiB, slack = 64 * MiB;
  std::size_t free0 = device_free_bytes();
  void* p = a.allocate(n);
  expect_usable(p, 4 * KiB, 0x22, nullptr);
  a.deallocate(p);  // cached: the device still counts it as used
  std::size_t free1 = device_free_bytes();
  EXPECT_GE(free0 + slack, free1 + n) << "free before " << free0 << ", after caching " << free1;
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<std::int64_t>(n));
  a.empty_cache();
  std::size_t free2 = device_free_bytes();
  EXPECT_GE(free2 + slack, free1 + n) << "empty_cache did not return the segment: " << free1 << " -> " << free2;
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
  EXPECT_EQ(a.stats().num_raw_frees, 1);
}

TEST(AllocatorGpu, DeviceOutOfMemoryIsExplainedAndLeavesNoError) {
  CUTRAIN_REQUIRE_GPU();
  CachingAllocator a(make_device_source());
  DeviceInfo d = device_info();
  void* small = a.allocate(KiB);
  try {
    a.allocate(2 * d.total_mem);
    FAIL() << "allocating twice the device memory succeeded";
  } catch (const OutOfMemoryError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("device memory:"), std::string::npos) << m;
    EXPECT_NE(m.find("total"), std::string::npos) << m;
    EXPECT_NE(m.find("largest free block"), std::string::npos) << m;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed cudaMalloc left a sticky error";
  EXPECT_EQ(a.stats().num_ooms, 1);
  expect_usable(small, KiB, 0x33, nullptr);  // still works after the OOM
  a.deallocate(small);
}

TEST(AllocatorGpu, PinnedSourceWorks) {
  CUTRAIN_REQUIRE_GPU();
  CachingAllocator a(make_pinned_source());
  Stream s;
  const std::size_t n = 8 * MiB + 100;
  auto* h = static_cast<unsigned char*>(a.allocate(n, s));
  cudaPointerAttributes attr{};
  CUTRAIN_CUDA_CHECK(cudaPointerGetAttributes(&attr, h));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<unsigned char>(i * 7 + 3);
  test::DeviceArray<unsigned char> d(n);
  auto* back = static_cast<unsigned char*>(a.allocate(n, s));
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(d.get(), h, n, cudaMemcpyHostToDevice, s));
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(back, d.get(), n, cudaMemcpyDeviceToHost, s));
  s.synchronize();
  EXPECT_EQ(std::memcmp(h, back, n), 0);
  // record_stream with real events on the pinned source too.
  Stream other;
  a.record_stream(h, other);
  a.deallocate(h);
  other.synchronize();
  void* reused = a.allocate(n, s);
  EXPECT_EQ(reused, h);
  a.deallocate(reused);
  a.deallocate(back);
  EXPECT_STREQ(a.source().name(), "pinned");
  EXPECT_FALSE(a.source().is_device());
  // The process-wide pinned instance: page-aligned blocks (O_DIRECT bounce buffers).
  Buffer b(pinned_allocator(), 4 * KiB);
  Buffer tiny(pinned_allocator(), 100);
  Buffer odd(pinned_allocator(), 5 * KiB + 3);
  std::memset(b.get(), 1, 4 * KiB);
  for (const Buffer* x : {&b, &tiny, &odd}) EXPECT_EQ(reinterpret_cast<std::uintptr_t>(x->get()) % 4096, 0u);
  EXPECT_EQ(&pinned_allocator(), &pinned_allocator());
}

TEST(AllocatorGpu, ProcessWideDeviceAllocator) {
  CUTRAIN_REQUIRE_GPU();
  CachingAllocator& a = device_allocator();
  EXPECT_EQ(&a, &device_allocator(current_device()));
  EXPECT_STREQ(a.source().name(), "device");
  std::int64_t before = a.stats().allocated_bytes.current;
  {
    Buffer b(a, 5 * MiB);
    expect_usable(b.get(), 5 * MiB, 0x44, nullptr);
    EXPECT_EQ(a.stats().allocated_bytes.current, before + static_cast<std::int64_t>(5 * MiB));
  }
  EXPECT_EQ(a.stats().allocated_bytes.current, before);
  // record_stream onto the per-device default streams (their device comes from the current one).
  Stream s;
  void* p = a.allocate(3 * MiB, s);
  a.record_stream(p, nullptr);
  a.record_stream(p, cudaStreamPerThread);
  a.deallocate(p);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  void* q = a.allocate(3 * MiB, s);
  EXPECT_EQ(q, p);
  a.deallocate(q);
  int count = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDeviceCount(&count));
  EXPECT_THROW(device_allocator(count), Error);
}
