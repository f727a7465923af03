// The `cutrain` program: dispatches to the registered subcommands.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>

#include "runtime/error.h"
#include "tools/command_registry.h"

namespace cutrain::tools {
std::vector<Command>& registered_commands() {
  static std::vector<Command> commands;
  return commands;
}
static std::string g_default = "info";
void set_default_command(std::string name) { g_default = std::move(name); }
const std::string& default_command() { return g_default; }
}  // namespace cutrain::tools

int main(int argc, char** argv) {
  using namespace cutrain::tools;
  CLI::App app{"cutrain: a hand-written CUDA training runtime (BF16 layouts, offload, NVMe I/O, NCCL)"};
  app.require_subcommand(0, 1);
  int exit_code = 0;
  auto& cmds = registered_commands();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  for (auto& c : cmds) c.setup(app, exit_code);
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) {
      // No subcommand: run the default (main) job with its defaults.
      CLI::App* def = app.get_subcommand(default_command());
      std::cout << "(no subcommand given: running `cutrain " << default_command() << "`; see --help)\n";
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
