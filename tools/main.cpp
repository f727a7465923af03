// The `cutrain` program: one table of subcommands, one of them the default (the main job).
#include <cstdio>
#include <exception>
#include <iostream>

#include "runtime/error.h"
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
    {"check-config", setup_check_config_command, false},
    {"checkpoint-bench", setup_checkpoint_bench_command, false},
    {"comm-check", setup_comm_check_command, false},
    {"file-access", setup_file_access_command, false},
    {"info", setup_info_command, false},
    {"io-bench", setup_io_bench_command, false},
    {"launch", setup_launch_command, false},
    {"nvme-tune", setup_nvme_tune_command, false},
    {"offload-bench", setup_offload_bench_command, false},
    {"prepare-data", setup_prepare_data_command, false},
    {"train", setup_train_command, true},
};

const Command& default_command() {
  for (const Command& c : kCommands)
    if (c.is_default) return c;
  return kCommands[0];
}

}  // namespace
}  // namespace cutrain::tools

int main(int argc, char** argv) {
  using namespace cutrain::tools;
  CLI::App app{"cutrain: a hand-written CUDA training runtime (BF16 layouts, offload, NVMe I/O, NCCL)"};
  app.require_subcommand(0, 1);
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
    std::cerr << "cutrain: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "cutrain: error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}
