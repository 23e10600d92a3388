// launcher/supervisor.h — titan-run's engine for one node: starts the local ranks (each in a
// process group of its own, with the rendezvous environment torchrun sets), relays their output
// with rank prefixes, forwards signals, stops the whole job when one rank fails and reports which
// (Notes [Rank process groups] and [Launcher watchdog pipe] in supervisor.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launcher/launcher.h"

namespace titan::launcher {

// The variable that hands every rank the read end of the watchdog pipe, as "<fd>:<inode>"
// (written by the supervisor, read by watch_launcher).
inline constexpr const char* kWatchdogFdVariable = "TITAN_RUN_WATCHDOG_FD";

// How one attempt of the job ended (launcher/restarts.h decides what follows).
struct AttemptResult {
  int exit_code = 0;             // titan-run's exit code for this attempt alone
  bool stopped_by_signal = false;  // titan-run itself was signalled: never restarted
  // The first rank that failed on its own (exit_code != 0 and not stopped_by_signal).
  int failed_rank = -1;
  int failed_node = -1;          // its node (--node-rank); -1: none
  int64_t failed_at_ms = 0;      // when this node saw it (Unix ms): the earliest failure is the cause
  std::string failure;           // "exited with code 1", "was killed by signal 9 (SIGKILL)"
  int64_t last_step = -1;        // the last "step: N" any rank of this node printed (-1: none)
  bool stopped_by_peer = false;  // this node's ranks were stopped because another node failed
};

// What else an attempt watches beside its ranks (launcher/node_agreement.h: the other nodes):
// `fds` are polled with the ranks' output; when one is readable `on_readable` says whether every
// local rank must stop now, and why. After it has said so once, the fds are no longer polled.
struct AttemptWatch {
  std::vector<int> fds;
  std::function<std::optional<std::string>()> on_readable;
};

// Runs one attempt of the job `options` describes with the store on `master_port`: the ranks get
// TORCHELASTIC_RESTART_COUNT = `restart_count` (and TORCHELASTIC_MAX_RESTARTS) as torchrun sets
// them. Installs titan-run's signal handling for its duration.
AttemptResult supervise(const LaunchOptions& options, int master_port, int restart_count,
                        const AttemptWatch& watch = {});

}  // namespace titan::launcher
