// @brief Which processes a launch starts where, with DeepSpeed's launcher conventions: a hostfile
// (`hostname slots=N` lines, `#` comments), `--include` / `--exclude` (`host1:0,1@host2`),
// `--num_nodes` (the first N hosts) and `--num_gpus` (the first N slots of each host). The plan
// gives each node its GPUs and its first global rank (hosts in hostfile order, ranks consecutive).
// Every bad input is an error naming the flag or file, what was expected and what was found.
#pragma once

#include <string>
#include <vector>

namespace cutrain::comm {

struct HostSlots {
  std::string host;
  std::vector<int> slots;  // GPU indices on that host, ascending
};

// The hostfile's text: one `hostname slots=N` per line (N >= 1), blank lines and `#` comments
// (whole-line or trailing) ignored, each host once. `origin` (the file's path) starts every message.
std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& origin);
std::vector<HostSlots> read_hostfile(const std::string& path);

// DeepSpeed's resource filter. `include` keeps only the named hosts (a host alone: all its slots;
// `host:0,2`: those slots); `exclude` drops the named hosts or slots. Both at once, a host not in
// `pool` or a slot the host does not have is an error. Hosts left without slots are dropped;
// the pool's host order is kept.
std::vector<HostSlots> filter_hosts(const std::vector<HostSlots>& pool, const std::string& include,
                                    const std::string& exclude, const std::string& pool_origin);

struct LaunchRequest {
  std::string hostfile;        // empty: this machine alone ("localhost")
  std::string include, exclude;
  int num_nodes = -1;          // -1: every host left after the filter
  int num_gpus = -1;           // -1: every slot; without a hostfile: local_gpus
  int local_gpus = 1;          // the GPUs this machine has (used without a hostfile)
  int node_rank = -1;          // -1: the host whose name is this_host (or localhost / 127.0.0.1)
  std::string this_host;       // gethostname()
};

struct NodePlan {
  std::string host;
  std::vector<int> gpus;
  int first_rank = 0;
};

struct LaunchPlan {
  std::vector<NodePlan> nodes;
  int world_size = 0;
  int local_node = 0;  // the node this machine runs
};

LaunchPlan make_launch_plan(const LaunchRequest& r);

}  // namespace cutrain::comm
