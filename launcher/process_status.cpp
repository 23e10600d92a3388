// launcher/process_status.cpp — see process_status.h.
#include "launcher/process_status.h"

#include <signal.h>
#include <sys/wait.h>

#include <sstream>

namespace titan::launcher {

const char* signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "unknown signal";
  }
}

std::string describe_status(int status) {
  std::ostringstream os;
  if (WIFEXITED(status)) {
    os << "exited with code " << WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    os << "was killed by signal " << WTERMSIG(status) << " (" << signal_name(WTERMSIG(status))
       << ")";
    if (WCOREDUMP(status)) os << ", core dumped";
  } else {
    os << "ended with wait status " << status;
  }
  return os.str();
}

int exit_code_for(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

}  // namespace titan::launcher
