// @brief Subcommands of the `cutrain` program register themselves here, one file each
// (tools/<name>_command.cpp, added to the target by tools/<name>.cmake).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace cutrain::tools {

// `setup` adds the subcommand (its flags and a callback) to `parent`. The callback stores the
// process exit code in `exit_code`; errors are thrown as cutrain::Error and reported by main.
struct Command {
  std::string name;
  std::function<CLI::App*(CLI::App& parent, int& exit_code)> setup;
};

std::vector<Command>& registered_commands();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::function<CLI::App*(CLI::App&, int&)> setup) {
    registered_commands().push_back({std::move(name), std::move(setup)});
  }
};

// The default command when `cutrain` runs without one (the main job).
void set_default_command(std::string name);
const std::string& default_command();

}  // namespace cutrain::tools
