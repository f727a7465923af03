// GPU tests of the StateOffloader: bit-exact round trips of every state kind for every option
// (pinned/pageable x blocking/non-blocking, NVMe), allocated/reserved/cudaMemGetInfo memory
// really moving, pinned buffer reuse, stream ordering (stalls with host callbacks make a missing
// wait show up as wrong data; also runnable under compute-sanitizer), and the offload model's
// training continuing bit-exactly after a round trip.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/offload.h"
#include "runtime/staged_copy.h"
#include "tests/support/test_support.h"
#include "tools/offload_model/offload_model.h"

using namespace cutrain;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::vector<std::uint8_t> random_bytes(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::uint8_t> v(n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t r = rng();
    std::memcpy(v.data() + i, &r, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<std::uint8_t>(rng());
  return v;
}

std::vector<std::uint8_t> download(const void* p, std::size_t n) {
  std::vector<std::uint8_t> h(n);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  if (n) CUTRAIN_CUDA_CHECK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
  return h;
}

// cudaMemcpy runs on the legacy stream, which the tests' non-blocking streams do not wait for:
// synchronize the device so later work on any stream sees the bytes.
void upload(void* p, const std::vector<std::uint8_t>& h) {
  CUTRAIN_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice));
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
}

std::size_t free_device_memory() {
  std::size_t f = 0, t = 0;
  CUTRAIN_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return f;
}

// Blocks `stream` for `ms` milliseconds from the host: work queued after it waits.
void stall(cudaStream_t stream, int ms) {
  auto* arg = new int(ms);
  CUTRAIN_CUDA_CHECK(cudaLaunchHostFunc(
      stream,
      [](void* a) {
        int* p = static_cast<int*>(a);
        std::this_thread::sleep_for(std::chrono::milliseconds(*p));
        delete p;
      },
      arg));
}

// Registered states of odd sizes (a tiny one in the small pool, mid-size, and large ones whose
// segments are their own), filled with fresh random bytes.
struct States {
  CachingAllocator& alloc = device_allocator();
  Stream stream;
  std::vector<std::string> names{"optim_states", "hp_params", "lp_params", "lp_grads"};
  std::vector<std::size_t> sizes{1, 777 * 1024 + 13, 64 * MiB + 5, 200 * MiB + 3};
  std::vector<Buffer> bufs;
  std::vector<std::vector<std::uint8_t>> data;
  std::unique_ptr<StateOffloader> off;

  explicit States(std::mt19937_64& rng) {
    alloc.empty_cache();
    bufs.reserve(names.size());
    for (std::size_t i = 0; i < names.size(); ++i) {
      bufs.emplace_back(alloc, sizes[i], stream.get());
      data.push_back(random_bytes(sizes[i], rng));
      upload(bufs[i].get(), data[i]);
    }
    off = std::make_unique<StateOffloader>(alloc, stream.get());
    for (std::size_t i = 0; i < names.size(); ++i) off->add(names[i], &bufs[i]);
  }
  void expect_intact(const char* when) {
    for (std::size_t i = 0; i < names.size(); ++i) {
      ASSERT_TRUE(bufs[i]) << names[i] << " " << when;
      off->wait_resident(names[i], stream.get());
      CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      EXPECT_TRUE(download(bufs[i].get(), sizes[i]) == data[i]) << names[i] << " differs " << when;
    }
  }
  std::size_t total() const {
    std::size_t t = 0;
    for (auto s : sizes) t += s;
    return t;
  }
};

struct Mode {
  bool pin, non_blocking;
};
class OffloadModes : public ::testing::TestWithParam<Mode> {};

TEST_P(OffloadModes, RoundTripIsBitExactAndMemoryMoves) {
  CUTRAIN_REQUIRE_GPU();
  const Mode mode = GetParam();
  auto rng = test::fresh_rng();
  States st(rng);
  OffloadOptions o;
  o.pin_memory = mode.pin;
  o.non_blocking = mode.non_blocking;

  std::int64_t best_free_gain = 0;  // the driver's free memory: other processes may allocate meanwhile
  for (int round = 0; round < 2; ++round) {
    const AllocatorStats before = st.alloc.stats();
    const std::size_t free_before = free_device_memory();
    const auto pinned_allocs_before = pinned_allocator().stats().num_raw_allocs;
    st.off->offload({}, o);
    // Allocated bytes drop at once, also without blocking.
    const AllocatorStats mid = st.alloc.stats();
    EXPECT_LE(mid.allocated_bytes.current + std::int64_t(st.total()), before.allocated_bytes.current);
    for (const auto& n : st.names) EXPECT_TRUE(st.off->is_offloaded(n)) << n;
    EXPECT_EQ(st.off->offloaded_bytes(), st.total());
    st.off->synchronize();  // non-blocking: the segments go back once the copies are done
    const AllocatorStats after = st.alloc.stats();
    // The two large states own their segments: reserved memory and the driver's free memory move.
    const std::size_t large = st.sizes[2] + st.sizes[3];
    EXPECT_LE(after.reserved_bytes.current + std::int64_t(large), before.reserved_bytes.current);
    best_free_gain = std::max(best_free_gain, std::int64_t(free_device_memory()) - std::int64_t(free_before));
    EXPECT_GT(after.num_raw_frees, before.num_raw_frees) << "segments went back to the driver (cudaFree)";
    EXPECT_EQ(st.off->host_buffer_bytes(), st.total());
    EXPECT_EQ(st.off->pinned_buffer_bytes(), mode.pin ? st.total() : 0u);
    for (std::size_t i = 0; i < st.names.size(); ++i)
      EXPECT_EQ(std::memcmp(st.off->host_buffer(st.names[i]), st.data[i].data(), st.sizes[i]), 0) << st.names[i];
    if (round == 1 && mode.pin) {  // the second round reuses the pinned buffers
      EXPECT_EQ(pinned_allocator().stats().num_raw_allocs, pinned_allocs_before);
    }

    // Poison the memory the reload will probably get back, so stale data cannot pass.
    {
      Buffer junk(st.alloc, st.total(), st.stream.get());
      CUTRAIN_CUDA_CHECK(cudaMemsetAsync(junk.get(), 0xFF, junk.bytes(), st.stream.get()));
    }
    const auto gen = st.off->generation();
    st.off->reload(mode.non_blocking);
    EXPECT_EQ(st.off->generation(), gen + 1);
    EXPECT_GE(st.alloc.stats().allocated_bytes.current, mid.allocated_bytes.current + std::int64_t(st.total()));
    for (const auto& n : st.names) EXPECT_FALSE(st.off->is_offloaded(n)) << n;
    st.expect_intact(round == 0 ? "after the first round trip" : "after the second round trip");
  }
  // ctest runs GPU tests in parallel: the best of the two rounds must show the segments returned.
  EXPECT_GE(best_free_gain, std::int64_t(st.sizes[2] + st.sizes[3]) - std::int64_t(8 * MiB))
      << "cudaMemGetInfo's free memory did not grow by the large states";
  st.off->free_offload_buffers();
  EXPECT_EQ(st.off->host_buffer_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(All, OffloadModes,
                         ::testing::Values(Mode{true, false}, Mode{true, true}, Mode{false, false}, Mode{false, true}),
                         [](const auto& info) {
                           return std::string(info.param.pin ? "Pinned" : "Pageable") +
                                  (info.param.non_blocking ? "NonBlocking" : "Blocking");
                         });

TEST(OffloadGpu, SubsetRepeatsAndKindSwitch) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  States st(rng);
  void* lp = st.bufs[2].get();
  st.off->offload({"optim_states", "lp_grads"});
  EXPECT_TRUE(st.off->is_offloaded("optim_states"));
  EXPECT_TRUE(st.off->is_offloaded("lp_grads"));
  EXPECT_FALSE(st.off->is_offloaded("lp_params"));
  EXPECT_EQ(st.bufs[2].get(), lp);
  st.off->offload({"lp_grads"});  // already offloaded: no-op
  EXPECT_EQ(st.off->offloaded_bytes(), st.sizes[0] + st.sizes[3]);
  st.off->reload({"lp_params"}, false);  // resident: no-op
  EXPECT_EQ(st.bufs[2].get(), lp);
  // A state offloaded elsewhere cannot be waited for; one still offloaded cannot lose its buffer.
  EXPECT_THROW(st.off->wait_resident("lp_grads", st.stream.get()), Error);
  EXPECT_THROW(st.off->free_offload_buffers(), Error);
  st.off->reload(false);
  st.expect_intact("after a subset round trip");
  // Pinned, then pageable: the host buffers change kind.
  OffloadOptions pageable;
  pageable.pin_memory = false;
  st.off->offload({}, pageable);
  EXPECT_EQ(st.off->pinned_buffer_bytes(), 0u);
  st.off->reload(true);
  st.expect_intact("after a pageable round trip following a pinned one");
}

// The staged pageable copier: odd sizes around its chunk size, both directions, bit-exact, and
// ordered after work queued on its stream.
TEST(StagedCopyGpu, RoundTripsOddSizesInOrder) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::size_t chunk = 64 * 1024;
  Stream s;
  for (int threads : {1, 4}) {
    StagedCopier c(chunk, threads);
    for (std::size_t bytes : {std::size_t{1}, std::size_t{4095}, chunk, chunk + 1, 3 * chunk + 77, 10 * MiB + 3}) {
      auto data = random_bytes(bytes, rng);
      test::DeviceArray<std::uint8_t> dev(bytes), back(bytes);
      CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());  // their poisoning ran on the legacy stream
      // Queued before the copy: a stall, then the real contents; the copy must see them.
      stall(s.get(), 50);
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(dev.get(), data.data(), bytes, cudaMemcpyHostToDevice, s.get()));
      std::vector<std::uint8_t> host(bytes + 1, 0xEE);
      c.to_host(host.data(), dev.get(), bytes, s.get());
      EXPECT_EQ(std::memcmp(host.data(), data.data(), bytes), 0) << bytes << " bytes to host, " << threads << " threads";
      EXPECT_EQ(host[bytes], 0xEE);
      c.to_device(back.get(), host.data(), bytes, s.get());
      std::fill(host.begin(), host.end(), 0);  // the source may change once to_device returned
      s.synchronize();
      EXPECT_TRUE(back.download() == data) << bytes << " bytes to device, " << threads << " threads";
    }
  }
}

TEST(OffloadGpu, PageableDriverPathRoundTrip) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  States st(rng);
  OffloadOptions o;
  o.pin_memory = false;
  o.pageable_staging = false;
  st.off->offload({}, o);
  st.off->reload(false);
  st.expect_intact("after a pageable round trip on the driver's path");
}

// The offload copy must wait for owner-stream work queued before it.
TEST(OffloadGpu, NonBlockingOffloadWaitsForQueuedWrites) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  States st(rng);
  OffloadOptions o;
  o.non_blocking = true;
  st.off->offload({}, o);  // first round: pinned buffers allocated
  st.off->reload(false);
  // The owner stalls, then overwrites every state; the offload is queued meanwhile.
  stall(st.stream.get(), 500);
  for (std::size_t i = 0; i < st.names.size(); ++i) {
    st.data[i].assign(st.sizes[i], static_cast<std::uint8_t>(0x30 + i));
    CUTRAIN_CUDA_CHECK(cudaMemsetAsync(st.bufs[i].get(), 0x30 + int(i), st.sizes[i], st.stream.get()));
  }
  st.off->offload({}, o);
  // Returned without waiting for the owner (no timing: also holds under compute-sanitizer).
  EXPECT_EQ(cudaStreamQuery(st.stream.get()), cudaErrorNotReady)
      << "a non-blocking pinned offload should return while the owner stream is still stalled";
  st.off->reload(true);
  st.expect_intact("after a non-blocking offload behind queued writes");
}

// The reload copy must land after owner-stream work that used the reallocated block, and users
// who wait_resident must see the reloaded bytes even while the copy stream is stalled.
TEST(OffloadGpu, NonBlockingReloadIsOrderedBothWays) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  States st(rng);
  st.off->offload({});
  // Owner: stall, then scribble over blocks the reload will take back from the cache.
  std::vector<Buffer> junk;
  stall(st.stream.get(), 200);
  for (std::size_t i = 0; i < st.names.size(); ++i) {
    junk.emplace_back(st.alloc, st.sizes[i], st.stream.get());
    CUTRAIN_CUDA_CHECK(cudaMemsetAsync(junk.back().get(), 0xFF, st.sizes[i], st.stream.get()));
  }
  junk.clear();  // cached on the owner stream, reused by the reload's allocations
  stall(st.off->copy_stream(), 50);  // shorter: without the allocation-point wait the copy would land first
  st.off->reload(true);
  // Users copy the states out on the owner stream right after waiting.
  std::vector<Buffer> out;
  for (std::size_t i = 0; i < st.names.size(); ++i) {
    st.off->wait_resident(st.names[i], st.stream.get());
    out.emplace_back(st.alloc, st.sizes[i], st.stream.get());
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(out.back().get(), st.bufs[i].get(), st.sizes[i], cudaMemcpyDeviceToDevice,
                                       st.stream.get()));
  }
  st.stream.synchronize();
  for (std::size_t i = 0; i < st.names.size(); ++i)
    EXPECT_TRUE(download(out[i].get(), st.sizes[i]) == st.data[i]) << st.names[i];
  st.expect_intact("after an ordered non-blocking reload");
}

TEST(OffloadGpu, EnsureResidentReloadsAndWaits) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  States st(rng);
  OffloadOptions o;
  o.non_blocking = true;
  st.off->offload({"hp_params", "lp_params"}, o);
  st.off->ensure_resident(st.stream.get());
  for (const auto& n : st.names) EXPECT_FALSE(st.off->is_offloaded(n));
  st.expect_intact("after ensure_resident");
}

TEST(OffloadGpu, ExternalStateRoundTrip) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const std::size_t bytes = 48 * MiB + 7;
  auto data = random_bytes(bytes, rng);
  void* p = nullptr;
  int releases = 0, reallocs = 0;
  CUTRAIN_CUDA_CHECK(cudaMalloc(&p, bytes));
  upload(p, data);
  Stream s;
  StateOffloader off(device_allocator(), s.get());
  ExternalState e;
  e.bytes = bytes;
  e.data = [&] { return p; };
  e.release = [&] {
    CUTRAIN_CUDA_CHECK(cudaFree(p));
    p = nullptr;
    ++releases;
  };
  e.reallocate = [&] {
    CUTRAIN_CUDA_CHECK(cudaMalloc(&p, bytes));
    CUTRAIN_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, bytes, s.get()));  // on the owner stream: ordered
    ++reallocs;
    return p;
  };
  off.add("contiguous_grad_buffer", e);
  for (bool nb : {false, true}) {
    OffloadOptions o;
    o.non_blocking = nb;
    off.offload({}, o);
    off.synchronize();
    EXPECT_EQ(p, nullptr);
    off.reload(nb);
    off.wait_resident("contiguous_grad_buffer", s.get());
    s.synchronize();
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(download(p, bytes) == data) << (nb ? "non-blocking" : "blocking");
  }
  EXPECT_EQ(releases, 2);
  EXPECT_EQ(reallocs, 2);
  cudaFree(p);
}

TEST(OffloadGpu, PinnedExhaustionLeavesTheStateIntact) {
  CUTRAIN_REQUIRE_GPU();
  StateOffloader off(device_allocator(), nullptr);
  bool released = false;
  ExternalState e;
  e.bytes = std::size_t{1} << 50;  // 1 PiB of pinned memory: refused
  e.data = [] { return reinterpret_cast<void*>(0x1000); };
  e.release = [&] { released = true; };
  e.reallocate = [] { return nullptr; };
  off.add("hp_params", e);
  try {
    off.offload({});
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(err.message().find("host memory exhausted"), std::string::npos) << err.message();
    EXPECT_NE(err.message().find("pinned"), std::string::npos) << err.message();
  }
  EXPECT_FALSE(released);
  EXPECT_FALSE(off.is_offloaded("hp_params"));
}

TEST(OffloadGpu, NvmeRoundTrip) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  States st(rng);
  char tmpl[] = "/tmp/cutrain-offload-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  OffloadOptions o;
  o.device = OffloadDevice::Nvme;
  o.nvme_path = tmpl;
  const auto before = st.alloc.stats().allocated_bytes.current;
  st.off->offload({}, o);
  EXPECT_LE(st.alloc.stats().allocated_bytes.current + std::int64_t(st.total()), before);
  EXPECT_EQ(std::filesystem::file_size(std::string(tmpl) + "/lp_grads.state"), st.sizes[3]);
  EXPECT_THROW(st.off->wait_resident("hp_params", st.stream.get()), Error);
  st.off->reload(false);
  st.expect_intact("after an NVMe round trip");
  EXPECT_FALSE(std::filesystem::exists(std::string(tmpl) + "/lp_grads.state"));
  std::filesystem::remove_all(tmpl);
}

// Non-blocking NVMe: a background write that holds the device memory until it lands, a background
// read that wait_resident joins; a read that fails leaves the state offloaded with its file.
TEST(OffloadGpu, NvmeNonBlockingRoundTripAndFailedRead) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  States st(rng);
  char tmpl[] = "/tmp/cutrain-offload-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  OffloadOptions o;
  o.device = OffloadDevice::Nvme;
  o.nvme_path = dir;
  o.non_blocking = true;
  const auto before = st.alloc.stats().allocated_bytes.current;
  st.off->offload({}, o);
  for (const auto& n : st.names) EXPECT_TRUE(st.off->is_offloaded(n)) << n;
  EXPECT_THROW(st.off->wait_resident("hp_params", st.stream.get()), Error);
  st.off->synchronize();  // the write lands, the device memory goes back
  EXPECT_LE(st.alloc.stats().allocated_bytes.current + std::int64_t(st.total()), before);
  EXPECT_EQ(std::filesystem::file_size(dir + "/lp_grads.state"), st.sizes[3]);
  st.off->reload(true);
  st.expect_intact("after a non-blocking NVMe round trip");  // wait_resident joins the read job
  EXPECT_FALSE(std::filesystem::exists(dir + "/lp_grads.state"));

  st.off->offload({"lp_params"}, o);
  st.off->synchronize();
  const std::string f = dir + "/lp_params.state";
  ASSERT_TRUE(std::filesystem::exists(f));
  std::filesystem::resize_file(f, 100);  // too short now: the read job fails
  st.off->reload(true);
  EXPECT_FALSE(st.off->is_offloaded("lp_params"));  // reading
  EXPECT_THROW(st.off->wait_resident("lp_params", st.stream.get()), Error);
  EXPECT_TRUE(st.off->is_offloaded("lp_params")) << "a failed read leaves the state offloaded";
  EXPECT_TRUE(std::filesystem::exists(f));
  st.off.reset();  // destroyed while offloaded to NVMe: its file goes
  EXPECT_FALSE(std::filesystem::exists(f));
  std::filesystem::remove_all(dir);
}

// Training continues exactly: N steps with an offload/reload round trip in the middle give the
// same losses and the same final state, bit for bit, as N steps without (bf16 and fp32).
class OffloadModelDtypes : public ::testing::TestWithParam<DType> {};

TEST_P(OffloadModelDtypes, ContinuationIsBitExact) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const int hidden = 384 + 2 * int(rng() % 64), steps = 6;  // an odd-ish size each run
  tools::OffloadModelOptions mo;
  mo.hidden = hidden;
  mo.nlayers = 3;
  mo.dtype = GetParam();
  mo.lr = 1e-3f;  // large enough that every step changes the bf16 params
  mo.seed = rng();
  std::vector<std::vector<float>> xs;
  std::vector<int> labels;
  for (int i = 0; i < steps; ++i) {
    xs.push_back(test::random_normal(hidden, rng));
    labels.push_back(int(rng() % hidden));
  }
  auto run = [&](int mode) {  // 0: plain, 1: blocking pinned round trip, 2: non-blocking pageable
    tools::OffloadModel m(mo);
    std::vector<float> losses;
    for (int i = 0; i < steps; ++i) {
      losses.push_back(m.step(xs[i].data(), labels[i]));
      if (mode != 0 && (i == 2 || i == 3)) {
        OffloadOptions o;
        o.pin_memory = mode == 1;
        o.non_blocking = mode == 2;
        m.offload_states({}, o);
        m.reload_states(mode == 2);
      }
    }
    return std::make_tuple(losses, m.download_params(), m.download_master(), m.download_moments());
  };
  auto [l0, p0, w0, mv0] = run(0);
  for (float l : l0) EXPECT_TRUE(std::isfinite(l));
  EXPECT_NE(l0.front(), l0.back());
  for (int mode : {1, 2}) {
    auto [l, p, w, mv] = run(mode);
    EXPECT_EQ(l, l0) << "mode " << mode;
    EXPECT_TRUE(p == p0) << "mode " << mode;
    EXPECT_TRUE(w == w0) << "mode " << mode;
    EXPECT_TRUE(mv == mv0) << "mode " << mode;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OffloadModelDtypes, ::testing::Values(DType::BF16, DType::F32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The fp32 model against a double-precision host reference: the first loss, and the first Adam
// step, which moves every parameter with a clear gradient by lr against the gradient's sign.
TEST(OffloadModelGpu, Fp32StepMatchesTheReference) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  const int h = 40 + int(rng() % 25), L = 2;
  tools::OffloadModelOptions mo;
  mo.hidden = h;
  mo.nlayers = L;
  mo.dtype = DType::F32;
  mo.lr = 1e-3f;
  mo.seed = rng();
  tools::OffloadModel m(mo);
  const std::vector<float> w0 = m.download_master();
  const std::size_t per = std::size_t(h) * h + h;
  ASSERT_EQ(w0.size(), per * L);
  const std::vector<float> x = test::random_normal(h, rng);
  const int label = int(rng() % h);
  // Reference forward / backward in double.
  std::vector<std::vector<double>> a(L + 1, std::vector<double>(h));
  for (int i = 0; i < h; ++i) a[0][i] = x[i];
  for (int l = 0; l < L; ++l)
    for (int n = 0; n < h; ++n) {
      double acc = w0[l * per + std::size_t(h) * h + n];
      for (int k = 0; k < h; ++k) acc += double(w0[l * per + std::size_t(n) * h + k]) * a[l][k];
      a[l + 1][n] = acc;
    }
  double mx = a[L][0], sum = 0;
  for (double z : a[L]) mx = std::max(mx, z);
  for (double z : a[L]) sum += std::exp(z - mx);
  const double loss_ref = std::log(sum) + mx - a[L][label];
  std::vector<double> g(per * L), dy(h);
  for (int n = 0; n < h; ++n) dy[n] = std::exp(a[L][n] - mx) / sum - (n == label ? 1.0 : 0.0);
  for (int l = L - 1; l >= 0; --l) {
    for (int n = 0; n < h; ++n) {
      for (int k = 0; k < h; ++k) g[l * per + std::size_t(n) * h + k] = dy[n] * a[l][k];
      g[l * per + std::size_t(h) * h + n] = dy[n];
    }
    std::vector<double> dx(h, 0.0);
    for (int n = 0; n < h; ++n)
      for (int k = 0; k < h; ++k) dx[k] += double(w0[l * per + std::size_t(n) * h + k]) * dy[n];
    dy = dx;
  }
  const float loss = m.step(x.data(), label);
  EXPECT_LE(std::abs(loss - loss_ref) / std::abs(loss_ref), 1e-5) << loss << " vs " << loss_ref;
  const std::vector<float> w1 = m.download_master();
  double gmax = 0;
  for (double v : g) gmax = std::max(gmax, std::abs(v));
  std::size_t checked = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g[i]) < 1e-3 * gmax) continue;
    const double d = double(w1[i]) - double(w0[i]);
    ASSERT_LT(d * g[i], 0.0) << "element " << i << ": moved " << d << " with gradient " << g[i];
    ASSERT_NEAR(std::abs(d), 1e-3, 2e-4) << "element " << i;
    ++checked;
  }
  EXPECT_GT(checked, g.size() / 4);
  // fp32 lp params are the master after the step.
  const std::vector<std::uint16_t> p = m.download_params();
  ASSERT_EQ(p.size() * 2, w1.size() * 4);
  EXPECT_EQ(std::memcmp(p.data(), w1.data(), w1.size() * 4), 0);
}

// Non-blocking offload followed at once by the next step (no reload call): the step's
// ensure_resident reloads and orders everything.
TEST(OffloadModelGpu, StepAfterNonBlockingOffloadReloadsItself) {
  CUTRAIN_REQUIRE_GPU();
  auto rng = test::fresh_rng();
  tools::OffloadModelOptions mo;
  mo.hidden = 256;
  mo.nlayers = 2;
  mo.seed = rng();
  auto x = test::random_normal(256, rng);
  tools::OffloadModel a(mo), b(mo);
  a.step(x.data(), 3);
  b.step(x.data(), 3);
  OffloadOptions o;
  o.non_blocking = true;
  b.offload_states({"optim_states", "lp_params"}, o);
  EXPECT_EQ(a.step(x.data(), 7), b.step(x.data(), 7));
  EXPECT_TRUE(a.download_params() == b.download_params());
}

TEST(OffloadModelGpu, UnsupportedDtypeIsAClearError) {
  CUTRAIN_REQUIRE_GPU();
  tools::OffloadModelOptions mo;
  mo.dtype = DType::F16;
  try {
    tools::OffloadModel m(mo);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("float16 is not supported"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("use bfloat16 or float32"), std::string::npos) << e.message();
  }
}

}  // namespace
