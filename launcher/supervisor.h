// launcher/supervisor.h — titan-run's engine for one node: starts the local ranks (each in a
// process group of its own, with the rendezvous environment torchrun sets), relays their output
// with rank prefixes, forwards signals, stops the whole job when one rank fails and reports which
// (Notes [Rank process groups] and [Launcher watchdog pipe] in supervisor.cpp).
#pragma once

#include "launcher/launcher.h"

namespace titan::launcher {

// The variable that hands every rank the read end of the watchdog pipe, as "<fd>:<inode>"
// (written by the supervisor, read by watch_launcher).
inline constexpr const char* kWatchdogFdVariable = "TITAN_RUN_WATCHDOG_FD";

// Runs the job `options` describes with the store on `master_port`; installs titan-run's signal
// handling for its duration. Returns titan-run's exit code.
int supervise(const LaunchOptions& options, int master_port);

}  // namespace titan::launcher
