// CPU tests of the host communicator (runtime/comm/host_communicator.h), the test backend of the
// CPU training path: every collective and send/recv, every dtype, world sizes 1-8 in forked
// processes, fresh random inputs against an fp64 reduction in rank order, outputs poisoned
// first, odd counts, slots small enough that every collective runs in many chunks; and its
// failures: a rank that exits early or closes its communicator is named within the timeout, a
// rank that never arrives times out naming it, bad arguments are refused.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_fp16.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/comm/host_communicator.h"
#include "runtime/error.h"
#include "tests/support/fork_ranks.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using namespace cutrain::comm;

namespace {


// Runs body(comm) on `world` forked ranks; returns each rank's outcome: "" when it returned,
// else its error message. `before(rank)` runs in the child before the communicator exists.
std::vector<std::string> run_ranks(int world, const std::function<void(Communicator&)>& body,
                                   HostCommOptions opt = {}, const std::function<void(int)>& before = nullptr) {
  return test::fork_ranks(world, [&](int rank, int port) {
    if (before) before(rank);
    LaunchEnv e;
    e.rank = rank;
    e.world_size = world;
    e.master_port = port;
    auto c = create_host_communicator(e, opt);
    body(*c);
  });
}


// Rank r's input of a test, the same on every rank that generates it (seed, rank, dtype).
std::vector<double> inputs(std::uint64_t seed, int rank, DType t, std::size_t n) {
  std::mt19937_64 g(seed * 1000003 + std::uint64_t(rank) * 7919 + std::uint64_t(t));
  std::vector<double> v(n);
  for (auto& x : v) {
    switch (t) {
      case DType::I32: x = double(std::int64_t(g() % 2001) - 1000); break;
      case DType::U8: x = double(g() % 30); break;  // a sum of 8 stays below 256
      default: x = std::uniform_real_distribution<double>(-2, 2)(g); break;
    }
  }
  return v;
}

// The values in the element type (rounded as a store of that type would) and back.
std::vector<char> encode(const std::vector<double>& v, DType t) {
  std::vector<char> b(v.size() * dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    char* p = b.data() + i * dtype_size(t);
    switch (t) {
      case DType::F32: { float f = float(v[i]); std::memcpy(p, &f, 4); break; }
      case DType::BF16: { std::uint16_t h = f32_to_bf16_bits(float(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::F16: { __half h = __float2half_rn(float(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::I32: { std::int32_t k = std::int32_t(v[i]); std::memcpy(p, &k, 4); break; }
      case DType::U8: { std::uint8_t k = std::uint8_t(v[i]); std::memcpy(p, &k, 1); break; }
      default: break;
    }
  }
  return b;
}
std::vector<double> decode(const std::vector<char>& b, DType t) {
  std::vector<double> v(b.size() / dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const char* p = b.data() + i * dtype_size(t);
    switch (t) {
      case DType::F32: { float f; std::memcpy(&f, p, 4); v[i] = f; break; }
      case DType::BF16: { std::uint16_t h; std::memcpy(&h, p, 2); v[i] = bf16_bits_to_f32(h); break; }
      case DType::F16: { __half h; std::memcpy(&h, p, 2); v[i] = __half2float(h); break; }
      case DType::I32: { std::int32_t k; std::memcpy(&k, p, 4); v[i] = k; break; }
      case DType::U8: { std::uint8_t k; std::memcpy(&k, p, 1); v[i] = k; break; }
      default: break;
    }
  }
  return v;
}
std::vector<double> stored(const std::vector<double>& v, DType t) { return decode(encode(v, t), t); }

// got against want: exact for integers and moved data, else within the element type's rounding.
void check(const std::vector<double>& got, const std::vector<double>& want, DType t, const char* what, bool reduced) {
  CUTRAIN_CHECK(got.size() == want.size(), what, ": size ", got.size(), " != ", want.size());
  const double tol = !reduced || t == DType::I32 || t == DType::U8 ? 0.0
                     : t == DType::F32                              ? 1e-6
                     : t == DType::BF16                             ? 1e-2
                                                                    : 1e-3;
  for (std::size_t i = 0; i < got.size(); ++i)
    CUTRAIN_CHECK(std::isfinite(got[i]) && std::abs(got[i] - want[i]) <= tol * std::max(1.0, std::abs(want[i])), what,
                  " (", dtype_name(t), "): element ", i, " is ", got[i], ", expected ", want[i]);
}

constexpr DType kTypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::U8};

// Every collective of every dtype on one rank, checked against what every rank's inputs give.
void every_collective(Communicator& c, std::uint64_t seed, std::size_t n, std::size_t channel_bytes) {
  const int W = c.world_size(), me = c.rank();
  for (DType t : kTypes) {
    const std::size_t es = dtype_size(t);
    std::vector<std::vector<double>> in(W), big(W);  // n and W*n elements per rank, as stored
    for (int r = 0; r < W; ++r) {
      in[r] = stored(inputs(seed, r, t, n), t);
      big[r] = stored(inputs(seed + 1, r, t, n * W), t);
    }
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      std::vector<char> buf = encode(in[me], t);
      c.all_reduce(buf.data(), n, t, op, nullptr);
      std::vector<double> want(n, 0.0);
      for (std::size_t i = 0; i < n; ++i) {
        for (int r = 0; r < W; ++r) want[i] += in[r][i];
        if (op == ReduceOp::Avg) want[i] = (t == DType::I32 || t == DType::U8) ? std::trunc(want[i] / W) : want[i] / W;
      }
      check(decode(buf, t), want, t, op == ReduceOp::Sum ? "all_reduce sum" : "all_reduce avg", true);
    }
    {  // reduce-scatter into a separate buffer, poisoned, and in place (the rank's own block)
      std::vector<char> send = encode(big[me], t), recv(n * es, char(0x7f));
      c.reduce_scatter(send.data(), recv.data(), n, t, ReduceOp::Sum, nullptr);
      std::vector<double> want(n, 0.0);
      for (std::size_t i = 0; i < n; ++i)
        for (int r = 0; r < W; ++r) want[i] += big[r][std::size_t(me) * n + i];
      check(decode(recv, t), want, t, "reduce_scatter", true);
      c.reduce_scatter(send.data(), send.data() + std::size_t(me) * n * es, n, t, ReduceOp::Sum, nullptr);
      check(decode(std::vector<char>(send.begin() + std::ptrdiff_t(me * n * es),
                                     send.begin() + std::ptrdiff_t((me + 1) * n * es)), t),
            want, t, "reduce_scatter in place", true);
    }
    {  // all-gather, and in place
      std::vector<char> send = encode(in[me], t), recv(W * n * es, char(0x7f));
      c.all_gather(send.data(), recv.data(), n, t, nullptr);
      std::vector<double> want;
      for (int r = 0; r < W; ++r) want.insert(want.end(), in[r].begin(), in[r].end());
      check(decode(recv, t), want, t, "all_gather", false);
      std::vector<char> inplace(W * n * es, char(0x7f));
      std::memcpy(inplace.data() + me * n * es, send.data(), n * es);
      c.all_gather(inplace.data() + me * n * es, inplace.data(), n, t, nullptr);
      check(decode(inplace, t), want, t, "all_gather in place", false);
    }
    {  // all-to-all: rank r's block j lands on rank j at block r
      std::vector<char> send = encode(big[me], t), recv(W * n * es, char(0x7f));
      c.all_to_all(send.data(), recv.data(), n, t, nullptr);
      std::vector<double> want;
      for (int r = 0; r < W; ++r)
        want.insert(want.end(), big[r].begin() + std::ptrdiff_t(me * n), big[r].begin() + std::ptrdiff_t((me + 1) * n));
      check(decode(recv, t), want, t, "all_to_all", false);
    }
    {  // broadcast from the last rank
      const int root = W - 1;
      std::vector<char> buf = me == root ? encode(in[root], t) : std::vector<char>(n * es, char(0x7f));
      c.broadcast(buf.data(), n, t, root, nullptr);
      check(decode(buf, t), in[root], t, "broadcast", false);
    }
    if (W > 1) {  // a ring: to the next rank, from the previous, messages longer than a channel
      const int next = (me + 1) % W, prev = (me + W - 1) % W;
      std::vector<char> out = encode(big[me], t), got(W * n * es, char(0x7f));
      if (me % 2 == 0) {
        c.send(out.data(), W * n, t, next, nullptr);
        c.recv(got.data(), W * n, t, prev, nullptr);
      } else {
        c.recv(got.data(), W * n, t, prev, nullptr);
        c.send(out.data(), W * n, t, next, nullptr);
      }
      check(decode(got, t), big[prev], t, "send/recv ring", false);
      // Both neighbours send first, then receive: when the message fits the ring.
      if (n * es > channel_bytes) continue;
      std::vector<char> small = encode(in[me], t), got2(n * es, char(0x7f));
      c.send(small.data(), n, t, next, nullptr);
      c.recv(got2.data(), n, t, prev, nullptr);
      check(decode(got2, t), in[prev], t, "send first, then recv", false);
    }
  }
  std::vector<double> sq(n);
  std::mt19937_64 g(seed + 99 + std::uint64_t(me));
  for (auto& x : sq) x = std::uniform_real_distribution<double>(0, 1)(g);
  std::vector<double> want(n, 0.0);
  for (int r = 0; r < W; ++r) {
    std::mt19937_64 gr(seed + 99 + std::uint64_t(r));
    for (std::size_t i = 0; i < n; ++i) want[i] += std::uniform_real_distribution<double>(0, 1)(gr);
  }
  c.all_reduce_sum_f64(sq.data(), n, nullptr);
  for (std::size_t i = 0; i < n; ++i)
    CUTRAIN_CHECK(std::abs(sq[i] - want[i]) <= 1e-12 * want[i], "all_reduce_sum_f64: element ", i, " is ", sq[i],
                  ", expected ", want[i]);
  c.barrier(nullptr);
}

std::uint64_t fresh_seed() {
  auto rng = test::fresh_rng();
  return rng();
}

}  // namespace

TEST(HostComm, EveryCollectiveAndDtypeAtWorldSizesOneToEight) {
  const std::uint64_t seed = fresh_seed();
  HostCommOptions small;
  small.slot_bytes = 192;  // many chunks, and chunks that end inside a block
  small.channel_bytes = 256;
  small.timeout = std::chrono::seconds(60);
  for (int world = 1; world <= 8; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    test::expect_all_ok(run_ranks(world, [&](Communicator& c) {
      CUTRAIN_CHECK(c.world_size() == world && c.device() == -1, "world ", c.world_size());
      every_collective(c, seed + std::uint64_t(world), 37, small.channel_bytes);
    }, small));
  }
}

TEST(HostComm, DefaultSizesLargeOddCount) {
  const std::uint64_t seed = fresh_seed();
  HostCommOptions o;
  o.timeout = std::chrono::seconds(60);
  for (int world : {2, 5}) {
    SCOPED_TRACE("world " + std::to_string(world));
    test::expect_all_ok(run_ranks(world, [&](Communicator& c) { every_collective(c, seed, 100003, o.channel_bytes); }, o));
  }
}

TEST(HostComm, RankThatExitsEarlyIsNamedWithinTheTimeout) {
  HostCommOptions o;
  o.timeout = std::chrono::seconds(30);
  const auto t0 = std::chrono::steady_clock::now();
  auto out = run_ranks(4, [](Communicator& c) {
    if (c.rank() == 2) ::_exit(3);  // dies without closing the communicator
    std::vector<float> v(1000, 1.f);
    c.all_reduce(v.data(), v.size(), DType::F32, ReduceOp::Sum, nullptr);
  }, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0) << "the dead rank was found only after " << s << " s";
  for (int r : {0, 1, 3}) {
    EXPECT_NE(out[r].find("rank 2 (pid "), std::string::npos) << "rank " << r << ": " << out[r];
    EXPECT_NE(out[r].find("exited without closing the communicator"), std::string::npos) << out[r];
  }
}

TEST(HostComm, RankThatClosesItsCommunicatorIsNamed) {
  HostCommOptions o;
  o.timeout = std::chrono::seconds(30);
  auto out = run_ranks(3, [](Communicator& c) {
    if (c.rank() == 1) return;  // closes (the communicator is destroyed) and leaves
    std::vector<double> v(4, 1.0);
    c.all_reduce_sum_f64(v.data(), v.size(), nullptr);
  }, o);
  EXPECT_EQ(out[1], "");
  for (int r : {0, 2}) EXPECT_NE(out[r].find("rank 1 (pid "), std::string::npos) << out[r];
  for (int r : {0, 2}) EXPECT_NE(out[r].find("closed its communicator"), std::string::npos) << out[r];
}

TEST(HostComm, RecvFromADeadPeerNamesIt) {
  HostCommOptions o;
  o.timeout = std::chrono::seconds(30);
  auto out = run_ranks(2, [](Communicator& c) {
    if (c.rank() == 1) ::_exit(0);
    float x = 0;
    c.recv(&x, 1, DType::F32, 1, nullptr);
  }, o);
  EXPECT_NE(out[0].find("recv from rank 1: rank 1 (pid "), std::string::npos) << out[0];
}

TEST(HostComm, ARankThatNeverArrivesTimesOutNamingIt) {
  HostCommOptions o;
  o.timeout = std::chrono::milliseconds(700);
  auto out = run_ranks(3, [](Communicator& c) {
    if (c.rank() == 2) {
      ::usleep(1500 * 1000);  // alive, but never joins the barrier
      return;
    }
    c.barrier(nullptr);
  }, o);
  for (int r : {0, 1}) EXPECT_NE(out[r].find("timed out after 700 ms waiting for rank(s) 2"), std::string::npos) << out[r];
}

TEST(HostComm, BadArgumentsAreRefused) {
  auto out = run_ranks(2, [](Communicator& c) {
    std::uint16_t x[2] = {};
    std::string errs;
    try {
      c.all_reduce(x, 2, DType::U16, ReduceOp::Sum, nullptr);
    } catch (const Error& e) {
      errs += e.message() + "|";
    }
    try {
      c.send(x, 1, DType::F32, c.rank(), nullptr);
    } catch (const Error& e) {
      errs += e.message() + "|";
    }
    float f[2] = {};
    try {
      c.all_reduce(f, 2, DType::F32, ReduceOp::Max, nullptr);
    } catch (const Error& e) {
      errs += e.message() + "|";
    }
    c.barrier(nullptr);  // still usable: the max was refused before any rank wrote its slot
    CUTRAIN_CHECK(errs.find("all_reduce with a max reduction is not built") != std::string::npos &&
                      errs.find("no collective type for uint16") != std::string::npos &&
                      errs.find("expected a peer rank in [0, 2) other than") != std::string::npos,
                  "messages: ", errs);
  });
  test::expect_all_ok(out);
  LaunchEnv e;
  e.world_size = 65;
  EXPECT_THROW(create_host_communicator(e), Error);
}
