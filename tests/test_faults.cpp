// Fault handling of titan's writers and of a stalled rank: every file is whole or absent after a
// write that fails half-way, and the error names the file and the errno text; lost metrics are
// reported; a stopped rank ends the job with the flight recorder's files.
//
// A full disk without root: RLIMIT_FSIZE (soft limit, raised back afterwards, SIGXFSZ ignored)
// makes any write past the limit fail with EFBIG ("File too large") after a short write, which
// is exactly what a disk filling mid-file does (a short write, then ENOSPC).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "data/tiktoken_file.h"
#include "data/token_shard.h"
#include "tests/temp_dir.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/observe/memory_snapshot.h"
#include "trainer/observe/metrics.h"
#include "trainer/observe/profiling.h"
#include "trainer/observe/tensorboard.h"
#include "trainer/signals.h"
#include "util/atomic_file.h"

#if !defined(TITAN_RUN_PATH) || !defined(TITAN_TRAIN_PATH)
#error "TITAN_RUN_PATH and TITAN_TRAIN_PATH must be defined by the build"
#endif

namespace fs = std::filesystem;
using namespace titan::trainer;
using namespace titan::data;
using namespace titan::trainer::checkpoint;
using namespace titan::trainer::config;
using namespace titan::trainer::observe;

namespace {

// Files may grow to `bytes` at most while this lives (a disk that is full at that size).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);  // else the write kills the process
    rlimit limited = saved_;
    limited.rlim_cur = std::min<rlim_t>(bytes, saved_.rlim_max);
    REQUIRE(setrlimit(RLIMIT_FSIZE, &limited) == 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  void (*old_handler_)(int) = SIG_DFL;
};

// Every file name under `dir`, recursively, relative to it.
std::vector<std::string> files_under(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The error of `write`, which must throw.
template <typename F>
std::string error_of(F&& write) {
  try {
    write();
  } catch (const std::exception& e) {
    return e.what();
  }
  FAIL("expected the write to fail");
  return "";
}

}  // namespace

TEST_CASE("atomic writer: whole file or nothing, the old file kept, the error names path and errno",
          "[faults]") {
  const fs::path dir = titan::testing::fresh_temp_dir("faults_atomic");
  const std::string path = (dir / "out.bin").string();
  titan::util::write_file_atomic(path, "old contents");
  const std::string big(64 * 1024, 'x');
  std::string message;
  {
    FileSizeLimit full(16 * 1024);  // the disk fills after 16 KiB of the 64 KiB
    message = error_of([&] { titan::util::write_file_atomic(path, big); });
  }
  INFO(message);
  CHECK(contains(message, path));
  CHECK(contains(message, "File too large"));  // EFBIG's text; a real full disk: ENOSPC's
  CHECK(read_text(path) == "old contents");     // untouched
  CHECK(files_under(dir) == std::vector<std::string>{"out.bin"});  // no temporary left

  // An exception from a streaming writer's caller: the destructor removes the temporary file.
  CHECK_THROWS(([&] {
    titan::util::AtomicFile f((dir / "new.bin").string());
    f.write("half");
    throw std::runtime_error("caller failed");
  }()));
  CHECK(files_under(dir) == std::vector<std::string>{"out.bin"});

  titan::util::write_file_atomic(path, big);  // and without the limit it is written whole
  CHECK(read_text(path) == big);
}

TEST_CASE("atomic writer: a second SIGTERM mid-write removes the temporary file", "[faults]") {
  const fs::path dir = titan::testing::fresh_temp_dir("faults_signal");
  const std::string path = (dir / "final.safetensors").string();
  // A child stands in for titan-train exporting: stop handlers installed, a write in flight,
  // then two SIGTERMs (the second one exits at once, Note [Temp files and signals]).
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    install_stop_handlers();
    titan::util::AtomicFile f(path);
    f.write("half of the weights");
    raise(SIGTERM);
    raise(SIGTERM);
    _exit(0);  // not reached
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  CHECK(files_under(dir).empty());
}

TEST_CASE("every writer under a full disk: error names the file, nothing partial or temporary",
          "[faults]") {
  const fs::path dir = titan::testing::fresh_temp_dir("faults_writers");
  std::vector<int32_t> tokens(100000, 7);

  SECTION("safetensors (HF export, checkpoint shards)") {
    std::vector<std::pair<std::string, at::Tensor>> tensors = {{"w", at::ones({256, 256})}};
    const std::string path = (dir / "model-00001-of-00001.safetensors").string();
    FileSizeLimit full(64 * 1024);
    const std::string message = error_of([&] { save_safetensors(path, tensors); });
    CHECK(contains(message, path));
    CHECK(contains(message, "File too large"));
  }
  SECTION("token shard (titan-tokenize)") {
    const std::string path = (dir / "tokens.bin").string();
    FileSizeLimit full(4096);
    const std::string message = error_of([&] { write_token_shard(path, tokens, 256); });
    CHECK(contains(message, path));
    CHECK(contains(message, "File too large"));
  }
  SECTION("tiktoken file (titan-tokenize --train-bpe)") {
    std::vector<std::string> vocab;
    for (int i = 0; i < 5000; ++i) vocab.push_back("token" + std::to_string(i));
    const std::string path = (dir / "bpe.model").string();
    FileSizeLimit full(4096);
    const std::string message = error_of([&] { write_tiktoken_file(path, vocab); });
    CHECK(contains(message, path));
  }
  SECTION("memory snapshot (also the OOM exit snapshot)") {
    start_memory_recording(c10::Device(c10::kCPU));
    at::Tensor keep = at::randn({1000, 100});  // something to record
    FileSizeLimit full(16);  // smaller than any pickle
    const std::string message =
        error_of([&] { write_memory_snapshot(c10::Device(c10::kCPU), (dir / "snap").string(), 0, "test"); });
    CHECK(contains(message, "rank0_memory_snapshot"));
    CHECK(contains(message, "File too large"));
  }
  SECTION("profiler trace") {
    ProfilingSection cfg;
    cfg.enable_profiling = true;
    cfg.profile_freq = 2;
    cfg.profiler_warmup = 1;
    cfg.profiler_active = 1;
    StepProfiler profiler(cfg, dir.string(), 0, c10::Device(c10::kCPU));
    for (int64_t step = 1; step <= 2; ++step) {
      profiler.step_begin(step);
      at::Tensor y = at::randn({64, 64}).mm(at::randn({64, 64}));
      if (step == 2) {
        FileSizeLimit full(256);
        const std::string message = error_of([&] { profiler.step_end(step); });
        INFO(message);
        CHECK(contains(message, "rank0_trace.json"));
      } else {
        profiler.step_end(step);
      }
    }
  }
  INFO("left behind: " << files_under(dir).size() << " files");
  CHECK(files_under(dir).empty());  // no final file, no .tmp, no kineto .json.tmp
}

TEST_CASE("metrics and TensorBoard records are whole or absent; lost metrics are reported", "[faults]") {
  const fs::path dir = titan::testing::fresh_temp_dir("faults_metrics");
  const std::string jsonl = (dir / "metrics.jsonl").string();
  MetricsLogger logger(c10::Device(c10::kCPU), 1e6, 0, 0, 1, jsonl);
  logger.set_tensorboard(std::make_unique<TensorBoardWriter>((dir / "tb").string()));
  StepMetrics m;
  m.step = 1;
  m.loss = 2.5;
  logger.log(m);
  CHECK(logger.lost_metrics().empty());
  const auto size_after_one = fs::file_size(jsonl);
  {
    FileSizeLimit full(size_after_one + 20);  // the next line (~250 bytes) is cut after 20
    m.step = 2;
    logger.log(m);
  }
  INFO(logger.lost_metrics());
  CHECK(contains(logger.lost_metrics(), "metrics lost from step 2"));
  CHECK(fs::file_size(jsonl) == size_after_one);  // the cut line was removed again
  m.step = 3;
  logger.log(m);  // the disk has room again: later lines are whole and parse
  std::ifstream in(jsonl);
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) steps.push_back(nlohmann::json::parse(line).at("step"));
  CHECK(steps == std::vector<int64_t>{1, 3});
  CHECK(contains(logger.lost_metrics(), "metrics lost from step 2"));
}

namespace {

struct Job {
  pid_t pid = -1;
  fs::path log;
};

// titan-run with 2 ranks of a tiny titan-train (each rank through `sh -c` so that its pid is
// printed), output to `log`.
Job start_job(const fs::path& dump, const std::string& extra) {
  Job job;
  job.log = dump / "job.log";
  const std::string train = std::string(TITAN_TRAIN_PATH) +
                            " --training.steps 1000 --training.seq_len 16 --training.local_batch_size 1"
                            " --parallelism.data_parallel_shard_degree 2 --comm.train_timeout_seconds 3"
                            " --metrics.log_freq 1 --job.dump_folder " + dump.string() + " " + extra;
  const std::string command = std::string(TITAN_RUN_PATH) + " --nproc-per-node 2 --local-ranks-filter 0,1 --kill-grace-seconds 2 -- /bin/sh -c '" +
                              "echo \"pid $$\"; exec " + train + "' > " + job.log.string() + " 2>&1";
  job.pid = fork();
  REQUIRE(job.pid >= 0);
  if (job.pid == 0) {
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return job;
}

// Waits for the job; a generous deadline only guards against a hang (the test then fails).
int finish_job(Job& job, double deadline_s = 120) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(deadline_s * 1000));
  int status = 0;
  while (waitpid(job.pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(job.pid, SIGKILL);
      waitpid(job.pid, &status, 0);
      FAIL_CHECK("the job did not end within " << deadline_s << " s");
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The survivor's flight recorder: some collective of the world/FSDP group is not completed, and
// the job-level error names it.
void check_flight_recorder(const fs::path& dump, const std::string& log) {
  INFO(log);
  CHECK(contains(log, "[rank 0]"));
  CHECK(contains(log, "timed out after"));
  CHECK(std::regex_search(log, std::regex("collective [a-z_()]+ #[0-9]+")));  // op and seq
  CHECK(contains(log, "flight recorder"));
  const fs::path trace = dump / "comm_trace" / "rank0.json";
  REQUIRE(fs::exists(trace));
  const auto doc = nlohmann::json::parse(read_text(trace));
  CHECK(doc.at("rank") == 0);
  int not_completed = 0, timed_out = 0;
  for (const auto& e : doc.at("entries")) {
    not_completed += e.at("state") != "completed";
    timed_out += e.at("state") == "timed-out";
  }
  // At least the one that failed the step; with overlap, a prefetched collective in flight
  // beside it times out in its own wait() too (and rewrites the file, whole).
  CHECK(timed_out >= 1);
  CHECK(not_completed >= 1);
  // The groups' summary, what a user reads first, shows where it stopped: some group issued
  // collectives it never completed, and each timed-out collective lies in that stuck stretch of
  // its group (issued, and not below the group's last completed one). The stopped rank joined
  // none of them, so no later collective of the group can have completed either.
  const auto& groups = doc.at("groups");
  int stuck_groups = 0;
  for (const auto& [group, g] : groups.items()) {
    INFO("group " << group << ": " << g.dump());
    stuck_groups += g.at("last_issued").get<uint64_t>() > g.at("last_completed").get<uint64_t>();
  }
  CHECK(stuck_groups >= 1);
  for (const auto& e : doc.at("entries")) {
    if (e.at("state") != "timed-out") continue;
    INFO("timed-out entry " << e.dump());
    const auto& g = groups.at(e.at("group").get<std::string>());
    const uint64_t seq = e.at("seq").get<uint64_t>();
    CHECK(g.at("last_completed").get<uint64_t>() < seq);
    CHECK(g.at("last_issued").get<uint64_t>() >= seq);
  }
  CHECK_FALSE(fs::exists(dump / "comm_trace" / "rank1.json"));  // the stopped rank wrote nothing
}

}  // namespace

// ~10 s: start-up, two steps, the 3 s timeout, the launcher's 2 s grace.
TEST_CASE("a rank that stalls: the others time out naming op and seq, flight recorder written",
          "[faults][dist]") {
  const fs::path dump = titan::testing::fresh_temp_dir("faults_stall");
  Job job = start_job(dump, "--comm.debug_stall_at_step 3 --comm.debug_stall_rank 1");
  const int code = finish_job(job);
  const std::string log = read_text(job.log);
  CHECK(code != 0);
  check_flight_recorder(dump, log);
}

// The same with a real SIGSTOP in the middle of training (~10 s).
TEST_CASE("a rank that is SIGSTOPped: the job ends, the flight recorder shows where", "[faults][dist]") {
  const fs::path dump = titan::testing::fresh_temp_dir("faults_sigstop");
  Job job = start_job(dump, "");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  pid_t rank1 = -1;
  for (;;) {
    const std::string log = read_text(job.log);
    std::smatch m;
    if (rank1 < 0 && std::regex_search(log, m, std::regex("\\[rank 1\\] pid ([0-9]+)"))) rank1 = std::stoi(m[1]);
    if (rank1 > 0 && contains(log, "step:  3")) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(job.pid, SIGKILL);
      FAIL("training did not reach step 3:\n" << log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(kill(rank1, SIGSTOP) == 0);
  const int code = finish_job(job);
  kill(rank1, SIGKILL);  // in case the launcher did not (the test then fails above)
  const std::string log = read_text(job.log);
  CHECK(code != 0);
  check_flight_recorder(dump, log);
}
