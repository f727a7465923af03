#include "runtime/comm/launch_plan.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "runtime/error.h"

namespace cutrain::comm {

namespace {
std::string trim(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// A non-negative decimal integer, or -1.
long parse_count(const std::string& s) {
  if (s.empty() || s.size() > 9) return -1;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  return std::stol(s);
}

std::string join_hosts(const std::vector<HostSlots>& hosts) {
  std::string out;
  for (const auto& h : hosts) {
    if (!out.empty()) out += ", ";
    out += h.host;
  }
  return out.empty() ? "none" : out;
}

std::string join_slots(const std::vector<int>& slots) {
  std::string out;
  for (int s : slots) {
    if (!out.empty()) out += ',';
    out += std::to_string(s);
  }
  return out;
}

const HostSlots* find_host(const std::vector<HostSlots>& pool, const std::string& host) {
  for (const auto& h : pool)
    if (h.host == host) return &h;
  return nullptr;
}

bool same_host(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  if (a == b) return true;
  auto shortname = [](const std::string& s) { return s.substr(0, s.find('.')); };
  return shortname(a) == shortname(b);
}
}  // namespace

std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& origin) {
  std::vector<HostSlots> hosts;
  std::istringstream in(text);
  std::string raw;
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    const std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    const std::string where = origin + ":" + std::to_string(line_no);
    std::istringstream words(line);
    std::string host, slots, extra;
    words >> host >> slots >> extra;
    CUTRAIN_CHECK(!slots.empty() && extra.empty() && slots.rfind("slots=", 0) == 0, where,
                  ": expected `hostname slots=N` (DeepSpeed's hostfile format), found '", line, "'");
    const long n = parse_count(slots.substr(6));
    CUTRAIN_CHECK(n >= 1, where, ": expected slots=N with N a whole number >= 1, found '", slots, "'");
    CUTRAIN_CHECK(!find_host(hosts, host), where, ": expected each host once, found '", host, "' again");
    HostSlots h{host, {}};
    for (int i = 0; i < n; ++i) h.slots.push_back(i);
    hosts.push_back(std::move(h));
  }
  CUTRAIN_CHECK(!hosts.empty(), origin, ": expected at least one `hostname slots=N` line, found none");
  return hosts;
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream f(path);
  CUTRAIN_CHECK(f.good(), "--hostfile ", path, ": expected a readable hostfile (`hostname slots=N` lines), found ",
                "no such file or no permission to read it");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_hostfile(ss.str(), path);
}

std::vector<HostSlots> filter_hosts(const std::vector<HostSlots>& pool, const std::string& include,
                                    const std::string& exclude, const std::string& pool_origin) {
  CUTRAIN_CHECK(include.empty() || exclude.empty(), "--include '", include, "' and --exclude '", exclude,
                "': expected at most one of them (DeepSpeed's launcher takes one filter), found both");
  if (include.empty() && exclude.empty()) return pool;
  const bool inc = !include.empty();
  const std::string flag = inc ? "--include" : "--exclude";
  const std::string& spec = inc ? include : exclude;
  // Included: the slots chosen per host. Excluded: start from the pool and remove.
  std::vector<HostSlots> chosen;
  if (!inc) chosen = pool;
  std::stringstream parts(spec);
  std::string node;
  while (std::getline(parts, node, '@')) {
    CUTRAIN_CHECK(!node.empty(), flag, " '", spec, "': expected HOST[:SLOT[,SLOT...]] between '@'s, found an empty one");
    const auto colon = node.find(':');
    const std::string host = node.substr(0, colon);
    const HostSlots* have = find_host(pool, host);
    CUTRAIN_CHECK(have, flag, " '", spec, "': expected a host of ", pool_origin, " (", join_hosts(pool), "), found '",
                  host, "'");
    std::vector<int> slots;
    if (colon == std::string::npos) {
      slots = have->slots;
    } else {
      std::stringstream ss(node.substr(colon + 1));
      std::string one;
      while (std::getline(ss, one, ',')) {
        const long s = parse_count(one);
        CUTRAIN_CHECK(s >= 0, flag, " '", spec, "': expected slot numbers after '", host, ":', found '", one, "'");
        CUTRAIN_CHECK(std::find(have->slots.begin(), have->slots.end(), s) != have->slots.end(), flag, " '", spec,
                      "': expected a slot of ", host, " (", pool_origin, " gives it ", join_slots(have->slots),
                      "), found slot ", s);
        slots.push_back(static_cast<int>(s));
      }
      CUTRAIN_CHECK(!slots.empty(), flag, " '", spec, "': expected slot numbers after '", host, ":', found none");
    }
    auto it = std::find_if(chosen.begin(), chosen.end(), [&](const HostSlots& h) { return h.host == host; });
    if (inc) {
      if (it == chosen.end()) it = chosen.insert(chosen.end(), HostSlots{host, {}});
      it->slots.insert(it->slots.end(), slots.begin(), slots.end());
    } else if (it != chosen.end()) {
      auto& v = it->slots;
      v.erase(std::remove_if(v.begin(), v.end(),
                             [&](int s) { return std::find(slots.begin(), slots.end(), s) != slots.end(); }),
              v.end());
    }
  }
  // The pool's order, slots ascending and once each, hosts without slots dropped.
  std::vector<HostSlots> out;
  for (const auto& h : pool) {
    const HostSlots* c = find_host(chosen, h.host);
    if (!c || c->slots.empty()) continue;
    HostSlots k = *c;
    std::sort(k.slots.begin(), k.slots.end());
    k.slots.erase(std::unique(k.slots.begin(), k.slots.end()), k.slots.end());
    out.push_back(std::move(k));
  }
  CUTRAIN_CHECK(!out.empty(), flag, " '", spec, "': expected at least one GPU left to launch on, found none");
  return out;
}

LaunchPlan make_launch_plan(const LaunchRequest& r) {
  std::vector<HostSlots> pool;
  std::string origin;
  if (r.hostfile.empty()) {
    const int n = r.num_gpus > 0 ? r.num_gpus : std::max(1, r.local_gpus);
    CUTRAIN_CHECK(n <= 1024, "--num_gpus: expected at most 1024 processes, found ", n);
    pool.push_back({"localhost", {}});
    for (int i = 0; i < n; ++i) pool[0].slots.push_back(i);
    origin = "this machine without --hostfile";
  } else {
    pool = read_hostfile(r.hostfile);
    origin = "--hostfile " + r.hostfile;
  }
  std::vector<HostSlots> hosts = filter_hosts(pool, r.include, r.exclude, origin);

  CUTRAIN_CHECK(r.num_nodes == -1 || r.num_nodes >= 1, "--num_nodes: expected a count >= 1, found ", r.num_nodes);
  if (r.num_nodes > 0) {
    CUTRAIN_CHECK(static_cast<std::size_t>(r.num_nodes) <= hosts.size(), "--num_nodes ", r.num_nodes,
                  ": expected at most the ", hosts.size(), " host(s) of ", origin, " after the filter (",
                  join_hosts(hosts), "), found ", r.num_nodes, r.hostfile.empty() ? " (several nodes need --hostfile)" : "");
    hosts.resize(static_cast<std::size_t>(r.num_nodes));
  }
  CUTRAIN_CHECK(r.num_gpus == -1 || r.num_gpus >= 1, "--num_gpus: expected a count >= 1, found ", r.num_gpus);
  if (r.num_gpus > 0 && !r.hostfile.empty())
    for (auto& h : hosts) {
      CUTRAIN_CHECK(static_cast<std::size_t>(r.num_gpus) <= h.slots.size(), "--num_gpus ", r.num_gpus,
                    ": expected at most the slots of each host, found ", h.host, " with ", h.slots.size(), " (",
                    join_slots(h.slots), ") in ", origin,
                    r.include.empty() && r.exclude.empty() ? "" : " after the filter");
      h.slots.resize(static_cast<std::size_t>(r.num_gpus));
    }

  LaunchPlan plan;
  for (const auto& h : hosts) {
    plan.nodes.push_back({h.host, h.slots, plan.world_size});
    plan.world_size += static_cast<int>(h.slots.size());
  }
  if (r.node_rank >= 0) {
    CUTRAIN_CHECK(static_cast<std::size_t>(r.node_rank) < plan.nodes.size(), "--node_rank ", r.node_rank,
                  ": expected a node index below ", plan.nodes.size(), " (", join_hosts(hosts), "), found ", r.node_rank);
    plan.local_node = r.node_rank;
    return plan;
  }
  int match = -1;
  for (std::size_t i = 0; i < plan.nodes.size() && match < 0; ++i)
    if (same_host(plan.nodes[i].host, r.this_host)) match = static_cast<int>(i);
  for (std::size_t i = 0; i < plan.nodes.size() && match < 0; ++i)
    if (plan.nodes[i].host == "localhost" || plan.nodes[i].host == "127.0.0.1") match = static_cast<int>(i);
  CUTRAIN_CHECK(match >= 0, origin, ": expected this machine ('", r.this_host, "') among the hosts to launch on (",
                join_hosts(hosts), "), found it in none: run `cutrain launch` on one of them, or pass --node_rank");
  plan.local_node = match;
  return plan;
}

}  // namespace cutrain::comm
