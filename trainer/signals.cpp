#include "trainer/signals.h"

#include <csignal>
#include <unistd.h>

#include "util/atomic_file.h"

namespace titan::trainer {
namespace {
volatile std::sig_atomic_t g_signal = 0;

void on_signal(int sig) {
  if (g_signal != 0) {  // second Ctrl-C: the user really wants out
    // Without leaving a half-written export/snapshot behind (Note [Temp files and signals]).
    util::remove_temp_files_in_flight();
    _exit(128 + sig);
  }
  g_signal = sig;
}
}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool stop_requested() { return g_signal != 0; }
int stop_signal() { return g_signal; }

}  // namespace titan::trainer
