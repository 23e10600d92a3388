// launcher/process_status.h — how titan-run names what happened to a process: signal names,
// wait statuses in words, and the exit code a status stands for.
#pragma once

#include <string>

namespace titan::launcher {

const char* signal_name(int sig);          // "SIGKILL", ...; "unknown signal"
std::string describe_status(int status);   // "exited with code 1", "was killed by signal 9 (SIGKILL)"
int exit_code_for(int status);             // the code, or 128 + signal
bool succeeded(int status);                // exited with code 0

}  // namespace titan::launcher
