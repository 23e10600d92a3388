#include "trainer/signals.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

#include "util/atomic_file.h"

namespace titan::trainer {
namespace {
volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_in_training_loop = 0;

// Only async-signal-safe calls here: write(2), unlink(2) (the temp files) and _exit(2).
void write_stderr(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void on_signal(int sig) {
  if (g_in_training_loop == 0) {
    write_stderr(sig == SIGTERM ? "titan-train: interrupted during start-up by SIGTERM\n"
                                : "titan-train: interrupted during start-up by SIGINT\n");
    util::remove_temp_files_in_flight();
    _exit(128 + sig);
  }
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

void set_stop_at_step_boundary(bool in_training_loop) { g_in_training_loop = in_training_loop ? 1 : 0; }
bool stop_requested() { return g_signal != 0; }
int stop_signal() { return g_signal; }

}  // namespace titan::trainer
