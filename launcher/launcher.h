// launcher/launcher.h — titan-run, a torchrun-style launcher: starts one process per local rank
// with torchrun's environment, relays their output with a "[rank N] " prefix, and stops the
// whole job when one rank fails (or the launcher is interrupted).
//
// Plain C++17 + POSIX (no LibTorch), target titan_launcher. Static rendezvous only: every node
// runs its own titan-run with the same --nnodes/--master-addr/--master-port and its own
// --node-rank. --max-restarts N restarts a failed job (Note [In-job restarts] in launcher.cpp;
// across nodes, Note [Restarts across nodes] in node_agreement.cpp); the same ranks, no elastic
// membership.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace titan::launcher {

// A bad command line. titan-run prints the message and exits with kUsageExitCode.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr int kUsageExitCode = 2;
constexpr int kMultiNodeDefaultPort = 29500;  // torchrun's default

// "titan-run: <message>" on stderr in one write(2), so that it never interleaves with the lines
// the relay threads write.
void say(const std::string& message);

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  // Unset: a free port when nnodes == 1, else 29500 (torchrun's default). 0: a free port
  // (single node only: the other nodes could not know it).
  std::optional<int> master_port;
  // Local ranks whose output is shown; unset: LOG_RANK from the environment, else all.
  std::optional<std::vector<int>> local_ranks_filter;
  double kill_grace_seconds = 5.0;  // SIGTERM -> SIGKILL delay when stopping ranks
  int max_restarts = 0;              // attempts after the first that fail (Note [In-job restarts])
  double join_timeout_seconds = 600;  // --rdzv-conf join_timeout: nodes joining / rejoining
  std::vector<std::string> command;  // the trainer's argv (argv[0] looked up in PATH)
  bool help = false;                 // --help: print launch_usage() and exit 0
};

// Parses titan-run's arguments (without argv[0]). Accepts torchrun's spellings: dashes or
// underscores, "--flag value" or "--flag=value". The command starts after "--" or at the first
// argument that is not a flag. Throws UsageError naming the offending flag.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

// "0,1,3" -> {0, 1, 3}; throws UsageError naming `what` on anything else.
std::vector<int> parse_rank_list(const std::string& text, const std::string& what);

std::string launch_usage();

// Binds port 0 on all interfaces and returns the port the kernel chose (then releases it, so a
// rank can bind it: racy in theory, as in torchrun, fine in practice).
int pick_free_port();

// Runs the job to completion, restarting it up to max_restarts times; returns titan-run's exit
// code: 0 when every rank of an attempt exits 0, else the last failing rank's exit code, or 128
// + signal for a rank killed by a signal (or for a signal that stopped the launcher). Throws
// std::runtime_error when a rank cannot be started.
int launch(const LaunchOptions& options);

// Called by a rank process at start (titan-train does): if titan-run started this process's
// tree (TITAN_RUN_WATCHDOG_FD), starts a thread that calls `on_launcher_gone` (e.g. to remove
// temporary files; must not block) and exits the process as soon as titan-run is gone, even
// when it was SIGKILLed and this process is a wrapper's child (Note [Launcher watchdog pipe] in
// launcher.cpp). Returns whether it is watching.
bool watch_launcher(std::function<void()> on_launcher_gone = {});

// main() of titan-run.
int launcher_main(int argc, char** argv);

}  // namespace titan::launcher
