// launcher/launch_options.cpp — titan-run's command line: torchrun's flags (dashes or
// underscores), their checks and the usage text. See launcher.h.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "launcher/launcher.h"
#include "util/edit_distance.h"

namespace titan::launcher {
namespace {

// ---------------------------------------------------------------------------------------------
// Command line

struct FlagSpec {
  const char* name;  // canonical spelling, dashes
  bool takes_value;
};

const FlagSpec kFlags[] = {
    {"nproc-per-node", true}, {"nnodes", true},        {"node-rank", true},
    {"master-addr", true},    {"master-port", true},   {"rdzv-endpoint", true},
    {"rdzv-backend", true},   {"rdzv-id", true},       {"local-ranks-filter", true},
    {"kill-grace-seconds", true}, {"max-restarts", true}, {"role", true},
    {"rdzv-conf", true},
    {"tee", true},            {"standalone", false},   {"no-python", false},
    {"help", false},
};

using titan::util::edit_distance;

std::string suggest_flag(const std::string& name) {
  const FlagSpec* best = nullptr;
  size_t best_distance = 4;  // farther than this is not a typo
  for (const auto& f : kFlags) {
    size_t d = edit_distance(name, f.name);
    if (d < best_distance) {
      best_distance = d;
      best = &f;
    }
  }
  return best ? std::string(" (did you mean --") + best->name + "?)" : std::string();
}

int parse_int_flag(const std::string& flag, const std::string& value, int lo, int hi) {
  const char* begin = value.c_str();
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(begin, &end, 10);
  if (value.empty() || end == begin || *end != '\0' || errno != 0 || v < lo || v > hi) {
    throw UsageError("--" + flag + " expects an integer in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "], got '" + value + "'");
  }
  return static_cast<int>(v);
}

double parse_seconds_flag(const std::string& flag, const std::string& value) {
  const char* begin = value.c_str();
  char* end = nullptr;
  double v = std::strtod(begin, &end);
  if (value.empty() || end == begin || *end != '\0' || !(v >= 0) || v > 86400) {
    throw UsageError("--" + flag + " expects seconds in [0, 86400], got '" + value + "'");
  }
  return v;
}

// "join_timeout=S[,key=value...]" as torchrun's --rdzv-conf: join_timeout is how long node 0's
// titan-run waits for every node to join, and after a failure to rejoin (Note [Restarts across
// nodes] in node_agreement.cpp). torchrun's other keys are accepted and have no effect here.
void apply_rdzv_conf(const std::string& value, LaunchOptions& o) {
  std::istringstream in(value);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--rdzv-conf '" + value + "': expected key=value pairs separated by commas, e.g. join_timeout=600");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "join_timeout") {
      o.join_timeout_seconds = parse_seconds_flag("rdzv-conf join_timeout", v);
    } else if (key != "read_timeout" && key != "timeout" && key != "is_host" && key != "last_call_timeout" &&
               key != "close_timeout" && key != "keep_alive_interval" && key != "keep_alive_max_attempt") {
      throw UsageError("--rdzv-conf key '" + key + "' is not one torchrun knows (titan-run uses join_timeout)");
    }
  }
}

// "host:port", "host", "[::1]:port" -> sets master address (and port).
void apply_rdzv_endpoint(const std::string& value, LaunchOptions& o) {
  std::string host = value;
  std::string port;
  if (!value.empty() && value[0] == '[') {
    auto close = value.find(']');
    if (close == std::string::npos) {
      throw UsageError("--rdzv-endpoint '" + value + "' has an unclosed '['");
    }
    host = value.substr(1, close - 1);
    if (close + 1 < value.size()) {
      if (value[close + 1] != ':') throw UsageError("--rdzv-endpoint '" + value + "' is malformed");
      port = value.substr(close + 2);
    }
  } else if (auto colon = value.rfind(':'); colon != std::string::npos) {
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
  }
  if (host.empty()) throw UsageError("--rdzv-endpoint '" + value + "' has no host");
  o.master_addr = host;
  if (!port.empty() || value.back() == ':') {
    o.master_port = parse_int_flag("rdzv-endpoint port", port, 0, 65535);
  }
}

}  // namespace

std::vector<int> parse_rank_list(const std::string& text, const std::string& what) {
  std::vector<int> ranks;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const char* begin = item.c_str();
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(begin, &end, 10);
    if (item.empty() || end == begin || *end != '\0' || errno != 0 || v < 0 || v > INT_MAX) {
      throw UsageError(what + " expects a comma-separated list of local ranks such as '0,1', got '" +
                       text + "'");
    }
    ranks.push_back(static_cast<int>(v));
  }
  if (ranks.empty()) throw UsageError(what + " is empty; give local ranks such as '0,1'");
  return ranks;
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions o;
  bool standalone = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (arg == "-h") {
      o.help = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-') {  // the trainer's command starts here
      o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    if (arg.compare(0, 2, "--") != 0) {
      throw UsageError("unknown flag '" + arg + "' (titan-run's flags are long: --nproc-per-node ...)");
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    std::replace(name.begin(), name.end(), '_', '-');
    const FlagSpec* spec = nullptr;
    for (const auto& f : kFlags) {
      if (name == f.name) spec = &f;
    }
    if (spec == nullptr) {
      throw UsageError("unknown flag '" + arg + "'" + suggest_flag(name));
    }
    if (!spec->takes_value && value) {
      throw UsageError("--" + name + " takes no value, got '" + arg + "'");
    }
    if (spec->takes_value && !value) {
      if (i + 1 >= args.size()) throw UsageError("--" + name + " needs a value");
      value = args[++i];
    }
    if (name == "nproc-per-node") {
      o.nproc_per_node = parse_int_flag(name, *value, 1, 1024);
    } else if (name == "nnodes") {
      if (value->find(':') != std::string::npos) {
        throw UsageError("--nnodes '" + *value +
                         "': elastic ranges are not supported, give one node count");
      }
      o.nnodes = parse_int_flag(name, *value, 1, 100000);
    } else if (name == "node-rank") {
      o.node_rank = parse_int_flag(name, *value, 0, 100000);
    } else if (name == "master-addr") {
      if (value->empty()) throw UsageError("--master-addr is empty");
      o.master_addr = *value;
    } else if (name == "master-port") {
      o.master_port = parse_int_flag(name, *value, 0, 65535);
    } else if (name == "rdzv-endpoint") {
      apply_rdzv_endpoint(*value, o);
    } else if (name == "rdzv-backend") {
      if (*value != "c10d" && *value != "static") {
        throw UsageError("--rdzv-backend '" + *value +
                         "' is not supported (titan-run does static rendezvous: c10d or static)");
      }
    } else if (name == "rdzv-conf") {
      apply_rdzv_conf(*value, o);
    } else if (name == "max-restarts") {
      o.max_restarts = parse_int_flag(name, *value, 0, 1000);
    } else if (name == "local-ranks-filter") {
      o.local_ranks_filter = parse_rank_list(*value, "--local-ranks-filter");
    } else if (name == "kill-grace-seconds") {
      o.kill_grace_seconds = parse_seconds_flag(name, *value);
    } else if (name == "standalone") {
      standalone = true;
    } else if (name == "help") {
      o.help = true;
    }
    // rdzv-id, role, tee, no-python: accepted for torchrun compatibility, no effect here
    // (titan-run always relays both streams and runs the command as given).
  }
  if (o.help) return o;
  if (standalone) {
    if (o.nnodes != 1) {
      throw UsageError("--standalone runs a single node, but --nnodes is " +
                       std::to_string(o.nnodes));
    }
    o.master_addr = "127.0.0.1";
  }
  if (o.node_rank >= o.nnodes) {
    throw UsageError("--node-rank " + std::to_string(o.node_rank) + " must be < --nnodes " +
                     std::to_string(o.nnodes));
  }
  if (o.nnodes > 1 && o.master_port && *o.master_port == 0) {
    throw UsageError("--master-port 0 (pick a free port) works on a single node only: with --nnodes " +
                     std::to_string(o.nnodes) + " every node must be given the same port");
  }
  if (o.local_ranks_filter) {
    for (int local : *o.local_ranks_filter) {
      if (local >= o.nproc_per_node) {
        throw UsageError("--local-ranks-filter names local rank " + std::to_string(local) +
                         " but --nproc-per-node is " + std::to_string(o.nproc_per_node));
      }
    }
  }
  if (o.command.empty()) {
    throw UsageError("no command to run: give it after the flags, e.g. "
                     "titan-run --nproc-per-node 2 -- titan-train --job.config_file FILE");
  }
  return o;
}

std::string launch_usage() {
  return R"(usage: titan-run [flags] [--] COMMAND [ARGS...]

Starts COMMAND once per local rank with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), prefixes every output line with
"[rank N] ", and stops all ranks when one fails. Flags accept dashes or underscores.

  --nproc-per-node N        processes on this node (default 1)
  --nnodes N                number of nodes (default 1); run one titan-run per node
  --node-rank R             this node's index, 0 .. nnodes-1 (default 0)
  --master-addr HOST        address of node 0, where rank 0 serves the store (default 127.0.0.1)
  --master-port P           its port; default: a free port on one node, 29500 on several
  --rdzv-endpoint HOST:PORT same as --master-addr HOST --master-port PORT
  --standalone              single node on 127.0.0.1 with a free port
  --local-ranks-filter L    show output of these local ranks only, e.g. 0,1
                            (default: LOG_RANK from the environment, else all)
  --kill-grace-seconds S    after a failure: SIGTERM, then SIGKILL after S seconds (default 5)
  --max-restarts N          when a rank fails, stop every rank and start the job again, up to
                            N times (TORCHELASTIC_RESTART_COUNT tells the ranks which attempt;
                            titan-train resumes from its last checkpoint). With several nodes
                            node 0's titan-run coordinates: it listens on --master-port and the
                            trainers' store moves to a fresh port each attempt (default 0)
  --rdzv-conf join_timeout=S
                            with --max-restarts and several nodes: how long node 0 waits for
                            every node to join, or rejoin after a failure (default 600)
  --rdzv-backend, --rdzv-id, --role, --tee, --no-python
                            accepted for torchrun compatibility; no effect
  -h, --help                this text

Exit code: 0 when every rank exits 0; else the failing rank's exit code, or 128 + signal.
Bad flags exit with 2.
)";
}


}  // namespace titan::launcher
