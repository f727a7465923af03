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

// Set by torch elastic's agent (torchrun, python -m torch.distributed.run) for every worker.
constexpr const char* kTorchelasticVariables[] = {"TORCHELASTIC_RUN_ID",      "TORCHELASTIC_RESTART_COUNT",
                                                  "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
                                                  "GROUP_RANK",               "ROLE_RANK"};
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

  for (const char* v : kTorchelasticVariables)
    if (const char* x = get(v); x && *x) {
      e.torchelastic_variable = v;
      break;
    }
  if (const char* p = get("CUTRAIN_RENDEZVOUS_PORT"); p && *p) {
    e.rendezvous_port = parse_int(get, "CUTRAIN_RENDEZVOUS_PORT", 1, 65535);
    e.rendezvous_port_from = "CUTRAIN_RENDEZVOUS_PORT";
  } else if (!e.torchelastic_variable.empty()) {
    CUTRAIN_CHECK(e.master_port < 65535, "environment variable MASTER_PORT=65535: under torchrun (",
                  e.torchelastic_variable, " is set) cutrain's rendezvous uses MASTER_PORT + 1, expected a MASTER_PORT "
                  "below 65535; set CUTRAIN_RENDEZVOUS_PORT to a free port (the same on every rank)");
    e.rendezvous_port = e.master_port + 1;
    e.rendezvous_port_from = "MASTER_PORT + 1 (torchrun's TCPStore listens on MASTER_PORT; " +
                             e.torchelastic_variable + " is set)";
  } else {
    e.rendezvous_port = e.master_port;
    e.rendezvous_port_from = "MASTER_PORT";
  }
  return e;
}

LaunchEnv read_launch_env() {
  return read_launch_env([](const char* n) { return std::getenv(n); });
}

std::string check_local_rank_flag(int flag_value, const std::function<const char*(const char*)>& get) {
  CUTRAIN_CHECK(flag_value >= 0, "--local_rank: expected a local rank >= 0, found ", flag_value);
  const char* env = get("LOCAL_RANK");
  if (!env || !*env) return std::to_string(flag_value);
  const int from_env = parse_int(get, "LOCAL_RANK", 0, 1 << 20);
  CUTRAIN_CHECK(from_env == flag_value, "--local_rank=", flag_value, " disagrees with environment variable LOCAL_RANK=",
                from_env, ": expected the same local rank from both (the launcher sets both; pass one of them)");
  return "";
}

void apply_local_rank_flag(int flag_value) {
  const std::string value = check_local_rank_flag(flag_value, [](const char* n) { return std::getenv(n); });
  if (!value.empty()) ::setenv("LOCAL_RANK", value.c_str(), 1);
}

}  // namespace cutrain::comm
