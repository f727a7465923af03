// CPU tests of runtime/comm: launch environments (torchrun's variables, --local_rank), the TCP
// rendezvous over loopback (127.0.0.1 only) with several processes, beside a stand-in for
// torchrun's store on MASTER_PORT, and the ZeRO partition math for world sizes 1..64 and odd parameter counts.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "parallel/partition.h"
#include "runtime/comm/launch_env.h"
#include "runtime/comm/launch_plan.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"
#include "tests/support/cpu_test_util.h"

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
  const int port = test::free_tcp_port();
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
  e.master_port = test::free_tcp_port();
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

// ---- torchrun coexistence: its agent's TCPStore holds MASTER_PORT ----

namespace {
// A listening socket on 127.0.0.1:port, standing for torchrun's TCPStore (it accepts nothing).
struct DummyListener {
  int fd = -1;
  explicit DummyListener(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 16) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~DummyListener() {
    if (fd >= 0) ::close(fd);
  }
};

// A port p with p and p + 1 free on loopback now (the pid spreads parallel test processes).
int free_port_pair(int base) {
  for (int p = base + static_cast<int>(::getpid() % 5000) * 2; p < 65000; p += 2) {
    DummyListener a(p), b(p + 1);
    if (a.fd >= 0 && b.fd >= 0) return p;
  }
  return -1;
}

std::map<std::string, std::string> torchrun_vars(int rank, int port) {
  // What torchrun's agent sets for each worker (torch.distributed.run's documented variables).
  return {{"RANK", std::to_string(rank)},    {"LOCAL_RANK", std::to_string(rank)},
          {"GROUP_RANK", "0"},               {"ROLE_RANK", std::to_string(rank)},
          {"ROLE_NAME", "default"},          {"WORLD_SIZE", "2"},
          {"LOCAL_WORLD_SIZE", "2"},         {"ROLE_WORLD_SIZE", "2"},
          {"GROUP_WORLD_SIZE", "1"},         {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)}, {"TORCHELASTIC_RUN_ID", "none"},
          {"TORCHELASTIC_RESTART_COUNT", "0"},   {"TORCHELASTIC_MAX_RESTARTS", "0"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
}

// World size 2 over loopback: rank 1 in a child process, rank 0 here; returns rank 0's blob.
std::vector<char> two_rank_rendezvous(const LaunchEnv& e0, const LaunchEnv& e1, const std::vector<char>& blob,
                                      int* child_status) {
  pid_t pid = ::fork();
  if (pid == 0) {
    try {
      auto got = rendezvous_broadcast(e1, {}, std::chrono::seconds(20));
      ::_exit(got == blob ? 0 : 3);
    } catch (...) {
      ::_exit(4);
    }
  }
  std::vector<char> got = rendezvous_broadcast(e0, blob, std::chrono::seconds(20));
  ::waitpid(pid, child_status, 0);
  return got;
}
}  // namespace

TEST(LaunchEnv, TorchrunVariablesMoveTheRendezvousOffMasterPort) {
  auto e = read_launch_env(env_of(torchrun_vars(1, 29500)));
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.torchelastic_variable, "TORCHELASTIC_RUN_ID");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.port(), 29501);
  EXPECT_NE(e.rendezvous_port_from.find("MASTER_PORT + 1"), std::string::npos);
  // Any one of the agent's variables is enough.
  auto g = read_launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"GROUP_RANK", "0"}, {"MASTER_PORT", "1000"}}));
  EXPECT_EQ(g.port(), 1001);
  // cutrain launch and DeepSpeed's launcher set RANK etc. but none of them: MASTER_PORT itself.
  auto plain = read_launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1000"}}));
  EXPECT_EQ(plain.port(), 1000);
  EXPECT_TRUE(plain.torchelastic_variable.empty());
  // The override wins in both cases.
  auto m = torchrun_vars(0, 29500);
  m["CUTRAIN_RENDEZVOUS_PORT"] = "31000";
  EXPECT_EQ(read_launch_env(env_of(m)).port(), 31000);
  EXPECT_EQ(read_launch_env(env_of({{"CUTRAIN_RENDEZVOUS_PORT", "31001"}})).port(), 31001);
  try {
    read_launch_env(env_of({{"CUTRAIN_RENDEZVOUS_PORT", "0"}}));
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(err.message().find("CUTRAIN_RENDEZVOUS_PORT=0"), std::string::npos) << err.message();
  }
  auto top = torchrun_vars(0, 65535);
  try {
    read_launch_env(env_of(top));
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(err.message().find("CUTRAIN_RENDEZVOUS_PORT"), std::string::npos) << err.message();
  }
}

TEST(Rendezvous, UnderTorchrunWithItsStoreOnMasterPort) {
  const int port = free_port_pair(21000);
  ASSERT_GT(port, 0);
  DummyListener store(port);  // torchrun's TCPStore
  ASSERT_GE(store.fd, 0);
  const LaunchEnv e0 = read_launch_env(env_of(torchrun_vars(0, port)));
  const LaunchEnv e1 = read_launch_env(env_of(torchrun_vars(1, port)));
  ASSERT_EQ(e0.port(), port + 1);
  const std::vector<char> blob = {'i', 'd', 0, 7};
  int st = 0;
  EXPECT_EQ(two_rank_rendezvous(e0, e1, blob, &st), blob);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "rank 1 status " << st;
}

TEST(Rendezvous, PortClashNamesThePortAndTheFix) {
  const int port = free_port_pair(31000);
  ASSERT_GT(port, 0);
  DummyListener store(port), other(port + 1);  // the store, and another job on MASTER_PORT + 1
  ASSERT_GE(store.fd, 0);
  ASSERT_GE(other.fd, 0);
  const LaunchEnv e0 = read_launch_env(env_of(torchrun_vars(0, port)));
  try {
    rendezvous_broadcast(e0, {'x'}, std::chrono::milliseconds(500));
    FAIL() << "no throw";
  } catch (const Error& err) {
    const std::string m = err.message();
    EXPECT_NE(m.find("cannot listen on port " + std::to_string(port + 1)), std::string::npos) << m;
    EXPECT_NE(m.find("MASTER_PORT + 1"), std::string::npos) << m;
    EXPECT_NE(m.find("CUTRAIN_RENDEZVOUS_PORT"), std::string::npos) << m;
  }
  // Without torchrun's variables rank 0 wants MASTER_PORT itself, and says what holds it.
  const LaunchEnv plain = read_launch_env(
      env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}}));
  try {
    rendezvous_broadcast(plain, {'x'}, std::chrono::milliseconds(500));
    FAIL() << "no throw";
  } catch (const Error& err) {
    const std::string m = err.message();
    EXPECT_NE(m.find("cannot listen on port " + std::to_string(port) + ", the port from MASTER_PORT"), std::string::npos)
        << m;
    EXPECT_NE(m.find("TCPStore"), std::string::npos) << m;
  }
}

TEST(Rendezvous, OverridePortUnderTorchrun) {
  const int port = free_port_pair(41000);
  ASSERT_GT(port, 0);
  DummyListener store(port), other(port + 1);
  auto m0 = torchrun_vars(0, port), m1 = torchrun_vars(1, port);
  const int chosen = free_port_pair(port + 2);
  ASSERT_GT(chosen, 0);
  m0["CUTRAIN_RENDEZVOUS_PORT"] = m1["CUTRAIN_RENDEZVOUS_PORT"] = std::to_string(chosen);
  const std::vector<char> blob = {'o', 'k'};
  int st = 0;
  EXPECT_EQ(two_rank_rendezvous(read_launch_env(env_of(m0)), read_launch_env(env_of(m1)), blob, &st), blob);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "rank 1 status " << st;
}

TEST(LaunchEnv, LocalRankFlagAgreesWithTheEnvironment) {
  EXPECT_EQ(check_local_rank_flag(3, env_of({})), "3");  // LOCAL_RANK unset: export the flag's value
  EXPECT_EQ(check_local_rank_flag(1, env_of({{"LOCAL_RANK", "1"}})), "");
  try {
    check_local_rank_flag(1, env_of({{"LOCAL_RANK", "0"}}));
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(err.message().find("--local_rank=1"), std::string::npos) << err.message();
    EXPECT_NE(err.message().find("LOCAL_RANK=0"), std::string::npos) << err.message();
  }
  EXPECT_THROW(check_local_rank_flag(-1, env_of({})), Error);
  EXPECT_THROW(check_local_rank_flag(0, env_of({{"LOCAL_RANK", "zero"}})), Error);
}

// ---- the launch plan: DeepSpeed's hostfile, --include / --exclude, --num_nodes, --num_gpus ----

namespace {
using test::message_of;

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + name + std::to_string(::getpid());
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}
}  // namespace

TEST(LaunchPlan, HostfileFormat) {
  auto h = parse_hostfile("# cluster\nworker-0 slots=4\n\n  worker-1   slots=2   # two GPUs\n", "hf");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].host, "worker-0");
  EXPECT_EQ(h[0].slots, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(h[1].slots, (std::vector<int>{0, 1}));
  auto bad = message_of([] { parse_hostfile("a slots=2\nb 4\n", "hosts.txt"); });
  EXPECT_HAS(bad, "hosts.txt:2");
  EXPECT_HAS(bad, "expected `hostname slots=N`");
  EXPECT_HAS(bad, "found 'b 4'");
  EXPECT_HAS(message_of([] { parse_hostfile("a slots=0\n", "hf"); }), "found 'slots=0'");
  EXPECT_HAS(message_of([] { parse_hostfile("a slots=x\n", "hf"); }), "found 'slots=x'");
  EXPECT_HAS(message_of([] { parse_hostfile("a slots=1 b\n", "hf"); }), "found 'a slots=1 b'");
  EXPECT_HAS(message_of([] { parse_hostfile("a slots=1\na slots=2\n", "hf"); }), "found 'a' again");
  EXPECT_HAS(message_of([] { parse_hostfile("# nothing\n\n", "hf"); }), "hf: expected at least one");
  auto missing = message_of([] { read_hostfile("/nonexistent/hostfile"); });
  EXPECT_HAS(missing, "--hostfile /nonexistent/hostfile");
  EXPECT_HAS(missing, "no such file");
}

TEST(LaunchPlan, IncludeExclude) {
  const std::vector<HostSlots> pool = {{"a", {0, 1, 2, 3}}, {"b", {0, 1}}, {"c", {0, 1}}};
  auto inc = filter_hosts(pool, "c@a:2,0", "", "hf");  // the pool's order, slots sorted
  ASSERT_EQ(inc.size(), 2u);
  EXPECT_EQ(inc[0].host, "a");
  EXPECT_EQ(inc[0].slots, (std::vector<int>{0, 2}));
  EXPECT_EQ(inc[1].host, "c");
  EXPECT_EQ(inc[1].slots, (std::vector<int>{0, 1}));
  auto exc = filter_hosts(pool, "", "a:1,3@b", "hf");
  ASSERT_EQ(exc.size(), 2u);
  EXPECT_EQ(exc[0].slots, (std::vector<int>{0, 2}));
  EXPECT_EQ(exc[1].host, "c");
  auto both = message_of([&] { filter_hosts(pool, "a", "b", "hf"); });
  EXPECT_HAS(both, "--include 'a' and --exclude 'b'");
  EXPECT_HAS(both, "found both");
  auto stranger = message_of([&] { filter_hosts(pool, "d:0", "", "--hostfile hf"); });
  EXPECT_HAS(stranger, "--include 'd:0'");
  EXPECT_HAS(stranger, "expected a host of --hostfile hf (a, b, c), found 'd'");
  auto slot = message_of([&] { filter_hosts(pool, "", "b:2", "hf"); });
  EXPECT_HAS(slot, "--exclude 'b:2'");
  EXPECT_HAS(slot, "gives it 0,1), found slot 2");
  EXPECT_HAS(message_of([&] { filter_hosts(pool, "a:x", "", "hf"); }), "found 'x'");
  EXPECT_HAS(message_of([&] { filter_hosts(pool, "a@@b", "", "hf"); }), "found an empty one");
  EXPECT_HAS(message_of([&] { filter_hosts(pool, "", "a@b@c", "hf"); }), "found none");
}

TEST(LaunchPlan, NodesRanksAndThisMachine) {
  const std::string hf = write_temp("hostfile", "node0 slots=4\nnode1.cluster slots=4\nnode2 slots=4\n");
  LaunchRequest r;
  r.hostfile = hf;
  r.this_host = "node1";  // matches node1.cluster by its short name
  r.exclude = "node0:3";
  r.num_nodes = 2;
  LaunchPlan p = make_launch_plan(r);
  ASSERT_EQ(p.nodes.size(), 2u);
  EXPECT_EQ(p.world_size, 7);
  EXPECT_EQ(p.local_node, 1);
  EXPECT_EQ(p.nodes[1].first_rank, 3);
  EXPECT_EQ(p.nodes[0].gpus, (std::vector<int>{0, 1, 2}));
  r.num_gpus = 2;  // the first two slots of each host
  p = make_launch_plan(r);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.nodes[1].gpus, (std::vector<int>{0, 1}));
  r.num_gpus = 4;  // node0 has 3 slots left after the exclude
  auto over = message_of([&] { make_launch_plan(r); });
  EXPECT_HAS(over, "--num_gpus 4: expected at most the slots of each host, found node0 with 3");
  r.num_gpus = -1;
  r.num_nodes = 4;
  EXPECT_HAS(message_of([&] { make_launch_plan(r); }), "--num_nodes 4: expected at most the 3 host(s)");
  r.num_nodes = -1;
  r.this_host = "elsewhere";
  auto lost = message_of([&] { make_launch_plan(r); });
  EXPECT_HAS(lost, "expected this machine ('elsewhere')");
  EXPECT_HAS(lost, "--node_rank");
  r.node_rank = 2;
  p = make_launch_plan(r);
  EXPECT_EQ(p.local_node, 2);
  EXPECT_EQ(p.nodes[2].first_rank, 7);
  r.node_rank = 3;
  EXPECT_HAS(message_of([&] { make_launch_plan(r); }), "--node_rank 3: expected a node index below 3");
}

TEST(LaunchPlan, ThisMachineAlone) {
  LaunchRequest r;
  r.local_gpus = 0;  // no GPU: one process
  LaunchPlan p = make_launch_plan(r);
  EXPECT_EQ(p.world_size, 1);
  r.num_gpus = 4;
  r.include = "localhost:1,3";
  p = make_launch_plan(r);
  ASSERT_EQ(p.nodes.size(), 1u);
  EXPECT_EQ(p.nodes[0].gpus, (std::vector<int>{1, 3}));
  EXPECT_EQ(p.world_size, 2);
  r.include.clear();
  r.num_nodes = 2;
  EXPECT_HAS(message_of([&] { make_launch_plan(r); }), "several nodes need --hostfile");
}
