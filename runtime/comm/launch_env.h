// @brief Who am I in a multi-process job: rank, world size, local rank and the rendezvous
// address, read from torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI
// (OMPI_COMM_WORLD_*) or Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) variables.
//
// The rendezvous port. Rank 0 listens on MASTER_PORT, except under torchrun (torch elastic),
// whose agent already serves its own TCPStore there: then rank 0 listens on MASTER_PORT + 1.
// torchrun is recognised by the variables its agent sets for every worker and that neither
// `cutrain launch`, DeepSpeed's launcher, mpirun nor srun set: TORCHELASTIC_RUN_ID,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_USE_AGENT_STORE, GROUP_RANK,
// ROLE_RANK. CUTRAIN_RENDEZVOUS_PORT (the same value on every rank) overrides both choices.
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
  // Where rank 0 listens for the id hand-out; 0 means master_port (an environment built by hand).
  int rendezvous_port = 0;
  // How rendezvous_port was chosen, for messages: "MASTER_PORT", "MASTER_PORT + 1 (...)",
  // "CUTRAIN_RENDEZVOUS_PORT".
  std::string rendezvous_port_from = "MASTER_PORT";
  // The torchrun variable that showed torch elastic's agent (and its store on MASTER_PORT); empty
  // when none is set.
  std::string torchelastic_variable;

  int port() const { return rendezvous_port > 0 ? rendezvous_port : master_port; }
};

// Reads the variables through `getenv` (injectable for tests). Inconsistent or malformed values
// (rank >= world size, a port that is not a number in [1, 65535]) are errors naming the variable.
LaunchEnv read_launch_env(const std::function<const char*(const char*)>& getenv_fn);
LaunchEnv read_launch_env();

// `--local_rank N`, as DeepSpeed's launcher passes it to every process. With LOCAL_RANK also set
// the two must agree (an error naming both values); with LOCAL_RANK unset the flag's value is the
// one to use. Returns the LOCAL_RANK value to export ("" when the environment already has it).
std::string check_local_rank_flag(int flag_value, const std::function<const char*(const char*)>& getenv_fn);
// The same on the process environment: exports LOCAL_RANK when it was unset, so every reader of
// the launch environment (the engine, comm-check) sees the flag's value. For the commands that
// run once per rank (`cutrain train`, `cutrain comm-check`).
void apply_local_rank_flag(int flag_value);

}  // namespace cutrain::comm
