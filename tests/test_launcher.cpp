// titan-run end to end (spawned as a real process, ranks are /bin/sh scripts) plus unit tests
// of its flag parsing and of world_from_env / Slurm nodelist parsing. No LibTorch here.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "launcher/launcher.h"
#include "launcher/world.h"

#ifndef TITAN_RUN_PATH
#error "TITAN_RUN_PATH (the built titan-run) must be defined by the build"
#endif
#ifndef TITAN_TRAIN_PATH
#error "TITAN_TRAIN_PATH (the built titan-train) must be defined by the build"
#endif

namespace tl = titan::launcher;
using Clock = std::chrono::steady_clock;

namespace {

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  std::string out, err;
  Clock::time_point start;
};

struct Result {
  int status = 0;
  std::string out, err;
  double seconds = 0;
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
};

// Starts titan-run with `args`; `env` entries are added to (or replace in) our environment.
Child start_titan_run(const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv_s = {TITAN_RUN_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    if (!env.count(name) && name != "LOG_RANK") env_s.push_back(entry);
  }
  for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  int out[2], err[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(pipe2(err, O_CLOEXEC) == 0);
  Child c;
  c.start = Clock::now();
  c.pid = fork();
  REQUIRE(c.pid >= 0);
  if (c.pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    execve(argv[0], argv.data(), envp.data());
    _exit(126);
  }
  close(out[1]);
  close(err[1]);
  c.out_fd = out[0];
  c.err_fd = err[0];
  return c;
}

// Reads available output for up to `ms`; returns false once both pipes reached EOF.
bool pump(Child& c, int ms) {
  std::vector<pollfd> fds;
  if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0});
  if (c.err_fd >= 0) fds.push_back({c.err_fd, POLLIN, 0});
  if (fds.empty()) return false;
  if (poll(fds.data(), fds.size(), ms) <= 0) return true;
  for (auto& p : fds) {
    if (!p.revents) continue;
    char buf[4096];
    ssize_t n = read(p.fd, buf, sizeof buf);
    std::string& sink = p.fd == c.out_fd ? c.out : c.err;
    if (n > 0) {
      sink.append(buf, static_cast<size_t>(n));
    } else {
      close(p.fd);
      (p.fd == c.out_fd ? c.out_fd : c.err_fd) = -1;
    }
  }
  return true;
}

// Waits for exit (killing it after `timeout_s`, which fails the test) and collects output.
Result finish(Child& c, double timeout_s = 20) {
  auto deadline = c.start + std::chrono::milliseconds(static_cast<int>(timeout_s * 1000));
  while (pump(c, 50)) {
    if (Clock::now() > deadline) {
      kill(c.pid, SIGKILL);
      FAIL_CHECK("titan-run did not finish within " << timeout_s << " s");
      deadline = Clock::now() + std::chrono::hours(1);
    }
  }
  Result r;
  waitpid(c.pid, &r.status, 0);
  r.out = c.out;
  r.err = c.err;
  r.seconds = std::chrono::duration<double>(Clock::now() - c.start).count();
  return r;
}

Result run_titan(const std::vector<std::string>& args,
                 const std::map<std::string, std::string>& env = {}) {
  Child c = start_titan_run(args, env);
  return finish(c);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// All numbers following `tag ` in the text, e.g. tag "pid" in "[rank 0] pid 123".
std::vector<pid_t> numbers_after(const std::string& text, const std::string& tag) {
  std::vector<pid_t> pids;
  std::regex re(tag + " ([0-9]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    pids.push_back(static_cast<pid_t>(std::stol((*it)[1].str())));
  }
  return pids;
}

// A zombie counts as gone: it is dead, only waiting for whoever adopted it to reap it.
bool process_alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto paren = line.rfind(')');
  char state = paren != std::string::npos && paren + 2 < line.size() ? line[paren + 2] : '?';
  return state != 'Z' && state != 'X';
}

bool all_gone_within(const std::vector<pid_t>& pids, double seconds) {
  auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  for (;;) {
    bool any = false;
    for (pid_t p : pids) any = any || process_alive(p);
    if (!any) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

const std::string kShowEnv =
    "echo \"R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK "
    "A=$MASTER_ADDR P=$MASTER_PORT\"";

}  // namespace

TEST_CASE("titan-run gives each rank torchrun's environment and prefixes its lines", "[launcher]") {
  Result r = run_titan({"--nproc-per-node", "2", "--", "/bin/sh", "-c", kShowEnv + "; echo to-stderr >&2"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  REQUIRE(r.exit_code() == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex(R"(\[rank 0\] R=0 L=0 W=2 LW=2 G=0 A=127\.0\.0\.1 P=([0-9]+))")));
  int port = std::stoi(m[1].str());
  CHECK(port > 0);
  CHECK(contains(r.out, "[rank 1] R=1 L=1 W=2 LW=2 G=0 A=127.0.0.1 P=" + std::to_string(port) + "\n"));
  CHECK(contains(r.err, "[rank 0] to-stderr\n"));
  CHECK(contains(r.err, "[rank 1] to-stderr\n"));
  CHECK_FALSE(contains(r.out, "to-stderr"));
}

TEST_CASE("titan-run accepts torchrun spellings and a command without '--'", "[launcher]") {
  Result r = run_titan({"--nproc_per_node=2", "--master_port=29999", "--no-python", "/bin/sh", "-c",
                        "echo \"R=$RANK P=$MASTER_PORT\"; printf 'no newline'"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  REQUIRE(r.exit_code() == 0);
  CHECK(contains(r.out, "[rank 0] R=0 P=29999\n"));
  CHECK(contains(r.out, "[rank 1] R=1 P=29999\n"));
  CHECK(contains(r.out, "[rank 1] no newline\n"));  // a last partial line is not lost
}

TEST_CASE("a failing rank stops the job: exit code, message, last lines, no process left",
          "[launcher]") {
  // Rank 0 runs a grandchild (sleep) too: stopping must take the rank's whole process group.
  Result r = run_titan(
      {"--nproc-per-node", "2", "--", "/bin/sh", "-c",
       "echo \"pid $$\"; if [ \"$RANK\" = 1 ]; then sleep 0.5; echo \"rank 1 gives up\"; exit 3; fi; "
       "sleep 60 & echo \"pid $!\"; wait"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code() == 3);
  CHECK(r.seconds < 5);
  CHECK(contains(r.err, "rank 1 (local 1, pid "));
  CHECK(contains(r.err, ") exited with code 3"));
  CHECK(contains(r.err, "[rank 1] rank 1 gives up"));  // its last lines, in the report
  auto pids = numbers_after(r.out, "pid");
  REQUIRE(pids.size() == 3);
  CHECK(all_gone_within(pids, 2.0));
}

TEST_CASE("a rank killed by a signal is named with the signal", "[launcher]") {
  Result r = run_titan({"--nproc-per-node", "2", "--", "/bin/sh", "-c",
                        "if [ \"$RANK\" = 0 ]; then sleep 0.2; kill -9 $$; fi; exec sleep 60"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code() == 128 + 9);
  CHECK(r.seconds < 5);
  CHECK(contains(r.err, "rank 0 (local 0, pid "));
  CHECK(contains(r.err, "was killed by signal 9 (SIGKILL)"));
}

TEST_CASE("a rank that ignores SIGTERM is SIGKILLed after the grace period", "[launcher]") {
  Result r = run_titan({"--nproc-per-node", "2", "--kill-grace-seconds", "0.5", "--", "/bin/sh", "-c",
                        "if [ \"$RANK\" = 1 ]; then sleep 0.5; exit 4; fi; trap '' TERM; echo \"pid $$\"; "
                        "sleep 60 & echo \"pid $!\"; wait"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code() == 4);
  CHECK(r.seconds < 5);
  CHECK(contains(r.err, "sending SIGKILL to the remaining ranks"));
  CHECK(contains(r.err, "rank 0 (local 0, pid "));
  auto pids = numbers_after(r.out, "pid");
  CHECK(all_gone_within(pids, 2.0));
}

TEST_CASE("SIGINT to titan-run is forwarded to every rank", "[launcher]") {
  Child c = start_titan_run({"--nproc-per-node", "2", "--", "/bin/sh", "-c",
                             "trap 'echo \"got INT\"; exit 7' INT; echo ready; sleep 60 & wait"});
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!contains(c.out, "[rank 0] ready") || !contains(c.out, "[rank 1] ready")) {
    REQUIRE(Clock::now() < deadline);
    pump(c, 20);
  }
  kill(c.pid, SIGINT);
  Result r = finish(c);
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code() == 128 + SIGINT);
  CHECK(contains(r.out, "[rank 0] got INT"));
  CHECK(contains(r.out, "[rank 1] got INT"));
  CHECK(contains(r.err, "received SIGINT"));
}

TEST_CASE("ranks die with titan-run when it is SIGKILLed (PR_SET_PDEATHSIG)", "[launcher]") {
  Child c = start_titan_run({"--nproc-per-node", "2", "--", "/bin/sh", "-c", "echo \"pid $$\"; exec sleep 60"});
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (numbers_after(c.out, "pid").size() < 2) {
    REQUIRE(Clock::now() < deadline);
    pump(c, 20);
  }
  auto pids = numbers_after(c.out, "pid");
  kill(c.pid, SIGKILL);
  Result r = finish(c);
  CHECK(r.exit_code() == 128 + 9);
  CHECK(all_gone_within(pids, 3.0));
}

// The case PR_SET_PDEATHSIG cannot cover: titan-train as the grandchild of a `sh -c` wrapper.
// sh dies of its pdeathsig; titan-train must see the watchdog pipe close (Note [Launcher
// watchdog pipe] in launcher/launcher.cpp) and exit, whatever it is doing (starting up, waiting
// in the rendezvous or training: it is killed as soon as both pids are known).
TEST_CASE("titan-train behind a sh -c wrapper dies with titan-run when it is SIGKILLed", "[launcher]") {
  const std::string dump = (std::filesystem::temp_directory_path() /
                            ("titan_launcher_wrapped_" + std::to_string(getpid()))).string();
  const std::string train = std::string(TITAN_TRAIN_PATH) +
                            " --training.steps 1000000 --training.seq_len 16 --training.local_batch_size 1"
                            " --metrics.log_freq 1000 --job.dump_folder " + dump;
  Child c = start_titan_run({"--nproc-per-node", "2", "--", "/bin/sh", "-c",
                             train + " & echo \"train $!\"; wait; echo \"sh still here\""});
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (numbers_after(c.out, "train").size() < 2) {
    REQUIRE(Clock::now() < deadline);
    pump(c, 20);
  }
  auto pids = numbers_after(c.out, "train");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let them get into main()
  kill(c.pid, SIGKILL);
  Result r = finish(c);
  CHECK(r.exit_code() == 128 + 9);
  // A generous deadline for "does not keep running": the watcher reacts within milliseconds.
  const bool gone = all_gone_within(pids, 10.0);
  CHECK(gone);
  for (pid_t p : pids)
    if (process_alive(p)) kill(p, SIGKILL);  // never leave a trainer behind, even on failure
  std::filesystem::remove_all(dump);
}

TEST_CASE("LOG_RANK and --local-ranks-filter choose whose lines are shown", "[launcher]") {
  const std::vector<std::string> cmd = {"/bin/sh", "-c", "echo \"hello from $RANK\""};
  std::vector<std::string> args = {"--nproc-per-node", "3", "--"};
  args.insert(args.end(), cmd.begin(), cmd.end());
  Result by_env = run_titan(args, {{"LOG_RANK", "1,2"}});
  INFO("stdout:\n" << by_env.out << "stderr:\n" << by_env.err);
  CHECK(by_env.exit_code() == 0);
  CHECK_FALSE(contains(by_env.out, "[rank 0]"));
  CHECK(contains(by_env.out, "[rank 1] hello from 1"));
  CHECK(contains(by_env.out, "[rank 2] hello from 2"));

  std::vector<std::string> flag_args = {"--nproc-per-node", "3", "--local-ranks-filter", "0", "--"};
  flag_args.insert(flag_args.end(), cmd.begin(), cmd.end());
  Result by_flag = run_titan(flag_args, {{"LOG_RANK", "1"}});  // the flag wins
  CHECK(by_flag.exit_code() == 0);
  CHECK(by_flag.out == "[rank 0] hello from 0\n");

  // A hidden rank's failure is still reported with its last lines.
  Result hidden = run_titan({"--nproc-per-node", "2", "--local-ranks-filter", "0", "--", "/bin/sh",
                             "-c", "if [ \"$RANK\" = 1 ]; then echo \"secret\"; exit 5; fi"});
  CHECK(hidden.exit_code() == 5);
  CHECK_FALSE(contains(hidden.out, "secret"));
  CHECK(contains(hidden.err, "[rank 1] secret"));
}

TEST_CASE("two titan-run processes as two nodes number ranks 0..3", "[launcher]") {
  const std::string port = std::to_string(tl::pick_free_port());
  std::vector<Child> nodes;
  for (const char* node_rank : {"0", "1"}) {
    nodes.push_back(start_titan_run({"--nnodes", "2", "--node-rank", node_rank, "--nproc-per-node",
                                     "2", "--master-addr", "127.0.0.1", "--master-port", port,
                                     "--", "/bin/sh", "-c", kShowEnv}));
  }
  std::string all;
  for (Child& c : nodes) {
    Result r = finish(c);
    INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
    CHECK(r.exit_code() == 0);
    all += r.out;
  }
  INFO(all);
  for (int rank = 0; rank < 4; ++rank) {
    std::string want = "[rank " + std::to_string(rank) + "] R=" + std::to_string(rank) + " L=" +
                       std::to_string(rank % 2) + " W=4 LW=2 G=" + std::to_string(rank / 2) +
                       " A=127.0.0.1 P=" + port + "\n";
    CHECK(contains(all, want));
  }
}

TEST_CASE("titan-run rejects bad command lines with exit code 2, naming the flag", "[launcher]") {
  Result typo = run_titan({"--nproc-per-nod", "2", "--", "true"});
  CHECK(typo.exit_code() == 2);
  CHECK(contains(typo.err, "unknown flag '--nproc-per-nod' (did you mean --nproc-per-node?)"));

  Result bad_value = run_titan({"--nproc-per-node", "two", "--", "true"});
  CHECK(bad_value.exit_code() == 2);
  CHECK(contains(bad_value.err, "--nproc-per-node expects an integer"));
  CHECK(contains(bad_value.err, "'two'"));

  Result no_command = run_titan({"--nproc-per-node", "2"});
  CHECK(no_command.exit_code() == 2);
  CHECK(contains(no_command.err, "no command to run"));

  Result missing = run_titan({"--", "/nonexistent/trainer"});
  CHECK(missing.exit_code() == 127);
  CHECK(contains(missing.err, "cannot execute '/nonexistent/trainer'"));
  CHECK(contains(missing.err, "rank 0 (local 0, pid "));
}

TEST_CASE("parse_launch_args", "[launcher]") {
  auto o = tl::parse_launch_args({"--nproc_per_node", "4", "--nnodes=2", "--node-rank", "1",
                                  "--rdzv-endpoint", "head:1234", "--rdzv_backend", "c10d",
                                  "--role", "rank", "--tee", "3", "--local-ranks-filter", "0,3",
                                  "--kill-grace-seconds", "1.5", "titan-train", "--job.x", "--",
                                  "y"});
  CHECK(o.nproc_per_node == 4);
  CHECK(o.nnodes == 2);
  CHECK(o.node_rank == 1);
  CHECK(o.master_addr == "head");
  CHECK(o.master_port == 1234);
  CHECK(*o.local_ranks_filter == std::vector<int>{0, 3});
  CHECK(o.kill_grace_seconds == 1.5);
  // Everything from the first non-flag on belongs to the trainer, "--" included.
  CHECK(o.command == std::vector<std::string>{"titan-train", "--job.x", "--", "y"});

  auto s = tl::parse_launch_args({"--standalone", "--nproc-per-node=2", "--", "a"});
  CHECK(s.master_addr == "127.0.0.1");
  CHECK_FALSE(s.master_port.has_value());  // -> a free port at launch
  auto v6 = tl::parse_launch_args({"--rdzv-endpoint", "[::1]:29400", "a"});
  CHECK(v6.master_addr == "::1");
  CHECK(v6.master_port == 29400);

  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(tl::parse_launch_args({"--node-rank", "2", "--nnodes", "2", "a"}),
                    Contains("--node-rank 2 must be < --nnodes 2"));
  CHECK_THROWS_WITH(tl::parse_launch_args({"--nnodes", "2", "--master-port", "0", "a"}),
                    Contains("single node only"));
  CHECK_THROWS_WITH(tl::parse_launch_args({"--nnodes", "1:4", "a"}), Contains("elastic"));
  CHECK_THROWS_WITH(tl::parse_launch_args({"--local-ranks-filter", "0,2", "a"}),
                    Contains("local rank 2"));
  CHECK_THROWS_WITH(tl::parse_launch_args({"--local-ranks-filter", "0,x", "a"}),
                    Contains("'0,x'"));
  CHECK_THROWS_WITH(tl::parse_launch_args({"--standalone=1", "a"}), Contains("takes no value"));
  CHECK_THROWS_WITH(tl::parse_launch_args({"--master-addr"}), Contains("--master-addr needs a value"));
  CHECK_THROWS_AS(tl::parse_launch_args({"-n", "2", "a"}), tl::UsageError);
  CHECK(tl::parse_launch_args({"--max-restarts", "3", "a"}).max_restarts == 3);
  CHECK(tl::parse_launch_args({"a"}).max_restarts == 0);
  CHECK_THROWS_WITH(tl::parse_launch_args({"--max-restarts", "-1", "a"}), Contains("--max-restarts"));
  CHECK(tl::parse_launch_args({"--nnodes", "2", "--max-restarts", "1", "a"}).max_restarts == 1);
  CHECK(tl::parse_launch_args({"--rdzv-conf", "join_timeout=30,read_timeout=60", "a"}).join_timeout_seconds == 30);
  CHECK(tl::parse_launch_args({"a"}).join_timeout_seconds == 600);
  CHECK_THROWS_WITH(tl::parse_launch_args({"--rdzv-conf", "join_timeout=soon", "a"}),
                    Contains("rdzv-conf join_timeout") && Contains("'soon'"));
  CHECK_THROWS_WITH(tl::parse_launch_args({"--rdzv-conf", "jion_timeout=3", "a"}), Contains("'jion_timeout'"));
}

TEST_CASE("max restarts: a failed attempt starts every rank again with the next TORCHELASTIC_RESTART_COUNT",
          "[launcher]") {
  // Rank 1 fails in attempts 0 and 1, attempt 2 succeeds: 2 restarts of the allowed 3.
  Result r = run_titan({"--nproc-per-node", "2", "--max-restarts", "3", "--", "/bin/sh", "-c",
                        "echo \"attempt $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS\"; "
                        "[ \"$RANK\" = 0 ] || [ \"$TORCHELASTIC_RESTART_COUNT\" = 2 ] || exit 3"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code() == 0);
  CHECK(contains(r.out, "[rank 1] attempt 0 of 3\n"));
  CHECK(contains(r.out, "[rank 1] attempt 2 of 3\n"));
  CHECK(contains(r.err, "titan-run: restart 1 of 3: rank 1 (node 0) exited with code 3 before any step was logged"));
  CHECK(contains(r.err, "titan-run: restart 2 of 3: rank 1 (node 0) exited with code 3"));
  CHECK(contains(r.err, "titan-run: the job finished after 2 restarts"));
  // Exhausted: the last failure's code, every failure listed.
  Result e = run_titan({"--nproc-per-node", "1", "--max-restarts", "1", "--", "/bin/sh", "-c", "exit 5"});
  CHECK(e.exit_code() == 5);
  CHECK(contains(e.err, "titan-run: giving up: the job failed 2 times (--max-restarts 1)"));
  CHECK(contains(e.err, "attempt 0: rank 0 (node 0) exited with code 5"));
  CHECK(contains(e.err, "attempt 1: rank 0 (node 0) exited with code 5"));
}

// Note [Restarts across nodes]: two titan-runs as two nodes, one rank each; node 1's rank fails
// in attempt 0 only. Both nodes restart (node 0's rank was waiting, as in a collective) and both
// name the same failure.
TEST_CASE("max restarts across two nodes: a failure on node 1 restarts both, each names it", "[launcher]") {
  const std::string port = std::to_string(tl::pick_free_port());
  std::vector<Child> nodes;
  for (const char* node_rank : {"0", "1"}) {
    nodes.push_back(start_titan_run(
        {"--nnodes", "2", "--node-rank", node_rank, "--nproc-per-node", "1", "--master-port", port,
         "--max-restarts", "2", "--kill-grace-seconds", "1", "--", "/bin/sh", "-c",
         "echo \"attempt $TORCHELASTIC_RESTART_COUNT store $MASTER_PORT\"; "
         "if [ \"$RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then sleep 0.5; exit 4; fi; "
         "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then sleep 60; fi"}));
  }
  std::vector<Result> results;
  for (Child& c : nodes) results.push_back(finish(c));
  for (const Result& r : results) {
    INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
    CHECK(r.exit_code() == 0);
    CHECK(contains(r.err, "titan-run: restart 1 of 2: rank 1 (node 1) exited with code 4 before any step was logged"));
    CHECK(contains(r.err, "titan-run: the job finished after 1 restart"));
    CHECK(r.seconds < 15);  // node 0's rank was stopped, not waited for (it sleeps 60 s)
  }
  CHECK(contains(results[0].out, "[rank 0] attempt 1 store "));
  CHECK(contains(results[1].out, "[rank 1] attempt 1 store "));
  // Node 0 stopped its rank for node 1's failure (the begin_stop line names it).
  CHECK(contains(results[0].err, "titan-run: rank 1 (node 1) exited with code 4; sending SIGTERM to the 1 running rank"));
  // The trainers' store moves to a fresh port each attempt; titan-run keeps --master-port.
  CHECK_FALSE(contains(results[0].out, "store " + port + "\n"));
}

TEST_CASE("max restarts across nodes: a node that never joins, and node 0 gone, end the job naming it", "[launcher]") {
  const std::string port = std::to_string(tl::pick_free_port());
  Result alone = run_titan({"--nnodes", "2", "--node-rank", "0", "--master-port", port, "--max-restarts", "1",
                            "--rdzv-conf", "join_timeout=1", "--", "true"});
  CHECK(alone.exit_code() != 0);
  CHECK(contains(alone.err, "node 1 did not join within 1 s (--rdzv-conf join_timeout); ending the job"));

  Result orphan = run_titan({"--nnodes", "2", "--node-rank", "1", "--master-port", port, "--max-restarts", "1",
                             "--rdzv-conf", "join_timeout=1", "--", "true"});
  CHECK(orphan.exit_code() != 0);
  CHECK(contains(orphan.err, "node 1 could not reach node 0's titan-run at 127.0.0.1:" + port + " within 1 s"));

  // Node 0's titan-run killed mid-attempt: node 1 stops its rank and ends, naming node 0.
  std::vector<Child> nodes;
  for (const char* node_rank : {"0", "1"})
    nodes.push_back(start_titan_run({"--nnodes", "2", "--node-rank", node_rank, "--master-port", port,
                                     "--max-restarts", "1", "--kill-grace-seconds", "1", "--", "/bin/sh", "-c",
                                     "echo started; sleep 60"}));
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline && !contains(nodes[1].out, "started")) pump(nodes[1], 20);
  kill(nodes[0].pid, SIGKILL);
  finish(nodes[0]);
  Result r1 = finish(nodes[1]);
  INFO("stderr:\n" << r1.err);
  CHECK(r1.exit_code() != 0);
  CHECK(contains(r1.err, "node 0's titan-run is gone"));
  CHECK(r1.seconds < 15);
}

namespace {

tl::EnvLookup env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace

TEST_CASE("world_from_env: torchrun variables", "[world]") {
  auto w = tl::world_from_env(env_of({{"RANK", "5"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"},
                                      {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"},
                                      {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}}));
  CHECK(w.rank == 5);
  CHECK(w.local_rank == 1);
  CHECK(w.world_size == 8);
  CHECK(w.local_world_size == 4);
  CHECK(w.group_rank == 1);
  CHECK(w.master_addr == "10.0.0.1");
  CHECK(w.master_port == 1234);
  CHECK(w.from_env);
  CHECK(tl::describe(w) == "rank 5/8 (local 1/4, node 1) master 10.0.0.1:1234 [from environment]");

  auto minimal = tl::world_from_env(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  CHECK(minimal.local_rank == 1);
  CHECK(minimal.local_world_size == 2);
  CHECK(minimal.master_addr == "127.0.0.1");
  CHECK(minimal.master_port == 29500);

  auto none = tl::world_from_env(env_of({}));
  CHECK(none.rank == 0);
  CHECK(none.world_size == 1);
  CHECK_FALSE(none.from_env);

  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(tl::world_from_env(env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
                    Contains("RANK=2 must be in [0, WORLD_SIZE) with WORLD_SIZE=2"));
  CHECK_THROWS_WITH(tl::world_from_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "two"}})),
                    Contains("WORLD_SIZE='two' is not an integer"));
  CHECK_THROWS_WITH(tl::world_from_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "8x"}})),
                    Contains("MASTER_PORT='8x'"));
  CHECK_THROWS_WITH(tl::world_from_env(env_of({{"RANK", "0"}})), Contains("WORLD_SIZE is not"));
  CHECK_THROWS_WITH(tl::world_from_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"},
                                               {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})),
                    Contains("LOCAL_RANK=2"));
  CHECK_THROWS_WITH(tl::world_from_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "4"},
                                               {"LOCAL_WORLD_SIZE", "2"}})),
                    Contains("MASTER_ADDR is not set"));
}

TEST_CASE("world_from_env: Slurm fallback", "[world]") {
  auto w = tl::world_from_env(env_of({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"},
                                      {"SLURM_LOCALID", "2"}, {"SLURM_NODEID", "1"},
                                      {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                      {"SLURM_NODELIST", "node[01-04,07],gpu5"}}));
  CHECK(w.rank == 6);
  CHECK(w.world_size == 8);
  CHECK(w.local_rank == 2);
  CHECK(w.local_world_size == 4);
  CHECK(w.group_rank == 1);
  CHECK(w.master_addr == "node01");
  CHECK(w.master_port == 29500);
  CHECK(w.from_env);

  auto per_node = tl::world_from_env(env_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"},
                                             {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "2"},
                                             {"SLURM_JOB_NODELIST", "a1"}, {"MASTER_PORT", "777"}}));
  CHECK(per_node.local_world_size == 2);
  CHECK(per_node.master_addr == "a1");
  CHECK(per_node.master_port == 777);

  // torchrun's variables win over Slurm's (titan-run started by srun).
  auto both = tl::world_from_env(env_of({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"},
                                         {"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  CHECK(both.rank == 0);
  CHECK(both.world_size == 1);

  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(tl::world_from_env(env_of({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"},
                                               {"SLURM_NODELIST", "n1"}})),
                    Contains("SLURM_PROCID=4"));
  CHECK_THROWS_WITH(tl::world_from_env(env_of({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "4"}})),
                    Contains("SLURM_PROCID='x'"));
}

TEST_CASE("Slurm nodelist and tasks-per-node parsing", "[world]") {
  using V = std::vector<std::string>;
  CHECK(tl::expand_slurm_nodelist("node[01-04,07],gpu5") ==
        V{"node01", "node02", "node03", "node04", "node07", "gpu5"});
  CHECK(tl::expand_slurm_nodelist("single") == V{"single"});
  CHECK(tl::expand_slurm_nodelist("a[9-11]") == V{"a9", "a10", "a11"});
  CHECK(tl::expand_slurm_nodelist("r[1-2]n[08-09]-ib") == V{"r1n08-ib", "r1n09-ib", "r2n08-ib", "r2n09-ib"});
  CHECK(tl::expand_slurm_nodelist("x,y[3]") == V{"x", "y3"});
  CHECK_THROWS(tl::expand_slurm_nodelist("node[01-"));
  CHECK_THROWS(tl::expand_slurm_nodelist("node[4-2]"));
  CHECK_THROWS(tl::expand_slurm_nodelist("node[a-b]"));

  CHECK(tl::slurm_tasks_on_node("2(x3),1", 0) == 2);
  CHECK(tl::slurm_tasks_on_node("2(x3),1", 2) == 2);
  CHECK(tl::slurm_tasks_on_node("2(x3),1", 3) == 1);
  CHECK(tl::slurm_tasks_on_node("8", 0) == 8);
  CHECK_THROWS_WITH(tl::slurm_tasks_on_node("2(x3),1", 4), Catch::Matchers::Contains("SLURM_NODEID=4"));
}
