// launcher/supervisor.cpp — see supervisor.h.
//
// Note [Rank process groups]: each rank runs in a process group of its own (pgid == its pid),
// and every signal titan-run sends goes to the whole group (kill(-pgid)). A rank started as
// `sh -c '...'` or a trainer that forks helpers is thereby stopped as a whole tree, which a
// kill(pid) would not do. The cost is that a terminal's Ctrl-C reaches titan-run only, so
// titan-run forwards SIGINT/SIGTERM/SIGHUP itself. If titan-run itself is SIGKILLed, the ranks
// die too through PR_SET_PDEATHSIG(SIGKILL), set in the child between fork and exec. Ranks get
// /dev/null as stdin: a background process group reading the terminal would be stopped
// (SIGTTIN) forever.
//
// Note [Launcher watchdog pipe]: PR_SET_PDEATHSIG reaches only the direct child. A rank started
// through a wrapper (`sh -c 'titan-train ...'`) has titan-train as a grandchild: when titan-run
// is SIGKILLed, no handler runs, nobody can killpg, sh dies of its pdeathsig and titan-train
// would train on forever. So titan-run creates one pipe per job and keeps its write end to
// itself (O_CLOEXEC: no rank inherits it); the read end is inherited by every rank's whole tree,
// its number in TITAN_RUN_WATCHDOG_FD. When titan-run dies, however it dies, the kernel closes
// the write end, and watch_launcher() in titan-train sees EOF and exits. A pipe is used rather
// than "is my parent still titan-run" because a wrapper is the parent. titan-run is also the
// child subreaper of its tree (PR_SET_CHILD_SUBREAPER), so a rank's orphaned grandchildren are
// reparented to it (and reaped by it) rather than to init while it lives.
#include "launcher/supervisor.h"
#include "launcher/launcher.h"
#include "launcher/process_status.h"
#include "launcher/signal_pipe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <sstream>

extern char** environ;

namespace titan::launcher {
namespace {

constexpr size_t kTailLines = 20;             // kept per rank for the failure report
constexpr size_t kMaxLineBytes = 64 * 1024;   // a longer line without '\n' is cut here

using Clock = std::chrono::steady_clock;

// Writes everything; gives up quietly when the reader went away (EPIPE): the job keeps running.
bool write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}


// ---------------------------------------------------------------------------------------------
// Ranks

struct Stream {
  int fd = -1;
  int out_fd = STDOUT_FILENO;  // where its lines go
  std::string partial;         // bytes after the last '\n'
};

struct Rank {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  bool shown = true;  // passes the local-ranks filter
  std::string prefix;
  Stream out, err;
  std::deque<std::string> tail;  // last kTailLines lines of stdout+stderr, prefixed
  int64_t last_step = -1;        // the last "step: N" it printed (a metrics line), -1: none
};

class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, int master_port, int restart_count, const AttemptWatch& watch)
      : options_(options), master_port_(master_port), restart_count_(restart_count), watch_(watch) {}
  AttemptResult run();

 private:
  std::vector<std::string> rank_environment(const Rank& r) const;
  void spawn(Rank& r, int devnull);
  void signal_ranks(int sig);
  void begin_stop(int sig, const std::string& reason);
  void on_launcher_signal(int sig);
  void reap();
  void read_stream(Rank& r, Stream& s);
  void emit_line(Rank& r, Stream& s, std::string line);
  void drain_outputs();
  AttemptResult report();

  const LaunchOptions& options_;
  const int master_port_;
  const int restart_count_;
  const AttemptWatch& watch_;
  std::string stopped_for_;  // why another node had this node's ranks stopped ("": it did not)
  int64_t failed_at_ms_ = 0;
  std::vector<Rank> ranks_;
  bool stopping_ = false;
  std::optional<Clock::time_point> kill_deadline_;
  int failed_index_ = -1;   // the first rank that failed on its own
  int launcher_signal_ = 0;  // the signal that stopped titan-run, if any
  bool output_ok_ = true;    // false once our stdout/stderr reader is gone
  int watchdog_read_fd_ = -1;   // inherited by every rank's tree (Note [Launcher watchdog pipe])
  int watchdog_write_fd_ = -1;  // ours alone; closed when we die
};

std::vector<std::string> Supervisor::rank_environment(const Rank& r) const {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  auto set = [&env](const std::string& name, const std::string& value) {
    std::string entry = name + "=" + value;
    for (auto& existing : env) {
      if (existing.compare(0, name.size() + 1, name + "=") == 0) {
        existing = entry;
        return;
      }
    }
    env.push_back(entry);
  };
  int world_size = options_.nnodes * options_.nproc_per_node;
  // "<fd>:<inode>": a wrapper may close the fd and reuse its number; the inode tells.
  struct stat st {};
  fstat(watchdog_read_fd_, &st);
  set(kWatchdogFdVariable, std::to_string(watchdog_read_fd_) + ":" + std::to_string(st.st_ino));
  set("RANK", std::to_string(r.rank));
  set("LOCAL_RANK", std::to_string(r.local_rank));
  set("WORLD_SIZE", std::to_string(world_size));
  set("LOCAL_WORLD_SIZE", std::to_string(options_.nproc_per_node));
  set("GROUP_RANK", std::to_string(options_.node_rank));
  set("GROUP_WORLD_SIZE", std::to_string(options_.nnodes));
  set("ROLE_RANK", std::to_string(r.rank));
  set("ROLE_WORLD_SIZE", std::to_string(world_size));
  set("MASTER_ADDR", options_.master_addr);
  set("MASTER_PORT", std::to_string(master_port_));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count_));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(options_.max_restarts));
  // titan-run prefixes every relayed line with "[rank N] "; the trainer then leaves its own
  // rank prefix out (under torchrun or srun it keeps it).
  set("TITAN_RUN_PREFIXES_OUTPUT", "1");
  // As torchrun: several ranks on one node each spawning one OpenMP thread per core would
  // oversubscribe the CPU many times over.
  if (options_.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    set("OMP_NUM_THREADS", "1");
  }
  return env;
}

void Supervisor::spawn(Rank& r, int devnull) {
  // Everything the child needs is built before fork: between fork and exec it only makes
  // async-signal-safe calls.
  std::vector<std::string> env = rank_environment(r);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options_.command;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string exec_error_head = "titan-run: cannot execute '" + args[0] + "': ";

  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe2 failed: ") + std::strerror(errno));
  }
  pid_t launcher_pid = getpid();
  const int watchdog_fd = watchdog_read_fd_;
  // Blocked across fork so that no handler of ours runs in the child before it resets them.
  sigset_t all, previous;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &previous);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // See Note [Rank process groups]
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher_pid) _exit(1);  // titan-run died before prctl took effect
    for (int sig : kHandledSignals) signal(sig, SIG_DFL);  // launcher/signal_pipe.h
    signal(SIGPIPE, SIG_DFL);  // ignored signals would stay ignored across exec
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    fcntl(watchdog_fd, F_SETFD, 0);  // inherited across exec (Note [Launcher watchdog pipe])
    dup2(devnull, STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    execvpe(argv[0], argv.data(), envp.data());
    int e = errno;
    const char* reason = std::strerror(e);
    ssize_t ignored = write(STDERR_FILENO, exec_error_head.data(), exec_error_head.size());
    ignored = write(STDERR_FILENO, reason, std::strlen(reason));
    ignored = write(STDERR_FILENO, "\n", 1);
    (void)ignored;
    _exit(e == ENOENT ? 127 : 126);  // the shell's codes for "not found" / "not executable"
  }
  int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (pid < 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    throw std::runtime_error("fork for rank " + std::to_string(r.rank) +
                             " failed: " + std::strerror(fork_errno));
  }
  // Also set here so that the group exists before we might signal it (whichever runs first
  // wins; the other call fails harmlessly).
  setpgid(pid, pid);
  r.pid = pid;
  r.running = true;
  r.out.fd = out_pipe[0];
  r.out.out_fd = STDOUT_FILENO;
  r.err.fd = err_pipe[0];
  r.err.out_fd = STDERR_FILENO;
  fcntl(r.out.fd, F_SETFL, fcntl(r.out.fd, F_GETFL) | O_NONBLOCK);
  fcntl(r.err.fd, F_SETFL, fcntl(r.err.fd, F_GETFL) | O_NONBLOCK);
}

void Supervisor::signal_ranks(int sig) {
  // Exited ranks are signalled too: their group may still hold children (see Note [Rank
  // process groups]). ESRCH for an empty group is expected.
  for (const Rank& r : ranks_) {
    if (r.pid > 0) kill(-r.pid, sig);
  }
}

void Supervisor::begin_stop(int sig, const std::string& reason) {
  stopping_ = true;
  int running = 0;
  for (const Rank& r : ranks_) running += r.running ? 1 : 0;
  std::ostringstream os;
  os << reason;
  if (running > 0) {
    os << "; sending " << signal_name(sig) << " to the " << running << " running rank"
       << (running == 1 ? "" : "s") << " (SIGKILL after " << options_.kill_grace_seconds
       << " s)";
  }
  if (running > 0 || launcher_signal_ != 0) say(os.str());  // else report() says it all
  signal_ranks(sig);
  kill_deadline_ = Clock::now() + std::chrono::milliseconds(
                                      static_cast<int64_t>(options_.kill_grace_seconds * 1000));
}

void Supervisor::on_launcher_signal(int sig) {
  if (!stopping_) {
    launcher_signal_ = sig;
    begin_stop(sig, std::string("received ") + signal_name(sig));
  } else if (sig == SIGINT || sig == SIGTERM) {
    // A second Ctrl-C means "now".
    say(std::string("received ") + signal_name(sig) + " again; sending SIGKILL to every rank");
    if (launcher_signal_ == 0) launcher_signal_ = sig;
    signal_ranks(SIGKILL);
    kill_deadline_.reset();
  }
}

void Supervisor::reap() {
  // waitpid(-1): as child subreaper we also adopt the ranks' orphaned descendants (Note [Launcher
  // watchdog pipe]); they are reaped here and not reported.
  int status = 0;
  pid_t got;
  while ((got = waitpid(-1, &status, WNOHANG)) > 0) {
    auto it = std::find_if(ranks_.begin(), ranks_.end(), [got](const Rank& r) { return r.running && r.pid == got; });
    if (it == ranks_.end()) continue;
    Rank& r = *it;
    r.running = false;
    r.status = status;
    if (!succeeded(status) && !stopping_) {
      failed_index_ = static_cast<int>(it - ranks_.begin());
      failed_at_ms_ = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
      begin_stop(SIGTERM, "rank " + std::to_string(r.rank) + " (local " +
                              std::to_string(r.local_rank) + ", pid " + std::to_string(r.pid) +
                              ") " + describe_status(status));
    }
  }
}

void Supervisor::emit_line(Rank& r, Stream& s, std::string line) {
  line.insert(0, r.prefix);
  line += '\n';
  if (r.shown && output_ok_) output_ok_ = write_all(s.out_fd, line);
  line.pop_back();
  // A metrics line ("... step: 12  loss: ...") or a resume ("checkpoint: resumed from ... at
  // step 12"): the step the rank had reached.
  size_t at = line.find("step: "), skip = 6;
  if (at == std::string::npos && line.find("checkpoint: resumed from") != std::string::npos)
    at = line.find(" at step "), skip = 9;
  if (at != std::string::npos) {
    size_t i = at + skip;
    while (i < line.size() && line[i] == ' ') ++i;
    int64_t step = 0;
    bool digits = false;
    for (; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i, digits = true) step = step * 10 + (line[i] - '0');
    if (digits) r.last_step = step;
  }
  r.tail.push_back(std::move(line));
  if (r.tail.size() > kTailLines) r.tail.pop_front();
}

void Supervisor::read_stream(Rank& r, Stream& s) {
  // One read per wake-up keeps a chatty rank from starving the others.
  char buffer[65536];
  ssize_t n = read(s.fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {  // EOF (or a read error, treated alike)
    if (!s.partial.empty()) emit_line(r, s, std::move(s.partial));
    s.partial.clear();
    close(s.fd);
    s.fd = -1;
    return;
  }
  s.partial.append(buffer, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    emit_line(r, s, s.partial.substr(start, nl - start));
  }
  s.partial.erase(0, start);
  if (s.partial.size() > kMaxLineBytes) {
    emit_line(r, s, std::move(s.partial));
    s.partial.clear();
  }
}

// After the last rank exited: take what is still in the pipes. A pipe held open by a leftover
// grandchild would never reach EOF, so this stops when the pipes fall quiet.
void Supervisor::drain_outputs() {
  auto give_up = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < give_up) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, Stream*>> owners;
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&r, s);
        }
      }
    }
    if (fds.empty()) break;
    int n = poll(fds.data(), fds.size(), 100);
    if (n == 0) break;
    if (n < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) read_stream(*owners[i].first, *owners[i].second);
    }
  }
  for (Rank& r : ranks_) {
    for (Stream* s : {&r.out, &r.err}) {
      if (s->fd < 0) continue;
      if (!s->partial.empty()) emit_line(r, *s, std::move(s->partial));
      close(s->fd);
      s->fd = -1;
    }
  }
}

AttemptResult Supervisor::report() {
  AttemptResult result;
  for (const Rank& r : ranks_) result.last_step = std::max(result.last_step, r.last_step);
  if (failed_index_ >= 0) {
    const Rank& f = ranks_[failed_index_];
    std::ostringstream os;
    os << "titan-run: FAILED: rank " << f.rank << " (local " << f.local_rank << ", pid " << f.pid
       << ") " << describe_status(f.status) << "\n";
    if (f.tail.empty()) {
      os << "titan-run: rank " << f.rank << " printed nothing\n";
    } else {
      os << "titan-run: last " << f.tail.size() << " output line" << (f.tail.size() == 1 ? "" : "s")
         << " of rank " << f.rank << ":\n";
      for (const auto& line : f.tail) os << "  " << line << "\n";
    }
    for (const Rank& r : ranks_) {
      if (&r == &f || succeeded(r.status)) continue;
      os << "titan-run: rank " << r.rank << " (local " << r.local_rank << ", pid " << r.pid << ") "
         << describe_status(r.status) << " (stopped by titan-run)\n";
      // Its own error lines too: the one that names the cause may be this rank's, whatever
      // --local-ranks-filter / LOG_RANK showed.
      for (const auto& line : r.tail)
        if (line.find(" - error - ") != std::string::npos) os << "  " << line << "\n";
    }
    write_all(STDERR_FILENO, os.str());
    result.exit_code = exit_code_for(f.status);
    result.failed_rank = f.rank;
    result.failed_node = options_.node_rank;
    result.failed_at_ms = failed_at_ms_;
    result.failure = describe_status(f.status);
    return result;
  }
  if (!stopped_for_.empty() && launcher_signal_ == 0) {
    result.exit_code = 1;
    result.stopped_by_peer = true;
    result.failure = "stopped because " + stopped_for_;
    return result;
  }
  if (launcher_signal_ != 0) {
    say(std::string("stopped by ") + signal_name(launcher_signal_));
    result.exit_code = 128 + launcher_signal_;
    result.stopped_by_signal = true;
  }
  return result;
}

AttemptResult Supervisor::run() {
  prctl(PR_SET_CHILD_SUBREAPER, 1);  // best effort: the watchdog pipe does not depend on it
  int watchdog[2];
  if (pipe2(watchdog, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2 failed: ") + std::strerror(errno));
  watchdog_read_fd_ = watchdog[0];
  watchdog_write_fd_ = watchdog[1];
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) throw std::runtime_error(std::string("open /dev/null: ") + std::strerror(errno));
  std::vector<int> filter;
  if (options_.local_ranks_filter) filter = *options_.local_ranks_filter;

  ranks_.resize(static_cast<size_t>(options_.nproc_per_node));
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    Rank& r = ranks_[static_cast<size_t>(local)];
    r.local_rank = local;
    r.rank = options_.node_rank * options_.nproc_per_node + local;
    r.prefix = "[rank " + std::to_string(r.rank) + "] ";
    r.shown = filter.empty() || std::find(filter.begin(), filter.end(), local) != filter.end();
  }
  try {
    for (Rank& r : ranks_) spawn(r, devnull);
  } catch (...) {
    close(devnull);
    signal_ranks(SIGKILL);
    for (Rank& r : ranks_) {
      if (r.running) waitpid(r.pid, nullptr, 0);
    }
    throw;
  }
  close(devnull);

  auto any_running = [this] {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
  };
  while (any_running()) {
    int timeout_ms = 1000;  // also a safety net should a SIGCHLD wake-up ever be missed
    if (kill_deadline_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_deadline_ -
                                                                        Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
    }
    std::vector<pollfd> fds = {{signal_pipe_read_fd(), POLLIN, 0}};
    std::vector<std::pair<Rank*, Stream*>> owners = {{nullptr, nullptr}};
    const bool watching = stopped_for_.empty() && watch_.on_readable;
    if (watching) {
      for (int fd : watch_.fds) {
        fds.push_back({fd, POLLIN, 0});
        owners.emplace_back(nullptr, nullptr);
      }
    }
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&r, s);
        }
      }
    }
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      throw std::runtime_error(std::string("poll failed: ") + std::strerror(errno));
    }
    if (n > 0) {
      if (fds[0].revents & POLLIN) {
        unsigned char signals[64];
        ssize_t got = read(signal_pipe_read_fd(), signals, sizeof signals);
        for (ssize_t i = 0; i < got; ++i) {
          if (signals[i] != SIGCHLD) on_launcher_signal(signals[i]);
        }
      }
      bool watched_ready = false;
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (owners[i].first == nullptr)
          watched_ready = true;
        else
          read_stream(*owners[i].first, *owners[i].second);
      }
      if (watched_ready) {
        if (std::optional<std::string> reason = watch_.on_readable()) {
          stopped_for_ = *reason;
          if (!stopping_) begin_stop(SIGTERM, *reason);
        }
      }
    }
    reap();
    if (kill_deadline_ && Clock::now() >= *kill_deadline_ && any_running()) {
      std::ostringstream os;
      os << "grace period of " << options_.kill_grace_seconds
         << " s is over; sending SIGKILL to the remaining ranks";
      say(os.str());
      signal_ranks(SIGKILL);
      kill_deadline_.reset();
    }
  }
  if (stopping_) signal_ranks(SIGKILL);  // leftovers in the ranks' groups
  close(watchdog_write_fd_);  // anything of the job still watching exits now
  close(watchdog_read_fd_);
  drain_outputs();
  return report();
}

}  // namespace

void say(const std::string& message) { write_all(STDERR_FILENO, "titan-run: " + message + "\n"); }

AttemptResult supervise(const LaunchOptions& options, int master_port, int restart_count,
                        const AttemptWatch& watch) {
  SignalScope signals;
  Supervisor supervisor(options, master_port, restart_count, watch);
  return supervisor.run();
}

}  // namespace titan::launcher
