// `cutrain launch --num_gpus N -- PROGRAM ARGS...`: one process per local GPU with torchrun's
// variables (the `deepspeed --num_gpus` equivalent). If one rank fails, the others are stopped and
// the failing rank and its exit status are reported.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tools/commands.h"

namespace cutrain::tools {
namespace {

struct LaunchArgs {
  int num_gpus = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::vector<std::string> command;
};

int run_launch(const LaunchArgs& a) {
  CUTRAIN_CHECK(a.num_gpus >= 1 && a.num_gpus <= 1024, "--num_gpus must be in [1, 1024], got ", a.num_gpus);
  CUTRAIN_CHECK(!a.command.empty(), "nothing to launch: give the program after `--`");
  std::vector<pid_t> pids;
  for (int r = 0; r < a.num_gpus; ++r) {
    pid_t pid = ::fork();
    CUTRAIN_CHECK(pid >= 0, "fork failed: ", std::strerror(errno));
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(a.num_gpus).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(a.num_gpus).c_str(), 1);
      ::setenv("MASTER_ADDR", a.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(a.master_port).c_str(), 1);
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
        rank = static_cast<int>(i);
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

}  // namespace

CLI::App* setup_launch_command(CLI::App& parent, int& exit_code) {
  auto* a = new LaunchArgs;
  CLI::App* sub = parent.add_subcommand("launch", "Start one process per local GPU with torchrun's environment variables");
  sub->add_option("--num_gpus", a->num_gpus, "Processes to start (one per GPU)")->capture_default_str();
  sub->add_option("--master_addr", a->master_addr, "Rendezvous address")->capture_default_str();
  sub->add_option("--master_port", a->master_port, "Rendezvous port")->capture_default_str();
  sub->add_option("command", a->command, "Program and arguments (after --)")->required();
  sub->callback([a, &exit_code] { exit_code = run_launch(*a); });
  return sub;
}

}  // namespace cutrain::tools
