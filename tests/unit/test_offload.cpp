// CPU tests of the StateOffloader's bookkeeping and errors (everything decided before a copy):
// registration, unknown names, no-op offload/reload, NVMe argument checks, host exhaustion that
// leaves the device state intact. The copies themselves are in tests/gpu/test_offload_gpu.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/host_source.h"
#include "runtime/offload.h"
#include "runtime/staged_copy.h"
#include "tests/support/cpu_test_util.h"

using namespace cutrain;

namespace {

struct Fixture {
  CachingAllocator alloc{make_host_source()};
  Buffer a{alloc, 1000}, b{alloc, 5000}, empty;
  StateOffloader off{alloc, nullptr};
  Fixture() {
    off.add("optim_states", &a);
    off.add("hp_params", &b);
    off.add("lp_grads", &empty);
  }
};

using test::message_of;

TEST(Offload, RegistrationAndQueries) {
  Fixture f;
  EXPECT_EQ(f.off.names(), (std::vector<std::string>{"optim_states", "hp_params", "lp_grads"}));
  EXPECT_TRUE(f.off.has("hp_params"));
  EXPECT_FALSE(f.off.has("lp_params"));
  EXPECT_EQ(f.off.bytes("optim_states"), 1000u);
  EXPECT_EQ(f.off.bytes("hp_params"), 5000u);
  EXPECT_EQ(f.off.bytes("lp_grads"), 0u);
  EXPECT_FALSE(f.off.is_offloaded("hp_params"));
  EXPECT_EQ(f.off.offloaded_bytes(), 0u);
  EXPECT_EQ(f.off.host_buffer_bytes(), 0u);
  EXPECT_EQ(f.off.generation(), 0u);
}

TEST(Offload, RegistrationErrors) {
  Fixture f;
  Buffer c{f.alloc, 10};
  EXPECT_NE(message_of([&] { f.off.add("hp_params", &c); }).find("registered already"), std::string::npos);
  EXPECT_NE(message_of([&] { f.off.add("x", static_cast<Buffer*>(nullptr)); }).find("null"), std::string::npos);
  EXPECT_NE(message_of([&] { f.off.add("", &c); }).find("empty state name"), std::string::npos);
  ExternalState e;
  e.bytes = 10;
  e.data = [] { return nullptr; };
  EXPECT_NE(message_of([&] { f.off.add("ext", e); }).find("three callbacks"), std::string::npos);
  EXPECT_FALSE(f.off.has("ext"));
}

TEST(Offload, UnknownNameListsValidOnesAndMovesNothing) {
  Fixture f;
  void* before = f.a.get();
  // The valid name comes first: it must not be offloaded when a later one is bad.
  std::string m = message_of([&] { f.off.offload({"optim_states", "lp_param"}); });
  EXPECT_NE(m.find("unknown state 'lp_param'"), std::string::npos) << m;
  for (const char* n : {"optim_states", "hp_params", "lp_grads"}) EXPECT_NE(m.find(n), std::string::npos) << m;
  EXPECT_FALSE(f.off.is_offloaded("optim_states"));
  EXPECT_EQ(f.a.get(), before);
  EXPECT_NE(message_of([&] { f.off.reload({"nope"}, false); }).find("unknown state 'nope'"), std::string::npos);
  EXPECT_NE(message_of([&] { f.off.wait_resident("nope", nullptr); }).find("valid states: optim_states"),
            std::string::npos);
  EXPECT_NE(message_of([&] { (void)f.off.bytes("nope"); }).find("unknown state"), std::string::npos);
}

TEST(Offload, ReloadOfResidentAndWaitOnResidentAreNoOps) {
  Fixture f;
  void* a = f.a.get();
  f.off.reload(false);
  f.off.reload({"hp_params"}, true);
  f.off.wait_resident("optim_states", nullptr);
  EXPECT_EQ(f.a.get(), a);
  EXPECT_EQ(f.off.generation(), 0u);
  // Offloading only empty states moves nothing.
  f.off.offload({"lp_grads"});
  EXPECT_FALSE(f.off.is_offloaded("lp_grads"));
  f.off.free_offload_buffers();  // nothing held: fine
  EXPECT_EQ(f.off.host_buffer_bytes(), 0u);
}

TEST(Offload, DeviceNames) {
  EXPECT_EQ(parse_offload_device("cpu"), OffloadDevice::Cpu);
  EXPECT_EQ(parse_offload_device("nvme"), OffloadDevice::Nvme);
  EXPECT_NE(message_of([] { parse_offload_device("gpu"); }).find("\"gpu\""), std::string::npos);
  EXPECT_STREQ(offload_device_name(OffloadDevice::Nvme), "nvme");
}

TEST(Offload, NvmeNeedsAnExistingFolder) {
  Fixture f;
  OffloadOptions o;
  o.device = OffloadDevice::Nvme;
  EXPECT_NE(message_of([&] { f.off.offload({}, o); }).find("no folder given"), std::string::npos);
  o.nvme_path = "/nonexistent/cutrain-offload-test";
  std::string m = message_of([&] { f.off.offload({}, o); });
  EXPECT_NE(m.find("'/nonexistent/cutrain-offload-test' is not an existing folder"), std::string::npos) << m;
  EXPECT_FALSE(f.off.is_offloaded("hp_params"));
}

TEST(Offload, HostExhaustionLeavesTheDeviceStateIntact) {
  Fixture f;
  bool released = false;
  ExternalState huge;
  huge.bytes = std::size_t{1} << 52;  // 4 PiB: beyond any address space
  huge.data = [] { return reinterpret_cast<void*>(0x1000); };
  huge.release = [&] { released = true; };
  huge.reallocate = [] { return reinterpret_cast<void*>(0x1000); };
  f.off.add("contiguous_grad_buffer", std::move(huge));
  OffloadOptions o;
  o.pin_memory = false;
  // hp_params is listed first and gets its host buffer; the failure must give it back.
  std::string m = message_of([&] { f.off.offload({"hp_params", "contiguous_grad_buffer"}, o); });
  EXPECT_NE(m.find("host memory exhausted"), std::string::npos) << m;
  EXPECT_NE(m.find("'contiguous_grad_buffer'"), std::string::npos) << m;
  EXPECT_NE(m.find("device state is intact"), std::string::npos) << m;
  EXPECT_FALSE(released);
  EXPECT_FALSE(f.off.is_offloaded("contiguous_grad_buffer"));
  EXPECT_FALSE(f.off.is_offloaded("hp_params"));
  EXPECT_EQ(f.off.host_buffer_bytes(), 0u);
  EXPECT_TRUE(f.b);
}

TEST(StagedCopy, ParallelMemcpyCopiesEveryByte) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, (std::size_t{4} << 20) + 1,
                            (std::size_t{21} << 20) + 4097, std::size_t{33} << 20}) {
    for (int threads : {1, 3, 8}) {
      std::vector<unsigned char> src(bytes + 2), dst(bytes + 2, 0xEE);
      for (auto& c : src) c = static_cast<unsigned char>(rng());
      parallel_memcpy(dst.data() + 1, src.data() + 1, bytes, threads);  // odd addresses
      EXPECT_EQ(std::memcmp(dst.data() + 1, src.data() + 1, bytes), 0) << bytes << " bytes, " << threads << " threads";
      EXPECT_EQ(dst[0], 0xEE);
      EXPECT_EQ(dst[bytes + 1], 0xEE) << "wrote past the end";
    }
  }
}

}  // namespace
