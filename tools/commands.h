// @brief The subcommands of the `cutrain` program, one file each (tools/<name>_command.cpp). Each
// setup function adds its subcommand (flags and a callback) to `parent` and returns it; the
// callback stores the process exit code in `exit_code`, errors are thrown as cutrain::Error and
// reported by main. The list of commands, and which one is the default, is the table in
// tools/main.cpp.
#pragma once

#include <CLI/CLI.hpp>

namespace cutrain::tools {

using CommandSetup = CLI::App* (*)(CLI::App& parent, int& exit_code);

CLI::App* setup_analyze_data_command(CLI::App& parent, int& exit_code);
CLI::App* setup_check_config_command(CLI::App& parent, int& exit_code);
CLI::App* setup_checkpoint_bench_command(CLI::App& parent, int& exit_code);
CLI::App* setup_comm_check_command(CLI::App& parent, int& exit_code);
CLI::App* setup_file_access_command(CLI::App& parent, int& exit_code);
CLI::App* setup_info_command(CLI::App& parent, int& exit_code);
CLI::App* setup_io_bench_command(CLI::App& parent, int& exit_code);
CLI::App* setup_launch_command(CLI::App& parent, int& exit_code);
CLI::App* setup_nvme_tune_command(CLI::App& parent, int& exit_code);
CLI::App* setup_offload_bench_command(CLI::App& parent, int& exit_code);
CLI::App* setup_plan_command(CLI::App& parent, int& exit_code);
CLI::App* setup_prepare_data_command(CLI::App& parent, int& exit_code);
CLI::App* setup_train_command(CLI::App& parent, int& exit_code);

}  // namespace cutrain::tools
