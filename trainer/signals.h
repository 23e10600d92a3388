// trainer/signals.h — Ctrl-C / SIGTERM stop the run at the next step boundary.
#pragma once

namespace titan::trainer {

// Installs SIGINT/SIGTERM handlers that only set a flag; a second signal exits immediately.
void install_stop_handlers();
bool stop_requested();
int stop_signal();  // the signal that asked to stop, 0 if none

}  // namespace titan::trainer
