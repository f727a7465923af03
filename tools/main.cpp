// The `cutrain` program: one table of subcommands, one of them the default (the main job).
// stdout is line-buffered (a `| tee log` sees each line as it is printed); an error prints its
// message, and its source location only with CUTRAIN_DEBUG=1.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "runtime/error.h"
#include "tools/build_info.h"
#include "tools/commands.h"

namespace cutrain::tools {
namespace {

struct Command {
  const char* name;
  CommandSetup setup;
  bool is_default;  // what `cutrain` runs, with its defaults, when no subcommand is given
};

// In the order `cutrain --help` lists them.
constexpr Command kCommands[] = {
    {"analyze-data", setup_analyze_data_command, false},
    {"check-config", setup_check_config_command, false},
    {"checkpoint-bench", setup_checkpoint_bench_command, false},
    {"comm-check", setup_comm_check_command, false},
    {"file-access", setup_file_access_command, false},
    {"info", setup_info_command, false},
    {"io-bench", setup_io_bench_command, false},
    {"launch", setup_launch_command, false},
    {"nvme-tune", setup_nvme_tune_command, false},
    {"offload-bench", setup_offload_bench_command, false},
    {"plan", setup_plan_command, false},
    {"prepare-data", setup_prepare_data_command, false},
    {"train", setup_train_command, true},
};

const Command& default_command() {
  for (const Command& c : kCommands)
    if (c.is_default) return c;
  return kCommands[0];
}

// "cutrain 0.1.0 (abc1234, CUDA 12.4, sm_90)": the CUDA runtime this binary links (no device needed).
std::string version_text() {
  int rt = 0;
  std::string cuda = cudaRuntimeGetVersion(&rt) == cudaSuccess
                         ? std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10)
                         : std::string("unknown");
  return std::string("cutrain ") + CUTRAIN_VERSION + " (" + CUTRAIN_GIT_COMMIT + ", CUDA " + cuda + ", " +
         CUTRAIN_CUDA_ARCHS + ")";
}

// CUTRAIN_DEBUG set to anything but "" or "0".
bool debug_mode() {
  const char* v = std::getenv("CUTRAIN_DEBUG");
  return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace
}  // namespace cutrain::tools

int main(int argc, char** argv) {
  using namespace cutrain::tools;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"cutrain: a hand-written CUDA training runtime (BF16 layouts, offload, NVMe I/O, NCCL)\n"
               "CUTRAIN_DEBUG=1: errors also name the source location that raised them"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", version_text(), "Print the version, commit, CUDA runtime and architectures");
  int exit_code = 0;
  CLI::App* def = nullptr;
  for (const Command& c : kCommands) {
    CLI::App* sub = c.setup(app, exit_code);
    if (&c == &default_command()) def = sub;
  }
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) {
      // No subcommand: run the default (main) job with its defaults.
      std::cout << "(no subcommand given: running `cutrain " << default_command().name << "`; see --help)\n";
      def->parse(std::vector<std::string>{});
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const cutrain::Error& e) {
    std::fflush(stdout);
    std::cerr << "cutrain: error: " << e.what();
    if (debug_mode()) std::cerr << " [" << e.location() << "]";
    std::cerr << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "cutrain: error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}
