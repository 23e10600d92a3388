// launcher/world.cpp — see world.h.
#include "launcher/world.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace titan::launcher {
namespace {

constexpr int kDefaultMasterPort = 29500;  // torchrun's default

std::runtime_error env_error(const std::string& message) {
  return std::runtime_error("bad distributed environment: " + message);
}

// Parses the whole string as a base-10 int; names the variable on failure.
int parse_int(const std::string& name, const std::string& value) {
  const char* begin = value.c_str();
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(begin, &end, 10);
  bool ok = !value.empty() && end != begin && *end == '\0' && errno == 0 && v >= INT_MIN &&
            v <= INT_MAX;
  if (!ok) {
    throw env_error(name + "='" + value + "' is not an integer");
  }
  return static_cast<int>(v);
}

std::optional<int> get_int(const EnvLookup& lookup, const std::string& name) {
  auto value = lookup(name);
  if (!value) return std::nullopt;
  return parse_int(name, *value);
}

std::string show(const std::string& name, int value) {
  return name + "=" + std::to_string(value);
}

// Checks shared by both sources; every message carries the values involved.
void validate(const WorldInfo& w, const std::string& rank_var, const std::string& world_var,
              const std::string& local_rank_var, const std::string& local_world_var) {
  if (w.world_size < 1) {
    throw env_error(show(world_var, w.world_size) + " must be >= 1");
  }
  if (w.rank < 0 || w.rank >= w.world_size) {
    throw env_error(show(rank_var, w.rank) + " must be in [0, " + world_var + ") with " +
                    show(world_var, w.world_size));
  }
  if (w.local_world_size < 1 || w.local_world_size > w.world_size) {
    throw env_error(show(local_world_var, w.local_world_size) + " must be in [1, " +
                    std::to_string(w.world_size) + "] (" + show(world_var, w.world_size) + ")");
  }
  if (w.local_rank < 0 || w.local_rank >= w.local_world_size) {
    throw env_error(show(local_rank_var, w.local_rank) + " must be in [0, " +
                    std::to_string(w.local_world_size) + ") (" +
                    show(local_world_var, w.local_world_size) + ")");
  }
  if (w.group_rank < 0) {
    throw env_error(show("GROUP_RANK", w.group_rank) + " must be >= 0");
  }
  if (w.master_port < 0 || w.master_port > 65535) {
    throw env_error(show("MASTER_PORT", w.master_port) + " must be in [0, 65535]");
  }
  if (w.master_addr.empty()) {
    throw env_error("MASTER_ADDR is empty");
  }
}

WorldInfo world_from_torchrun(const EnvLookup& lookup) {
  WorldInfo w;
  w.from_env = true;
  auto rank = get_int(lookup, "RANK");
  auto world = get_int(lookup, "WORLD_SIZE");
  if (!rank) throw env_error("WORLD_SIZE is set but RANK is not");
  if (!world) throw env_error("RANK is set but WORLD_SIZE is not");
  w.rank = *rank;
  w.world_size = *world;
  // Launchers other than torchrun sometimes set only RANK/WORLD_SIZE: assume one node then.
  w.local_world_size = get_int(lookup, "LOCAL_WORLD_SIZE").value_or(w.world_size);
  w.local_rank = get_int(lookup, "LOCAL_RANK").value_or(w.rank % std::max(1, w.local_world_size));
  w.group_rank =
      get_int(lookup, "GROUP_RANK").value_or(w.rank / std::max(1, w.local_world_size));
  w.master_port = get_int(lookup, "MASTER_PORT").value_or(kDefaultMasterPort);
  if (auto addr = lookup("MASTER_ADDR")) {
    w.master_addr = *addr;
  } else if (w.local_world_size < w.world_size) {
    // Guessing localhost for a multi-node job would hang every rank but rank 0's node.
    throw env_error("MASTER_ADDR is not set but the job spans several nodes (" +
                    show("WORLD_SIZE", w.world_size) + ", " +
                    show("LOCAL_WORLD_SIZE", w.local_world_size) +
                    "): set it to the address of rank 0's node");
  }
  validate(w, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  return w;
}

WorldInfo world_from_slurm(const EnvLookup& lookup) {
  WorldInfo w;
  w.from_env = true;
  w.rank = *get_int(lookup, "SLURM_PROCID");
  auto ntasks = get_int(lookup, "SLURM_NTASKS");
  if (!ntasks) ntasks = get_int(lookup, "SLURM_NPROCS");
  if (!ntasks) throw env_error("SLURM_PROCID is set but SLURM_NTASKS is not");
  w.world_size = *ntasks;
  w.group_rank = get_int(lookup, "SLURM_NODEID").value_or(0);
  if (auto per_node = get_int(lookup, "SLURM_NTASKS_PER_NODE")) {
    w.local_world_size = *per_node;
  } else if (auto tasks = lookup("SLURM_TASKS_PER_NODE")) {
    w.local_world_size = slurm_tasks_on_node(*tasks, w.group_rank);
  } else {
    w.local_world_size = w.world_size;
  }
  w.local_rank = get_int(lookup, "SLURM_LOCALID").value_or(w.rank % std::max(1, w.local_world_size));
  w.master_port = get_int(lookup, "MASTER_PORT").value_or(kDefaultMasterPort);
  if (auto addr = lookup("MASTER_ADDR")) {
    w.master_addr = *addr;
  } else {
    auto nodelist = lookup("SLURM_JOB_NODELIST");
    if (!nodelist) nodelist = lookup("SLURM_NODELIST");
    if (nodelist) {
      auto hosts = expand_slurm_nodelist(*nodelist);
      if (hosts.empty()) throw env_error("SLURM_NODELIST='" + *nodelist + "' names no host");
      w.master_addr = hosts.front();
    } else if (w.local_world_size < w.world_size) {
      throw env_error("neither MASTER_ADDR nor SLURM_NODELIST is set for a multi-node Slurm job");
    }
  }
  validate(w, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
  return w;
}

// More hosts than any cluster has: a nodelist that expands beyond this is refused (it would
// take minutes and gigabytes to expand, for the first host only).
constexpr size_t kMaxSlurmHosts = size_t{1} << 17;  // 131,072

std::runtime_error too_many_hosts(const std::string& nodelist) {
  return std::runtime_error("Slurm nodelist '" + nodelist.substr(0, 80) + (nodelist.size() > 80 ? "..." : "") +
                            "' expands to more than " + std::to_string(kMaxSlurmHosts) +
                            " hosts, the limit titan accepts");
}

// Splits at commas that are not inside brackets.
std::vector<std::string> split_top_level(const std::string& s, const std::string& whole) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) {
      throw std::runtime_error("malformed Slurm nodelist '" + whole + "': unbalanced brackets");
    }
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (depth != 0) {
    throw std::runtime_error("malformed Slurm nodelist '" + whole + "': unclosed '['");
  }
  parts.push_back(current);
  return parts;
}

// "01-04,07" -> {"01","02","03","04","07"}.
std::vector<std::string> expand_ranges(const std::string& body, const std::string& whole) {
  std::vector<std::string> out;
  std::stringstream ss(body);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto bad = [&] {
      return std::runtime_error("malformed Slurm nodelist '" + whole + "': bad range '" + item +
                                "'");
    };
    if (item.empty()) throw bad();
    auto dash = item.find('-');
    std::string lo = item.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(lo) || !digits(hi)) throw bad();
    long a = std::stol(lo), b = std::stol(hi);
    if (b < a) throw bad();
    // Counted before any name is made: "n[0-999999999]" must fail here, not after 10^9 strings.
    if (static_cast<size_t>(b - a) + 1 + out.size() > kMaxSlurmHosts) throw too_many_hosts(whole);
    size_t width = lo.size();
    for (long v = a; v <= b; ++v) {
      std::string n = std::to_string(v);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      out.push_back(n);
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist) {
  std::vector<std::string> hosts;
  for (const std::string& part : split_top_level(nodelist, nodelist)) {
    if (part.empty()) continue;
    // Cartesian product over the bracket groups of one name, left to right.
    std::vector<std::string> names = {""};
    size_t pos = 0;
    while (pos < part.size()) {
      size_t open = part.find('[', pos);
      std::string literal = part.substr(pos, open == std::string::npos ? std::string::npos
                                                                       : open - pos);
      for (auto& n : names) n += literal;
      if (open == std::string::npos) break;
      size_t close = part.find(']', open);
      auto values = expand_ranges(part.substr(open + 1, close - open - 1), nodelist);
      if (names.size() * values.size() + hosts.size() > kMaxSlurmHosts) throw too_many_hosts(nodelist);
      std::vector<std::string> next;
      next.reserve(names.size() * values.size());
      for (const auto& n : names) {
        for (const auto& v : values) next.push_back(n + v);
      }
      names = std::move(next);
      pos = close + 1;
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
  }
  return hosts;
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node_index) {
  int node = 0;
  std::stringstream ss(tasks_per_node);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto paren = item.find('(');
    int count = parse_int("SLURM_TASKS_PER_NODE", item.substr(0, paren));
    int repeat = 1;
    if (paren != std::string::npos) {
      // "(x3)"
      if (item.size() < paren + 4 || item[paren + 1] != 'x' || item.back() != ')') {
        throw env_error("SLURM_TASKS_PER_NODE='" + tasks_per_node + "' is malformed at '" +
                        item + "'");
      }
      repeat = parse_int("SLURM_TASKS_PER_NODE",
                         item.substr(paren + 2, item.size() - paren - 3));
    }
    if (node_index < node + repeat) return count;
    node += repeat;
  }
  throw env_error("SLURM_TASKS_PER_NODE='" + tasks_per_node + "' lists " +
                  std::to_string(node) + " nodes but SLURM_NODEID=" +
                  std::to_string(node_index));
}

WorldInfo world_from_env(const EnvLookup& lookup) {
  if (lookup("RANK") || lookup("WORLD_SIZE")) return world_from_torchrun(lookup);
  if (lookup("SLURM_PROCID")) return world_from_slurm(lookup);
  WorldInfo w;  // single process
  if (auto addr = lookup("MASTER_ADDR")) w.master_addr = *addr;
  w.master_port = get_int(lookup, "MASTER_PORT").value_or(kDefaultMasterPort);
  validate(w, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  return w;
}

WorldInfo world_from_env() {
  return world_from_env([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

std::string describe(const WorldInfo& w) {
  std::ostringstream os;
  os << "rank " << w.rank << "/" << w.world_size << " (local " << w.local_rank << "/"
     << w.local_world_size << ", node " << w.group_rank << ") master " << w.master_addr << ":"
     << w.master_port << (w.from_env ? " [from environment]" : " [single-process defaults]");
  return os.str();
}

}  // namespace titan::launcher
