// launcher/launcher.cpp — see launcher.h: titan-run's command line, its port, and the rank side
// of the watchdog pipe; the supervision of the ranks is in supervisor.cpp (Notes [Rank process
// groups] and [Launcher watchdog pipe] there).
#include "launcher/launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "launcher/node_agreement.h"
#include "launcher/supervisor.h"

namespace titan::launcher {
namespace {


}  // namespace

int pick_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket failed: ") + std::strerror(errno));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int e = errno;
    close(fd);
    throw std::runtime_error(std::string("could not find a free port: ") + std::strerror(e));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

namespace {


std::string describe_attempt(const AttemptResult& a) {
  std::ostringstream os;
  if (a.failed_rank >= 0)
    os << "rank " << a.failed_rank << " (node " << a.failed_node << ") " << a.failure;
  else
    os << a.failure;  // a node's titan-run itself ("node 1's titan-run is gone ...")
  if (a.last_step >= 0)
    os << " after step " << a.last_step;
  else
    os << " before any step was logged";
  return os.str();
}

// Note [In-job restarts]: as torchrun's --max-restarts, on one node: when an attempt fails (a
// rank exits non-zero or is killed, which includes a rank ending on a collective timeout
// because a peer froze), the supervisor has already stopped every rank and waited for them; the
// job then starts again with TORCHELASTIC_RESTART_COUNT one higher, the same ranks, and a fresh
// rendezvous (a new free port unless --master-port fixed it). The trainer resumes from its last
// complete checkpoint as a manual rerun would (an async save in flight when the rank died was
// never committed, so it is ignored). A signal to titan-run itself ends the job, never restarts it.
// With several nodes the attempts are agreed on first (Note [Restarts across nodes] in
// node_agreement.cpp): node 0's titan-run hands out each attempt's store port, every node's
// result reaches every node, and each decides below from the same facts.
int run_attempts(const LaunchOptions& options, NodeAgreement* agreement) {
  std::vector<AttemptResult> failures;
  for (int attempt = 0;; ++attempt) {
    int port = options.master_port.value_or(options.nnodes == 1 ? 0 : kMultiNodeDefaultPort);
    if (port == 0) port = pick_free_port();
    AttemptResult result;
    if (agreement) {
      port = agreement->begin_attempt(attempt);
      const AttemptResult local = supervise(options, port, attempt, agreement->watch());
      result = agreement->end_attempt(attempt, local);
    } else {
      result = supervise(options, port, attempt);
    }
    if (result.exit_code == 0) {
      if (attempt > 0) say("the job finished after " + std::to_string(attempt) + " restart" + (attempt == 1 ? "" : "s"));
      return 0;
    }
    if (result.stopped_by_signal) return result.exit_code;
    failures.push_back(result);
    if (attempt >= options.max_restarts) {
      if (options.max_restarts > 0) {
        std::ostringstream os;
        os << "giving up: the job failed " << failures.size() << " times (--max-restarts " << options.max_restarts
           << ")";
        for (size_t i = 0; i < failures.size(); ++i)
          os << "\ntitan-run:   attempt " << i << ": " << describe_attempt(failures[i]);
        const bool same_step = failures.size() > 1 && failures.front().last_step >= 0 &&
                               std::all_of(failures.begin(), failures.end(), [&](const AttemptResult& f) {
                                 return f.last_step == failures.front().last_step;
                               });
        if (same_step)
          os << "\ntitan-run: every attempt failed after step " << failures.front().last_step
             << ": the failure is deterministic (restarting will not get past it; see the errors above)";
        say(os.str());
      }
      return result.exit_code;
    }
    say("restart " + std::to_string(attempt + 1) + " of " + std::to_string(options.max_restarts) + ": " +
        describe_attempt(result) + "; starting every rank again (TORCHELASTIC_RESTART_COUNT=" +
        std::to_string(attempt + 1) + ")");
  }
}

}  // namespace

// Runs the job (see Note [In-job restarts] on run_attempts).
int launch(const LaunchOptions& options) {
  if (options.command.empty()) throw UsageError("no command to run");
  std::unique_ptr<NodeAgreement> agreement;
  try {
    if (options.nnodes > 1 && options.max_restarts > 0) {
      LaunchOptions with_port = options;
      with_port.master_port = options.master_port.value_or(kMultiNodeDefaultPort);
      agreement = std::make_unique<NodeAgreement>(with_port);
    }
    return run_attempts(options, agreement.get());
  } catch (const JobEnded& e) {
    say(e.what());
    return e.exit_code;
  }
}

int launcher_main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  LaunchOptions options;
  try {
    options = parse_launch_args(args);
    if (options.help) {
      std::cout << launch_usage();
      return 0;
    }
    if (!options.local_ranks_filter) {
      // LOG_RANK is often exported job-wide: local ranks this node lacks are simply not shown.
      if (const char* log_rank = std::getenv("LOG_RANK"); log_rank != nullptr && *log_rank) {
        options.local_ranks_filter = parse_rank_list(log_rank, "LOG_RANK");
      }
    }
  } catch (const UsageError& e) {
    std::cerr << "titan-run: " << e.what() << "\n(see titan-run --help)\n";
    return kUsageExitCode;
  }
  try {
    return launch(options);
  } catch (const std::exception& e) {
    std::cerr << "titan-run: " << e.what() << "\n";
    return 1;
  }
}

bool watch_launcher(std::function<void()> on_launcher_gone) {
  const char* text = std::getenv(kWatchdogFdVariable);
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  if (*end != ':' || fd < 0 || fd > INT_MAX) return false;
  const unsigned long long inode = std::strtoull(end + 1, &end, 10);
  struct stat st {};
  // Not ours (a stale variable, or a wrapper closed the fd and reused the number): nothing to
  // watch rather than reading someone else's file.
  if (*end != '\0' || fstat(static_cast<int>(fd), &st) != 0 || !S_ISFIFO(st.st_mode) || st.st_ino != inode)
    return false;
  const int watch_fd = static_cast<int>(fd);
  fcntl(watch_fd, F_SETFD, FD_CLOEXEC);  // our own children (if any) are not the job's ranks
  std::thread([watch_fd, on_launcher_gone = std::move(on_launcher_gone)] {
    char byte;
    for (;;) {
      const ssize_t got = read(watch_fd, &byte, 1);  // nobody writes: returns only at EOF
      if (got == 0 || (got < 0 && errno != EINTR)) break;
    }
    if (on_launcher_gone) on_launcher_gone();
    static const char message[] = "titan-run (the launcher) is gone: this rank exits now\n";
    ssize_t ignored = write(STDERR_FILENO, message, sizeof(message) - 1);
    (void)ignored;
    _exit(128 + SIGKILL);  // as if killed with the launcher; no destructors that could block
  }).detach();
  return true;
}

}  // namespace titan::launcher
