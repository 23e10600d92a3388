// trainer/signals.h — what SIGINT / SIGTERM do, by phase.
//
// Start-up (the libraries' static initializers before main: the handlers are installed from the
// executable's .preinit_array; then config, rendezvous, model build, checkpoint load) has no step
// boundary to stop at,
// so a signal there ends the process at once: "titan-train: interrupted during start-up by
// SIGTERM" on stderr and exit status 128 + signal (143 for SIGTERM, 130 for SIGINT), as the
// shell reports a process killed by it. Inside the training loop a signal only sets a flag: the
// step finishes, a checkpoint is saved if configured, and the run exits 0. A second signal in
// the loop exits at once with 128 + signal.
#pragma once

namespace titan::trainer {

// Installs the SIGINT/SIGTERM handlers, in the start-up phase.
void install_stop_handlers();
// The training loop begins (true) or has ended (false): signals stop at a step boundary.
void set_stop_at_step_boundary(bool in_training_loop);
bool stop_requested();
int stop_signal();  // the signal that asked to stop, 0 if none

}  // namespace titan::trainer
