// @brief Who am I in a multi-process job: rank, world size, local rank and the rendezvous
// address, read from torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI
// (OMPI_COMM_WORLD_*) or Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) variables.
#pragma once

#include <functional>
#include <string>

namespace cutrain::comm {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "default";  // "torchrun", "openmpi", "slurm" or "default" (single process)
};

// Reads the variables through `getenv` (injectable for tests). Inconsistent or malformed values
// (rank >= world size, a port that is not a number in [1, 65535]) are errors naming the variable.
LaunchEnv read_launch_env(const std::function<const char*(const char*)>& getenv_fn);
LaunchEnv read_launch_env();

}  // namespace cutrain::comm
