// CPU tests of runtime/comm: launch environments, the TCP rendezvous over loopback with several
// processes, and the ZeRO partition math for world sizes 1..64 and odd parameter counts.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <random>
#include <string>

#include "parallel/partition.h"
#include "runtime/comm/launch_env.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using namespace cutrain::comm;

namespace {
auto env_of(std::map<std::string, std::string> m) {
  return [m = std::move(m)](const char* k) -> const char* {
    auto it = m.find(k);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST(LaunchEnv, Torchrun) {
  auto e = read_launch_env(env_of({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.master_port, 1234);
}

TEST(LaunchEnv, OpenMpiAndSlurmAndDefault) {
  auto m = read_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  EXPECT_EQ(m.source, "openmpi");
  EXPECT_EQ(m.rank, 2);
  auto s = read_launch_env(env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "1"},
                                   {"SLURM_NTASKS_PER_NODE", "2"}}));
  EXPECT_EQ(s.source, "slurm");
  EXPECT_EQ(s.world_size, 6);
  auto d = read_launch_env(env_of({}));
  EXPECT_EQ(d.source, "default");
  EXPECT_EQ(d.world_size, 1);
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  try {
    read_launch_env(env_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("RANK=4"), std::string::npos) << e.message();
  }
  try {
    read_launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "two"}}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("WORLD_SIZE='two'"), std::string::npos) << e.message();
  }
  EXPECT_THROW(read_launch_env(env_of({{"MASTER_PORT", "70000"}})), Error);
}

TEST(Rendezvous, FourProcessesOverLoopback) {
  const int world = 4;
  const int port = 20000 + static_cast<int>(::getpid() % 20000);
  std::vector<char> blob = {'c', 'u', 't', 'r', 'a', 'i', 'n', 0, 42};
  std::vector<pid_t> kids;
  for (int r = 1; r < world; ++r) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      LaunchEnv e;
      e.rank = r;
      e.world_size = world;
      e.master_port = port;
      try {
        auto got = rendezvous_broadcast(e, {}, std::chrono::seconds(20));
        ::_exit(got == blob ? 0 : 3);
      } catch (...) {
        ::_exit(4);
      }
    }
    kids.push_back(pid);
  }
  LaunchEnv e0;
  e0.world_size = world;
  e0.master_port = port;
  EXPECT_EQ(rendezvous_broadcast(e0, blob, std::chrono::seconds(20)), blob);
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  }
}

TEST(Rendezvous, MissingPeerTimesOutNamingIt) {
  LaunchEnv e;
  e.world_size = 3;
  e.master_port = 40000 + static_cast<int>(::getpid() % 20000);
  try {
    rendezvous_broadcast(e, {'x'}, std::chrono::milliseconds(300));
    FAIL() << "no throw";
  } catch (const Error& err) {
    EXPECT_NE(err.message().find("missing ranks: 1, 2"), std::string::npos) << err.message();
  }
}

TEST(Partition, EveryWorldSizeAndOddCounts) {
  std::mt19937_64 rng(7);
  for (int world = 1; world <= 64; ++world) {
    for (std::size_t numel : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(254128976),
                              std::size_t(rng() % 100000 + 1), std::size_t(1234567)}) {
      for (std::size_t eb : {std::size_t(2), std::size_t(4)}) {
        parallel::FlatPartition p = parallel::partition_flat(numel, world, eb, 16);
        SCOPED_TRACE(testing::Message() << "world=" << world << " numel=" << numel << " eb=" << eb);
        ASSERT_GE(p.padded_numel, numel);
        ASSERT_EQ(p.padded_numel % world, 0u);
        ASSERT_EQ(p.per_rank * eb % 16, 0u) << "partition not a whole number of 16-byte vectors";
        ASSERT_LT(p.padding(), static_cast<std::size_t>(world) * p.align_elems + (numel == 0 ? p.align_elems * world : 0));
        std::size_t covered = 0;
        for (int r = 0; r < world; ++r) {
          parallel::Range rr = p.rank_range(r);
          ASSERT_EQ(rr.size(), p.per_rank);
          ASSERT_EQ(rr.begin, covered);
          covered = rr.end;
          parallel::Range real = p.owned_real(r);
          ASSERT_LE(real.end, numel);
          if (!rr.empty()) {
            ASSERT_EQ(p.owner_of(rr.begin), r);
            ASSERT_EQ(p.owner_of(rr.end - 1), r);
          }
        }
        ASSERT_EQ(covered, p.padded_numel);
      }
    }
  }
  EXPECT_THROW(parallel::partition_flat(10, 0, 2), Error);
  EXPECT_THROW(parallel::partition_flat(10, 2, 3, 16), Error);
}

TEST(Partition, BucketsFollowTensorBoundaries) {
  std::vector<parallel::TensorSpan> t = {{"a", 0, 100}, {"b", 128, 50}, {"c", 192, 1000}, {"d", 1216, 10}, {"e", 1232, 20}};
  auto b = parallel::make_buckets(t, 200);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].range.begin, 0u);
  EXPECT_EQ(b[0].range.end, 178u);
  EXPECT_EQ(b[0].tensors, (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(b[1].tensors, (std::vector<std::size_t>{2}));  // larger than a bucket: its own
  EXPECT_EQ(b[2].tensors, (std::vector<std::size_t>{3, 4}));
  std::vector<parallel::TensorSpan> bad = {{"x", 0, 10}, {"y", 5, 10}};
  EXPECT_THROW(parallel::make_buckets(bad, 100), Error);
  auto keep = parallel::persistent_tensors(t, 50);
  EXPECT_EQ(keep, (std::vector<bool>{false, true, false, true, true}));
}
