// launcher/signal_pipe.h — titan-run's signals as bytes on a self-pipe: the handler only writes
// the signal number, and the supervisor's poll loop reads it (supervisor.cpp), so nothing but
// write(2) runs in signal context.
#pragma once

#include <signal.h>

namespace titan::launcher {

// The signals titan-run handles while a job runs (a rank resets them to the default after fork).
inline constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

// The read end of the pipe (-1 outside a SignalScope).
int signal_pipe_read_fd();

// Installs the self-pipe handlers (and ignores SIGPIPE: a closed reader must not kill titan-run)
// for its lifetime, then restores the previous ones.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction previous_[sizeof(kHandledSignals) / sizeof(kHandledSignals[0])];
  struct sigaction previous_pipe_;
};

}  // namespace titan::launcher
