#include "runtime/comm/launch_env.h"

#include <cstdlib>

#include "runtime/error.h"

namespace cutrain::comm {

namespace {
int parse_int(const std::function<const char*(const char*)>& get, const char* name, int lo, int hi) {
  const char* v = get(name);
  CUTRAIN_CHECK(v && *v, "environment variable ", name, " is not set");
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  CUTRAIN_CHECK(end && *end == '\0', "environment variable ", name, "='", v, "' is not an integer");
  CUTRAIN_CHECK(x >= lo && x <= hi, "environment variable ", name, "=", x, " is out of range [", lo, ", ", hi, "]");
  return static_cast<int>(x);
}
int parse_int_or(const std::function<const char*(const char*)>& get, const char* name, int dflt, int lo, int hi) {
  const char* v = get(name);
  return (v && *v) ? parse_int(get, name, lo, hi) : dflt;
}
}  // namespace

LaunchEnv read_launch_env(const std::function<const char*(const char*)>& get) {
  LaunchEnv e;
  constexpr int kMaxWorld = 1 << 20;
  if (get("RANK") && get("WORLD_SIZE")) {
    e.source = "torchrun";
    e.world_size = parse_int(get, "WORLD_SIZE", 1, kMaxWorld);
    e.rank = parse_int(get, "RANK", 0, e.world_size - 1);
    e.local_rank = parse_int_or(get, "LOCAL_RANK", e.rank, 0, e.world_size - 1);
    e.local_world_size = parse_int_or(get, "LOCAL_WORLD_SIZE", e.world_size, 1, e.world_size);
  } else if (get("OMPI_COMM_WORLD_RANK") && get("OMPI_COMM_WORLD_SIZE")) {
    e.source = "openmpi";
    e.world_size = parse_int(get, "OMPI_COMM_WORLD_SIZE", 1, kMaxWorld);
    e.rank = parse_int(get, "OMPI_COMM_WORLD_RANK", 0, e.world_size - 1);
    e.local_rank = parse_int_or(get, "OMPI_COMM_WORLD_LOCAL_RANK", e.rank, 0, e.world_size - 1);
    e.local_world_size = parse_int_or(get, "OMPI_COMM_WORLD_LOCAL_SIZE", e.world_size, 1, e.world_size);
  } else if (get("SLURM_PROCID") && get("SLURM_NTASKS")) {
    e.source = "slurm";
    e.world_size = parse_int(get, "SLURM_NTASKS", 1, kMaxWorld);
    e.rank = parse_int(get, "SLURM_PROCID", 0, e.world_size - 1);
    e.local_rank = parse_int_or(get, "SLURM_LOCALID", e.rank, 0, e.world_size - 1);
    e.local_world_size = parse_int_or(get, "SLURM_NTASKS_PER_NODE", e.world_size, 1, e.world_size);
  }
  if (const char* a = get("MASTER_ADDR"); a && *a) e.master_addr = a;
  e.master_port = parse_int_or(get, "MASTER_PORT", e.master_port, 1, 65535);
  CUTRAIN_CHECK(e.local_rank < e.local_world_size || e.source == "default",
                "local rank ", e.local_rank, " >= local world size ", e.local_world_size, " (from ", e.source, ")");
  return e;
}

LaunchEnv read_launch_env() {
  return read_launch_env([](const char* n) { return std::getenv(n); });
}

}  // namespace cutrain::comm
