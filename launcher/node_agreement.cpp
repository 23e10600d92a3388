// launcher/node_agreement.cpp — see node_agreement.h.
//
// Note [Restarts across nodes]: every node runs its own titan-run (static rendezvous, as
// torchrun's); with --max-restarts > 0 they must restart together, or the nodes that did not see
// the failure would wait in a collective for ranks that are gone. So node 0's titan-run
// coordinates: it listens on --master-port, the others connect there and say who they are, and
// for each attempt
//   node 0 -> all   START <attempt> <port>     the trainers' store port, a fresh one per attempt
//                                              (a new rendezvous round; rank 0 serves it on node 0)
//   a node -> 0     RESULT <attempt> <result>  when its ranks have ended (or been stopped)
//   node 0 -> all   STOP <attempt> <reason>    as soon as one node's result is a failure: every
//                                              node stops its ranks at once, as one node does
//   node 0 -> all   OUTCOME <attempt> <result> the job's result: the earliest failure, the
//                                              last step logged on any node
// and every node then decides from the same OUTCOME (and the same list of earlier ones) whether
// the job finished, restarts, or gives up (launch() in launcher.cpp): one decision, taken
// identically everywhere, so no further message is needed. Before a restart each node sends
// READY <attempt>; a node whose titan-run is gone (its connection closed) may be started again
// and rejoin with HELLO. A node that has not joined or rejoined within --rdzv-conf join_timeout
// seconds ends the job, named (END <code> <message> to the others). The coordinator is node 0's
// titan-run itself: if it dies, the others see their connection close, stop their ranks and end.
// Lines are tab-separated text; the free text comes last with tabs and newlines made spaces.
#include "launcher/node_agreement.h"
#include "launcher/launcher.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

namespace titan::launcher {
namespace {

using Clock = std::chrono::steady_clock;


std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return text;
}

std::vector<std::string> split_tabs(const std::string& line, size_t max_fields) {
  std::vector<std::string> fields;
  size_t start = 0;
  while (fields.size() + 1 < max_fields) {
    const size_t tab = line.find('\t', start);
    if (tab == std::string::npos) break;
    fields.push_back(line.substr(start, tab - start));
    start = tab + 1;
  }
  fields.push_back(line.substr(start));
  return fields;
}

int64_t to_int(const std::string& text, const std::string& line) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) throw std::runtime_error("malformed message from another node: '" + line + "'");
  return v;
}

constexpr size_t kResultFields = 8;

std::string encode(const AttemptResult& r) {
  std::ostringstream os;
  os << r.exit_code << '\t' << (r.stopped_by_signal ? 1 : 0) << '\t' << r.failed_rank << '\t' << r.failed_node << '\t'
     << r.last_step << '\t' << r.failed_at_ms << '\t' << (r.stopped_by_peer ? 1 : 0) << '\t' << one_line(r.failure);
  return os.str();
}

AttemptResult decode(const std::vector<std::string>& f, size_t first, const std::string& line) {
  if (f.size() != first + kResultFields) throw std::runtime_error("malformed message from another node: '" + line + "'");
  AttemptResult r;
  r.exit_code = static_cast<int>(to_int(f[first], line));
  r.stopped_by_signal = to_int(f[first + 1], line) != 0;
  r.failed_rank = static_cast<int>(to_int(f[first + 2], line));
  r.failed_node = static_cast<int>(to_int(f[first + 3], line));
  r.last_step = to_int(f[first + 4], line);
  r.failed_at_ms = to_int(f[first + 5], line);
  r.stopped_by_peer = to_int(f[first + 6], line) != 0;
  r.failure = f[first + 7];
  return r;
}

// One TCP connection carrying lines.
struct Line {
  int fd = -1;
  std::string pending;  // bytes after the last '\n'
  bool closed = false;

  ~Line() {
    if (fd >= 0) close(fd);
  }
  void send(const std::string& line) {
    const std::string data = line + "\n";
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        closed = true;
        return;
      }
      done += static_cast<size_t>(n);
    }
  }
  // Reads what is there (call when poll says readable); appends whole lines to `out`.
  void read_available(std::deque<std::string>& out) {
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      closed = true;
      return;
    }
    pending.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
      out.push_back(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
  }
};

int poll_ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct NodeAgreement::State {
  const LaunchOptions& options;
  bool coordinator;
  int listen_fd = -1;
  // Node 0: one connection per other node (index = node rank; [0] unused). Other nodes: [0] is
  // the connection to node 0.
  std::vector<std::unique_ptr<Line>> peers;
  std::vector<std::deque<std::string>> inbox;
  // Node 0, during an attempt: the results already in, and whether STOP went out.
  std::map<int, AttemptResult> results;
  bool stop_sent = false;
  int attempt = -1;

  explicit State(const LaunchOptions& o) : options(o), coordinator(o.node_rank == 0) {
    peers.resize(static_cast<size_t>(coordinator ? o.nnodes : 1));
    inbox.resize(peers.size());
  }
  ~State() {
    if (listen_fd >= 0) close(listen_fd);
  }

  Clock::time_point join_deadline() const {
    return Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.join_timeout_seconds * 1000));
  }
  std::string timeout_text() const {
    std::ostringstream os;
    os << options.join_timeout_seconds << " s (--rdzv-conf join_timeout)";
    return os.str();
  }

  // ---------------------------------------------------------------- node 0
  void listen_on_master_port() {
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd < 0) throw std::runtime_error(std::string("socket failed: ") + std::strerror(errno));
    const int one = 1;
    setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(*options.master_port));
    if (bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(listen_fd, 64) != 0)
      throw std::runtime_error("node 0 cannot listen on --master-port " + std::to_string(*options.master_port) +
                               " for the other nodes' titan-run: " + std::strerror(errno));
  }

  // Accepts one connection and reads its HELLO; returns the node it is, or -1 (nothing came, or
  // it was refused: a node already present, a node rank out of range, other --nnodes).
  int accept_one(Clock::time_point deadline) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return -1;
    auto line = std::make_unique<Line>();
    line->fd = fd;
    std::deque<std::string> got;
    while (got.empty() && !line->closed && Clock::now() < deadline) {
      pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, poll_ms_until(deadline)) > 0) line->read_available(got);
    }
    if (got.empty()) return -1;
    const std::vector<std::string> f = split_tabs(got.front(), 4);
    if (f.size() != 4 || f[0] != "HELLO") return -1;
    const int node = static_cast<int>(to_int(f[1], got.front()));
    std::string refusal;
    if (to_int(f[2], got.front()) != options.nnodes || to_int(f[3], got.front()) != options.nproc_per_node)
      refusal = "node " + f[1] + " was started with --nnodes " + f[2] + " --nproc-per-node " + f[3] +
                ", node 0 with --nnodes " + std::to_string(options.nnodes) + " --nproc-per-node " +
                std::to_string(options.nproc_per_node);
    else if (node <= 0 || node >= options.nnodes)
      refusal = "--node-rank " + f[1] + " is not one of 1 .. " + std::to_string(options.nnodes - 1);
    else if (peers[static_cast<size_t>(node)] && !peers[static_cast<size_t>(node)]->closed)
      refusal = "node " + f[1] + " is already part of the job (two titan-runs were given --node-rank " + f[1] + ")";
    if (!refusal.empty()) {
      say("refused a node: " + refusal);
      line->send("END\t" + std::to_string(kUsageExitCode) + "\t" + one_line(refusal));
      return -1;
    }
    if (attempt > 0) say("node " + f[1] + " rejoined the job");
    peers[static_cast<size_t>(node)] = std::move(line);
    inbox[static_cast<size_t>(node)].clear();
    return node;
  }

  // Node 0, before attempt `attempt`: until every other node is connected and ready for it (a
  // node that joins with HELLO is; one already connected says READY once its ranks are gone).
  void gather_nodes(const char* verb) {
    const auto deadline = join_deadline();
    std::vector<bool> ready(peers.size(), false);
    for (;;) {
      std::vector<int> missing;
      for (size_t n = 1; n < peers.size(); ++n) {
        if (!peers[n] || peers[n]->closed) {
          ready[n] = false;
        } else {
          for (; !inbox[n].empty(); inbox[n].pop_front())
            if (inbox[n].front() == "READY\t" + std::to_string(attempt)) ready[n] = true;
        }
        if (!ready[n]) missing.push_back(static_cast<int>(n));
      }
      if (missing.empty()) return;
      if (Clock::now() >= deadline) {
        std::ostringstream os;
        os << "node" << (missing.size() == 1 ? " " : "s ");
        for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
        os << " did not " << verb << " within " << timeout_text() << "; ending the job";
        end_job(1, os.str());
      }
      std::vector<pollfd> fds = {{listen_fd, POLLIN, 0}};
      for (size_t n = 1; n < peers.size(); ++n)
        if (peers[n] && !peers[n]->closed) fds.push_back({peers[n]->fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), poll_ms_until(deadline)) <= 0) continue;
      for (size_t n = 1; n < peers.size(); ++n)
        if (peers[n] && !peers[n]->closed) peers[n]->read_available(inbox[n]);
      if (fds[0].revents & POLLIN) {
        const int node = accept_one(deadline);
        if (node > 0) ready[static_cast<size_t>(node)] = true;
      }
    }
  }

  [[noreturn]] void end_job(int code, const std::string& message) {
    for (size_t n = coordinator ? 1 : 0; n < peers.size(); ++n)
      if (coordinator && peers[n] && !peers[n]->closed) peers[n]->send("END\t" + std::to_string(code) + "\t" + one_line(message));
    throw JobEnded(code, message);
  }

  void broadcast(const std::string& line) {
    for (size_t n = 1; n < peers.size(); ++n)
      if (peers[n] && !peers[n]->closed) peers[n]->send(line);
  }

  // Node 0: reads what the other nodes sent during the attempt; returns a reason to stop.
  std::optional<std::string> take_results() {
    for (size_t n = 1; n < peers.size(); ++n) {
      if (!peers[n]) continue;
      if (!peers[n]->closed) peers[n]->read_available(inbox[n]);
      while (!inbox[n].empty()) {
        const std::string line = inbox[n].front();
        inbox[n].pop_front();
        const std::vector<std::string> f = split_tabs(line, 2 + kResultFields);
        if (f[0] == "RESULT" && to_int(f[1], line) == attempt) results[static_cast<int>(n)] = decode(f, 2, line);
      }
      if (peers[n]->closed && !results.count(static_cast<int>(n))) {
        AttemptResult gone;
        gone.exit_code = 1;
        gone.failed_node = static_cast<int>(n);
        gone.failed_at_ms = now_ms();
        gone.failure = "node " + std::to_string(n) + "'s titan-run is gone (its connection to node 0 closed)";
        results[static_cast<int>(n)] = gone;
      }
    }
    for (const auto& [node, r] : results) {
      if (r.exit_code == 0) continue;
      return r.failed_rank >= 0 ? "rank " + std::to_string(r.failed_rank) + " (node " + std::to_string(node) + ") " + r.failure
                                : r.failure;
    }
    return std::nullopt;
  }

  void send_stop(const std::string& reason) {
    if (stop_sent) return;
    stop_sent = true;
    broadcast("STOP\t" + std::to_string(attempt) + "\t" + one_line(reason));
  }

  // ---------------------------------------------------------------- other nodes
  void connect_to_node0() {
    const auto deadline = join_deadline();
    std::string last_error = "no attempt";
    while (Clock::now() < deadline) {
      addrinfo hints = {};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      const int gai = getaddrinfo(options.master_addr.c_str(), std::to_string(*options.master_port).c_str(), &hints, &found);
      if (gai != 0) {
        last_error = gai_strerror(gai);
      } else {
        for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
          const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
          if (fd < 0) continue;
          if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            freeaddrinfo(found);
            peers[0] = std::make_unique<Line>();
            peers[0]->fd = fd;
            peers[0]->send("HELLO\t" + std::to_string(options.node_rank) + "\t" + std::to_string(options.nnodes) + "\t" +
                           std::to_string(options.nproc_per_node));
            return;
          }
          last_error = std::strerror(errno);
          close(fd);
        }
        freeaddrinfo(found);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    throw JobEnded(1, "node " + std::to_string(options.node_rank) + " could not reach node 0's titan-run at " +
                          options.master_addr + ":" + std::to_string(*options.master_port) + " within " + timeout_text() +
                          " (last error: " + last_error + ")");
  }

  // Waits for node 0's next line of kind `want` (STOP lines before it are dropped: the attempt
  // they stopped is over). END and a closed connection end the job.
  std::vector<std::string> await(const std::string& want, size_t fields) {
    Line& l = *peers[0];
    for (;;) {
      while (!inbox[0].empty()) {
        const std::string line = inbox[0].front();
        inbox[0].pop_front();
        if (line.rfind("END\t", 0) == 0) {
          const std::vector<std::string> f = split_tabs(line, 3);
          throw JobEnded(f.size() == 3 ? static_cast<int>(to_int(f[1], line)) : 1, "node 0 ended the job: " + f.back());
        }
        if (line.rfind(want + "\t", 0) == 0) return split_tabs(line, fields);
      }
      if (l.closed)
        throw JobEnded(1, "node 0's titan-run is gone (the connection to it closed): it coordinates the job's "
                          "restarts, so this node ends too");
      pollfd p = {l.fd, POLLIN, 0};
      if (poll(&p, 1, 1000) > 0) l.read_available(inbox[0]);
    }
  }
};

NodeAgreement::NodeAgreement(const LaunchOptions& options) : state_(std::make_unique<State>(options)) {
  if (state_->coordinator)
    state_->listen_on_master_port();
  else
    state_->connect_to_node0();
}

NodeAgreement::~NodeAgreement() = default;

int NodeAgreement::begin_attempt(int attempt) {
  State& s = *state_;
  s.attempt = attempt;
  s.results.clear();
  s.stop_sent = false;
  if (!s.coordinator) {
    if (attempt > 0) s.peers[0]->send("READY\t" + std::to_string(attempt));
    const std::vector<std::string> f = s.await("START", 3);
    return static_cast<int>(to_int(f[2], f[0]));
  }
  s.gather_nodes(attempt == 0 ? "join" : "rejoin");
  const int port = pick_free_port();
  s.broadcast("START\t" + std::to_string(attempt) + "\t" + std::to_string(port));
  return port;
}

AttemptWatch NodeAgreement::watch() {
  State& s = *state_;
  AttemptWatch w;
  for (const auto& p : s.peers)
    if (p && !p->closed) w.fds.push_back(p->fd);
  if (s.coordinator) {
    w.on_readable = [&s]() -> std::optional<std::string> {
      std::optional<std::string> reason = s.take_results();
      if (reason) s.send_stop(*reason);
      return reason;
    };
  } else {
    w.on_readable = [&s]() -> std::optional<std::string> {
      Line& l = *s.peers[0];
      if (!l.closed) l.read_available(s.inbox[0]);
      for (const std::string& line : s.inbox[0]) {
        if (line.rfind("STOP\t", 0) == 0) return split_tabs(line, 3).back();
        if (line.rfind("END\t", 0) == 0) return "node 0 ended the job: " + split_tabs(line, 3).back();
      }
      if (l.closed) return std::string("node 0's titan-run is gone (the connection to it closed)");
      return std::nullopt;
    };
  }
  return w;
}

AttemptResult NodeAgreement::end_attempt(int attempt, const AttemptResult& local) {
  State& s = *state_;
  if (!s.coordinator) {
    s.peers[0]->send("RESULT\t" + std::to_string(attempt) + "\t" + encode(local));
    const std::vector<std::string> f = s.await("OUTCOME", 2 + kResultFields);
    return decode(f, 2, f[0] + "\t" + f[1]);
  }
  AttemptResult mine = local;
  s.results[0] = mine;
  if (mine.exit_code != 0)
    s.send_stop(mine.failed_rank >= 0 ? "rank " + std::to_string(mine.failed_rank) + " (node 0) " + mine.failure
                                      : mine.failure);
  // Every node's result: while no node failed the others may still be training (no deadline);
  // once STOP is out they end within their kill grace, so a node silent past the join timeout
  // is named.
  std::optional<Clock::time_point> deadline;
  while (s.results.size() < s.peers.size()) {
    if (std::optional<std::string> reason = s.take_results()) {
      s.send_stop(*reason);
      if (!deadline) deadline = s.join_deadline();
    }
    if (s.results.size() == s.peers.size()) break;
    if (deadline && Clock::now() >= *deadline) {
      for (size_t n = 1; n < s.peers.size(); ++n)
        if (!s.results.count(static_cast<int>(n)))
          s.end_job(1, "node " + std::to_string(n) + " did not report the end of attempt " + std::to_string(attempt) +
                           " within " + s.timeout_text() + " after it was told to stop; ending the job");
    }
    std::vector<pollfd> fds;
    for (size_t n = 1; n < s.peers.size(); ++n)
      if (s.peers[n] && !s.peers[n]->closed && !s.results.count(static_cast<int>(n))) fds.push_back({s.peers[n]->fd, POLLIN, 0});
    if (!fds.empty()) poll(fds.data(), fds.size(), 1000);
  }
  // The job's result: the earliest failure of a node that failed on its own (not one stopped
  // because another failed), the last step logged anywhere.
  AttemptResult job;
  const AttemptResult* first = nullptr;
  for (const auto& [node, r] : s.results) {
    job.last_step = std::max(job.last_step, r.last_step);
    if (r.stopped_by_signal && !job.stopped_by_signal) {
      job.stopped_by_signal = true;
      job.exit_code = r.exit_code;
    }
    if (r.exit_code != 0 && !r.stopped_by_peer && (!first || r.failed_at_ms < first->failed_at_ms)) first = &r;
  }
  if (first) {
    job.exit_code = job.stopped_by_signal ? job.exit_code : first->exit_code;
    job.failed_rank = first->failed_rank;
    job.failed_node = first->failed_node;
    job.failed_at_ms = first->failed_at_ms;
    job.failure = first->failure;
  } else if (!job.stopped_by_signal) {
    for (const auto& [node, r] : s.results)
      if (r.exit_code != 0) job = r;  // only stopped nodes: keep one (cannot happen without a cause)
  }
  s.broadcast("OUTCOME\t" + std::to_string(attempt) + "\t" + encode(job));
  return job;
}

}  // namespace titan::launcher
