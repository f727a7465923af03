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
  // The launchers differ only in their variable names; the first whose rank and size are set wins.
  struct Scheme {
    const char *source, *rank, *world, *local_rank, *local_world;
  };
  static constexpr Scheme kSchemes[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  for (const Scheme& sc : kSchemes) {
    if (!get(sc.rank) || !get(sc.world)) continue;
    e.source = sc.source;
    e.world_size = parse_int(get, sc.world, 1, kMaxWorld);
    e.rank = parse_int(get, sc.rank, 0, e.world_size - 1);
    e.local_rank = parse_int_or(get, sc.local_rank, e.rank, 0, e.world_size - 1);
    e.local_world_size = parse_int_or(get, sc.local_world, e.world_size, 1, e.world_size);
    break;
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
