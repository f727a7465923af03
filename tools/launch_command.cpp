// `cutrain launch [DeepSpeed launcher flags] -- PROGRAM ARGS...`: starts this node's processes, one
// per GPU, with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT). The flags are the `deepspeed` launcher's: --num_gpus, --num_nodes, --hostfile,
// --include / --exclude, --master_addr, --master_port. With several nodes it starts only the
// processes of the node it runs on (found by host name, or --node_rank) and prints the command to
// run on each other node; it does not log into them. The plan is checked whole before any process
// starts. If one rank fails, the others are stopped and the failing rank and its status reported.
//
// `--backend host --num_procs N`: N processes on this machine with the same variables, for the
// CPU backend (`cutrain train --device cpu`), whose ranks talk through the host communicator
// (runtime/comm/host_communicator.h: shared memory, a test and development backend). GPUs always
// use NCCL (--backend nccl, the default).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/host_communicator.h"
#include "runtime/comm/launch_plan.h"
#include "runtime/error.h"
#include "tools/commands.h"

namespace cutrain::tools {
namespace {

struct LaunchArgs {
  int num_gpus = -1;
  int num_nodes = -1;
  int node_rank = -1;
  std::string hostfile, include, exclude;
  std::string master_addr;
  int master_port = 29500;
  std::string backend = "nccl";
  int num_procs = -1;
  std::vector<std::string> command;
};

int local_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::string this_host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string();
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

// A node's GPU indices as CUDA_VISIBLE_DEVICES: taken through the caller's CUDA_VISIBLE_DEVICES when
// it is set (slot i is its i-th entry), else the indices themselves. Empty when nothing needs
// setting (the node uses GPUs 0..n-1 of what the caller sees).
std::string visible_devices(const std::vector<int>& gpus) {
  bool identity = true;
  for (std::size_t i = 0; i < gpus.size(); ++i) identity = identity && gpus[i] == static_cast<int>(i);
  if (identity) return "";
  const char* outer = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!outer || !*outer) return join(gpus);
  std::vector<std::string> seen;
  std::stringstream ss(outer);
  for (std::string d; std::getline(ss, d, ',');) seen.push_back(d);
  std::string s;
  for (int g : gpus) {
    CUTRAIN_CHECK(static_cast<std::size_t>(g) < seen.size(), "launch: GPU slot ", g,
                  " of this node: expected an index into CUDA_VISIBLE_DEVICES='", outer, "' (", seen.size(),
                  " devices), found none at ", g);
    if (!s.empty()) s += ',';
    s += seen[g];
  }
  return s;
}

// The command line that starts node `k` of the same plan.
std::string command_for_node(const LaunchArgs& a, const std::string& master_addr, int k) {
  std::ostringstream os;
  os << "cutrain launch";
  if (!a.hostfile.empty()) os << " --hostfile " << a.hostfile;
  if (!a.include.empty()) os << " --include '" << a.include << "'";
  if (!a.exclude.empty()) os << " --exclude '" << a.exclude << "'";
  if (a.num_nodes > 0) os << " --num_nodes " << a.num_nodes;
  if (a.num_gpus > 0) os << " --num_gpus " << a.num_gpus;
  os << " --master_addr " << master_addr << " --master_port " << a.master_port << " --node_rank " << k << " --";
  for (const auto& c : a.command) os << " " << c;
  return os.str();
}

// Starts ranks first_rank .. first_rank + nlocal - 1 of `world_size` with torchrun's variables and
// waits for them; the first that fails is reported and the others are stopped.
int start_and_wait(const LaunchArgs& a, int first_rank, int nlocal, int world_size, const std::string& master_addr,
                   const std::string& cvd) {
  std::vector<pid_t> pids;
  for (int i = 0; i < nlocal; ++i) {
    pid_t pid = ::fork();
    CUTRAIN_CHECK(pid >= 0, "fork failed: ", std::strerror(errno));
    if (pid == 0) {
      ::setenv("RANK", std::to_string(first_rank + i).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nlocal).c_str(), 1);
      ::setenv("MASTER_ADDR", master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(a.master_port).c_str(), 1);
      if (!cvd.empty()) ::setenv("CUDA_VISIBLE_DEVICES", cvd.c_str(), 1);
      ::setenv("NCCL_NVLS_ENABLE", "0", 0);  // multicast stays off unless the user set it
      std::vector<char*> argv;
      for (const auto& s : a.command) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::cerr << "cutrain launch: cannot run '" << a.command[0] << "': " << std::strerror(errno) << "\n";
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  int result = 0;
  std::size_t alive = pids.size();
  while (alive) {
    int status = 0;
    pid_t pid = ::wait(&status);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    --alive;
    int rank = -1;
    for (std::size_t i = 0; i < pids.size(); ++i)
      if (pids[i] == pid) {
        rank = first_rank + static_cast<int>(i);
        pids[i] = -1;
      }
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && result == 0) {
      result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::cerr << "cutrain launch: rank " << rank << " "
                << (WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                      : std::string("was killed by signal ") + strsignal(WTERMSIG(status)))
                << "; stopping the other ranks\n";
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGTERM);
    }
  }
  return result;
}

// --backend host: one machine, N processes, no GPU plan.
int run_host_launch(const LaunchArgs& a) {
  CUTRAIN_CHECK(a.num_procs >= 1, "launch --backend host: expected --num_procs N (N >= 1 processes), found ",
                a.num_procs < 0 ? std::string("none") : std::to_string(a.num_procs));
  CUTRAIN_CHECK(a.num_procs <= comm::kHostCommMaxWorld, "launch --backend host: --num_procs ", a.num_procs,
                ": the host communicator serves at most ", comm::kHostCommMaxWorld, " ranks");
  for (auto [given, flag] : {std::pair{a.num_gpus >= 0, "--num_gpus"}, {a.num_nodes >= 0, "--num_nodes"},
                             {a.node_rank >= 0, "--node_rank"}, {!a.hostfile.empty(), "--hostfile"},
                             {!a.include.empty(), "--include"}, {!a.exclude.empty(), "--exclude"}})
    CUTRAIN_CHECK(!given, "launch --backend host: ", flag, " places GPU processes on nodes; the host backend runs "
                  "--num_procs processes on this machine: expected --num_procs alone");
  const std::string master_addr = a.master_addr.empty() ? "127.0.0.1" : a.master_addr;
  std::cerr << "cutrain launch: " << a.num_procs << " processes on this machine, host communicator "
            << "(shared memory; a test and development backend for --device cpu)\n";
  return start_and_wait(a, 0, a.num_procs, a.num_procs, master_addr, "");
}

int run_launch(const LaunchArgs& a) {
  CUTRAIN_CHECK(!a.command.empty(), "launch: expected the program to run after `--`, found nothing");
  CUTRAIN_CHECK(a.master_port >= 1 && a.master_port <= 65535, "--master_port: expected a port in [1, 65535], found ",
                a.master_port);
  if (a.backend == "host") return run_host_launch(a);
  CUTRAIN_CHECK(a.num_procs < 0, "launch: --num_procs ", a.num_procs,
                " starts processes for --backend host (the CPU backend); with --backend nccl the processes are one "
                "per GPU: --num_gpus");
  comm::LaunchRequest req;
  req.hostfile = a.hostfile;
  req.include = a.include;
  req.exclude = a.exclude;
  req.num_nodes = a.num_nodes;
  req.num_gpus = a.num_gpus;
  req.node_rank = a.node_rank;
  req.this_host = this_host_name();
  if (a.hostfile.empty() && a.num_gpus < 0) req.local_gpus = local_device_count();
  const comm::LaunchPlan plan = comm::make_launch_plan(req);
  const comm::NodePlan& node = plan.nodes[plan.local_node];
  // One node: loopback unless told otherwise; several: the first host, where rank 0 runs.
  const std::string master_addr =
      !a.master_addr.empty() ? a.master_addr : plan.nodes.size() > 1 ? plan.nodes[0].host : "127.0.0.1";
  const std::string cvd = visible_devices(node.gpus);
  const int nlocal = static_cast<int>(node.gpus.size());
  if (plan.nodes.size() > 1) {
    std::cerr << "cutrain launch: node " << plan.local_node << " of " << plan.nodes.size() << " (" << node.host
              << "): ranks " << node.first_rank << ".." << node.first_rank + nlocal - 1 << " of " << plan.world_size
              << ", GPUs " << join(node.gpus) << "; start the other nodes with:\n";
    for (std::size_t k = 0; k < plan.nodes.size(); ++k)
      if (static_cast<int>(k) != plan.local_node)
        std::cerr << "  on " << plan.nodes[k].host << ": " << command_for_node(a, master_addr, static_cast<int>(k))
                  << "\n";
  }
  return start_and_wait(a, node.first_rank, nlocal, plan.world_size, master_addr, cvd);
}

}  // namespace

CLI::App* setup_launch_command(CLI::App& parent, int& exit_code) {
  auto* a = new LaunchArgs;
  CLI::App* sub = parent.add_subcommand(
      "launch", "Start this node's processes (one per GPU) with torchrun's variables; the deepspeed launcher's flags");
  sub->add_option("--num_gpus,--num_accelerators", a->num_gpus,
                  "Processes per node (default: every GPU of this machine, or every slot of each host)");
  sub->add_option("--num_nodes", a->num_nodes, "Use the first N hosts of the hostfile (after --include/--exclude)");
  sub->add_option("-H,--hostfile", a->hostfile, "DeepSpeed hostfile: `hostname slots=N` lines, # comments");
  sub->add_option("-i,--include", a->include, "Only these hosts/GPUs: host1:0,1@host2 (DeepSpeed's syntax)");
  sub->add_option("-e,--exclude", a->exclude, "All but these hosts/GPUs: host1:0,1@host2 (DeepSpeed's syntax)");
  sub->add_option("--node_rank", a->node_rank,
                  "Which node of the plan this machine is (default: found by host name, or localhost)");
  sub->add_option("--master_addr", a->master_addr,
                  "Rendezvous address (default: 127.0.0.1 on one node, else the first host)");
  sub->add_option("--master_port", a->master_port, "Rendezvous port")->capture_default_str();
  sub->add_option("--backend", a->backend,
                  "nccl: one process per GPU (every GPU run); host: --num_procs processes for --device cpu over the "
                  "shared-memory host communicator (a test and development backend)")
      ->check(CLI::IsMember({"nccl", "host"}))
      ->capture_default_str();
  sub->add_option("--num_procs", a->num_procs, "--backend host: processes to start on this machine");
  sub->add_option("command", a->command, "Program and arguments (after --)")->required();
  sub->callback([a, &exit_code] { exit_code = run_launch(*a); });
  return sub;
}

}  // namespace cutrain::tools
