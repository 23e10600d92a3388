// Hostile input at start-up: each row is one input that once crashed, hung, wrapped silently or
// trained without a word, with the exit status and the message it must now end with. Rows run
// the real titan-train as a subprocess (the whole program: config, start-up, top-level catch);
// checks of a library function alone come after the table.
//
// Every subprocess runs under `timeout -s KILL 120`: a regression that hangs (a FIFO read, a
// 10^9-host expansion, a start-up that ignores SIGTERM) fails the row with status 137 instead of
// hanging the suite. 120 s is a deadline for "does not hang", not a timing: every row here
// ends in well under a second of work once fixed (seconds on a loaded 2-core machine).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "launcher/launcher.h"
#include "launcher/world.h"
#include "model/flavors.h"
#include "tests/job_runs.h"
#include "tests/temp_dir.h"
#include "trainer/config/agreement.h"
#include "trainer/config/job_config.h"
#include "trainer/config/toml_file.h"
#include "trainer/observe/memory_estimate.h"

#if !defined(TITAN_RUN_PATH) || !defined(TITAN_TRAIN_PATH)
#error "TITAN_RUN_PATH and TITAN_TRAIN_PATH must be defined by the build"
#endif

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using titan::testing::run_job;

namespace {

const fs::path& scratch() {
  static const fs::path dir = titan::testing::fresh_temp_dir("test_bad_input");
  return dir;
}

// A one-step debug-model run that would finish in seconds: the rows add what makes it bad.
std::string tiny_run() {
  return "--training.steps 1 --training.seq_len 16 --training.local_batch_size 1 "
         "--training.num_threads 1 --metrics.peak_flops 1e12 --job.dump_folder " +
         (scratch() / "dump").string();
}

std::string write_text(const std::string& name, const std::string& text) {
  const fs::path path = scratch() / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

std::string make_fifo(const std::string& name) {
  const fs::path path = scratch() / name;
  fs::remove(path);
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  return path.string();
}

// "a0.a1. ... .a<n-1>": `[training.` + this + `]` (n = 100,000) segfaulted toml++.
std::string dotted_name(int n) {
  std::string text = "a0";
  for (int i = 1; i < n; ++i) text += ".a" + std::to_string(i);
  return text;
}

struct Row {
  const char* what;     // the input, as the report lists it
  std::string command;  // run by /bin/sh
  int exit_code;        // expected
  std::string message;  // a substring of the expected output
};

void check_row(const Row& row) {
  static int n = 0;
  const auto log = scratch() / ("row" + std::to_string(n++) + ".log");
  const auto r = run_job("timeout -s KILL 120 " + row.command, log);
  INFO(row.what << "\ncommand: " << row.command << "\noutput:\n" << r.log);
  CHECK(r.exit_code == row.exit_code);
  CHECK_THAT(r.log, Contains(row.message));
}

}  // namespace

TEST_CASE("bad config files end in one named error", "[bad_input]") {
  const std::string train = TITAN_TRAIN_PATH;
  const std::string tiny = tiny_run();
  std::string big(titan::trainer::config::kMaxConfigFileBytes + 1, '#');  // one comment line, one byte over the limit
  const std::vector<Row> rows = {
      {"100,000-deep dotted header (was: segfault in toml::parse)",
       train + " --job.config_file " + write_text("deep.toml", "[training." + dotted_name(100000) + "]\n") + " " + tiny, 2,
       "nests tables 100001 deep (dotted headers/keys and inline tables); the limit is 64"},
      {"a 63-component dotted key inside an inline table (65 deep)",
       train + " --job.config_file " +
           write_text("deep_key.toml", "[training]\nx = {" + dotted_name(63) + " = 1}\n") + " " + tiny,
       2, "nests tables 65 deep"},
      {"/dev/zero (was: killed after growing without bound, std::bad_alloc)",
       train + " --job.config_file /dev/zero " + tiny, 2,
       "config file '/dev/zero' is a character device, not a regular file"},
      {"/proc/self/mem (was: abort, uncaught std::ios_failure)",
       train + " --job.config_file /proc/self/mem " + tiny, 2,
       "cannot read config file '/proc/self/mem': Input/output error"},
      {"a FIFO (was: blocked forever in open)",
       train + " --job.config_file " + make_fifo("config.fifo") + " " + tiny, 2,
       "config.fifo' is a FIFO, not a regular file"},
      {"a directory", train + " --job.config_file " + scratch().string() + " " + tiny, 2,
       "is a directory; give a .toml file"},
      {"16 MiB + 1 byte", train + " --job.config_file " + write_text("big.toml", big) + " " + tiny, 2,
       "is larger than 16 MiB, the limit for a config file"},
  };
  for (const Row& row : rows) check_row(row);
}

TEST_CASE("numbers out of their type's or the machine's range are refused by name", "[bad_input]") {
  const std::string run = std::string(TITAN_TRAIN_PATH) + " " + tiny_run();
  const unsigned threads = std::thread::hardware_concurrency();
  const std::vector<Row> rows = {
      {"num_threads 100000 (was: ~1000 threads, never reached step 1)",
       run + " --training.num_threads 100000", 2,
       "training.num_threads = 100000 is more than this machine's " + std::to_string(threads) + " hardware threads"},
      {"num_threads 2^32+1 (was: wrapped to 1, trained)", run + " --training.num_threads 4294967297", 2,
       "training.num_threads = 4294967297 is out of range: must be in [0, 2147483647]"},
      {"steps 2^32+1", run + " --training.steps 4294967297", 2,
       "training.steps = 4294967297 is out of range: must be in [1, 2147483647]"},
      {"local_batch_size x seq_len past 2^63 (was: the dataset's 'fewer than one window')",
       run + " --training.local_batch_size 2000000000 --training.seq_len 2000000000", 2,
       "is more than 2^40 tokens per step"},
      {"float8.amax_history_len 10^12 (was: a 4 TB allocation failing at start-up)",
       run + " --float8.amax_history_len 1000000000000", 2,
       "float8.amax_history_len = 1000000000000 is out of range: must be in [1, 65536]"},
      {"comm.train_timeout_seconds near 2^63 ms (was: accepted; ms overflow int64)",
       run + " --comm.train_timeout_seconds 9223372036854775", 2,
       "comm.train_timeout_seconds = 9223372036854775 is out of range: must be in [1, 2592000]"},
      {"job.dump_folder = \"\" (was: filesystem error: Invalid argument [])",
       run + " --job.dump_folder ''", 2, "job.dump_folder is empty; give a path"},
      {"local_batch_size 100000 (was: DefaultCPUAllocator: can't allocate memory: ... 3276800000 bytes)",
       run + " --training.local_batch_size 100000", 2,
       "GiB for training.local_batch_size 100000 x training.seq_len"},
  };
  for (const Row& row : rows) check_row(row);
}

TEST_CASE("keys that contradict each other or the job are refused or warned about", "[bad_input]") {
  const std::string train = TITAN_TRAIN_PATH;
  const std::string run = train + " " + tiny_run();
  const std::string fifo = make_fifo("dataset.fifo");
  const std::vector<Row> rows = {
      {"comm.debug_fail_rank beyond the world size (was: trained, never failed)",
       run + " --comm.debug_fail_at_step 1 --comm.debug_fail_rank 5", 2,
       "comm.debug_fail_rank = 5 is not a rank of this job: must be in [0, 0] (WORLD_SIZE 1)"},
      {"comm.debug_stall_rank beyond the world size (was: trained, never stalled)",
       run + " --comm.debug_stall_at_step 1 --comm.debug_stall_rank 3", 2,
       "comm.debug_stall_rank = 3 is not a rank of this job: must be in [0, 0] (WORLD_SIZE 1)"},
      {"--estimate-memory with seq_len 2^62 (was: answered happily)",
       train + " --estimate-memory --training.seq_len 4611686018427387904", 2,
       "training.seq_len = 4611686018427387904 is out of range: must be in [1, 2147483647]"},
      {"Slurm nodelist of 10^9 hosts (was: killed while expanding)",
       "env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE SLURM_PROCID=0 SLURM_NTASKS=2 "
       "SLURM_LOCALID=0 SLURM_NTASKS_PER_NODE=1 SLURM_NODEID=0 SLURM_NODELIST='n[0-999999999]' " + run,
       2, "expands to more than 131072 hosts, the limit titan accepts"},
      {"a FIFO as the dataset (was: \"does not exist\")",
       run + " --training.dataset text --training.dataset_path " + fifo, 1,
       "dataset.fifo is a FIFO, not a regular file or a folder of *.txt files"},
      {"/dev/zero as the dataset (was: \"does not exist\")",
       run + " --training.dataset text --training.dataset_path /dev/zero", 1,
       "text dataset path /dev/zero is a character device, not a regular file"},
      {"/dev/zero as a token shard dataset",
       run + " --training.dataset tokens --training.dataset_path /dev/zero", 1,
       "tokens dataset path /dev/zero is a character device"},
  };
  for (const Row& row : rows) check_row(row);
}

TEST_CASE("the MoE experts' low-precision keys: every contradiction is one named error, exit 2", "[bad_input]") {
  const std::string moe = std::string(TITAN_TRAIN_PATH) + " " + tiny_run() + " --model.name qwen3 --model.flavor debugmodel_moe_small";
  const std::string f8 = " --model.converters quantize.grouped_mm.float8";
  const std::vector<Row> rows = {
      {"the converter without fqns", moe + f8, 2,
       "model.converters lists quantize.grouped_mm.float8 but quantize.grouped_mm.float8.fqns is empty"},
      {"fqns without the converter", moe + " --quantize.grouped_mm.mx.fqns experts", 2,
       "quantize.grouped_mm.mx.fqns is set but model.converters does not list quantize.grouped_mm.mx"},
      {"an fqn that names no MoE module", moe + f8 + " --quantize.grouped_mm.float8.fqns attention", 2,
       "quantize.grouped_mm.float8.fqns entry 'attention' names no MoE module (the model's: layers.0.moe.experts"},
      {"an expert recipe on a model without experts",
       std::string(TITAN_TRAIN_PATH) + " " + tiny_run() + f8 + " --quantize.grouped_mm.float8.fqns experts", 2,
       "has no experts (no mixture-of-experts layer)"},
      {"both expert converters",
       moe + " --model.converters quantize.grouped_mm.float8,quantize.grouped_mm.mx --quantize.grouped_mm.float8.fqns "
             "experts --quantize.grouped_mm.mx.fqns experts",
       2, "an expert trains in one low precision; choose one"},
      {"an unknown expert recipe", moe + " --quantize.grouped_mm.float8.recipe_name tensorwise", 2,
       "quantize.grouped_mm.float8.recipe_name = 'tensorwise' is not allowed; choose from: rowwise, blockwise"},
      {"float8 dispatch without expert parallelism",
       moe + f8 + " --quantize.grouped_mm.float8.fqns experts --quantize.grouped_mm.float8.float8_dispatch", 2,
       "float8_dispatch has no effect without expert parallelism"},
      {"float8 dispatch with blockwise experts",
       moe + f8 + " --quantize.grouped_mm.float8.fqns experts --quantize.grouped_mm.float8.recipe_name blockwise "
                  "--quantize.grouped_mm.float8.float8_dispatch",
       2, "float8_dispatch needs the rowwise expert recipe"},
  };
  for (const Row& row : rows) check_row(row);
}

TEST_CASE("start-up warnings name the keys whose settings do nothing", "[bad_input]") {
  using titan::trainer::config::parse_job_config;
  auto warnings_of = [](std::vector<std::string> args) {
    std::string all;
    for (const auto& w : parse_job_config(args).warnings) all += w + "\n";
    return all;
  };
  // torchtitan clamps warmup to the run (build_lr_schedulers) and says so; titan does the same.
  CHECK_THAT(warnings_of({"--training.steps", "3", "--lr_scheduler.warmup_steps", "5"}),
             Contains("lr_scheduler.warmup_steps (5) exceeds training.steps (3): warmup clamped to 3"));
  CHECK_THAT(warnings_of({"--training.steps", "3", "--profiling.enable_profiling", "--profiling.profile_freq", "10"}),
             Contains("profiling.enable_profiling is on, but profiling.profile_freq (10) > training.steps (3): "
                      "this run writes no trace"));
  CHECK_THAT(warnings_of({"--training.steps", "3", "--profiling.enable_memory_snapshot"}),
             Contains("profiling.enable_memory_snapshot is on, but profiling.profile_freq (10) > "
                      "training.steps (3): this run writes no memory snapshot"));
  CHECK(warnings_of({"--training.steps", "10", "--lr_scheduler.warmup_steps", "2", "--profiling.enable_profiling"})
            .empty());
}

TEST_CASE("library guards: nodelist expansion, memory estimate, nesting scan", "[bad_input]") {
  CHECK_THROWS_WITH(titan::launcher::expand_slurm_nodelist("n[0-999999999]"),
                    Contains("expands to more than 131072 hosts"));
  CHECK_THROWS_WITH(titan::launcher::expand_slurm_nodelist("a[0-999],b[0-999],c[000-999]x[0-999]"),
                    Contains("expands to more than 131072 hosts"));
  CHECK(titan::launcher::expand_slurm_nodelist("n[0-3]").size() == 4);

  titan::trainer::observe::EstimateInputs in;
  in.args = titan::model::model_flavor("llama3", "debugmodel");
  in.seq_len = int64_t{1} << 62;
  CHECK_THROWS_WITH(titan::trainer::observe::estimate_memory(in), Contains("more than 8 EiB per rank"));

  using titan::trainer::config::toml_nesting_depth;
  CHECK(toml_nesting_depth("[training]\nsteps = 1.5\n") == 2);  // the float's dot is no key
  CHECK(toml_nesting_depth("[a.b.c]\nx.y = 1\n") == 5);
  CHECK(toml_nesting_depth("[a]\nx = {y = [[1], [2]]}\n") == 4);  // a, a.x, a.x.y, its arrays
  CHECK(toml_nesting_depth("[a.b.c]\n[d]\nx = 1\n") == 3);
  CHECK(toml_nesting_depth("[a]\n\"x.y.z\" = 'p.q.r' # c.d.e.f\n") == 2);
  CHECK(toml_nesting_depth("[[a.b]]\nk = \"\"\"\n[x.y.z.w]\n\"\"\"\n") == 3);
}

// Note: a signal during start-up used to set the step-boundary flag and be ignored until
// rendezvous timed out; now it ends the process at once with 128 + SIGTERM.
TEST_CASE("SIGTERM during start-up ends the process with a message", "[bad_input]") {
  const fs::path log = scratch() / "sigterm.log";
  const int port = titan::launcher::pick_free_port();
  // Rank 0 of 2 with no rank 1: it serves the store and waits at rendezvous (start-up) for up to
  // comm.init_timeout_seconds.
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string port_text = std::to_string(port);
    setenv("WORLD_SIZE", "2", 1), setenv("RANK", "0", 1), setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1), setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port_text.c_str(), 1), setenv("OMP_NUM_THREADS", "1", 1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1), dup2(fd, 2);
    const std::string dump = (scratch() / "sigterm_dump").string();
    execl(TITAN_TRAIN_PATH, TITAN_TRAIN_PATH, "--comm.init_timeout_seconds", "100", "--training.num_threads", "1",
          "--job.dump_folder", dump.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto read_log = [&] {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  // Wait (generous deadline, not a timing) until it is inside rendezvous.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_log().find("distributed:") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(kill(pid, SIGTERM) == 0);
  int status = 0;
  pid_t done = 0;
  const auto exit_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < exit_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (done == 0) {  // still waiting: the signal was ignored; do not leave it behind
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  INFO(read_log());
  REQUIRE(done == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  CHECK_THAT(read_log(), Contains("titan-train: interrupted during start-up by SIGTERM"));
}

TEST_CASE("SIGTERM while the libraries initialize, before main, also ends with the message", "[bad_input]") {
  // LibTorch's static initializers take ~0.15 s before main; the handlers are installed from the
  // executable's .preinit_array, before them (apps/train_main.cpp). The signal is sent as soon as
  // the process catches SIGTERM (/proc/PID/status SigCgt), which is then inside that window.
  const fs::path log = scratch() / "sigterm_early.log";
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1), dup2(fd, 2);
    execl(TITAN_TRAIN_PATH, TITAN_TRAIN_PATH, "--training.steps", "1", static_cast<char*>(nullptr));
    _exit(127);
  }
  auto catches_sigterm = [pid] {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("SigCgt:", 0) == 0) return ((std::stoull(line.substr(7), nullptr, 16) >> (SIGTERM - 1)) & 1) != 0;
    return false;
  };
  // First the exec (the forked child still has this test's handlers), then titan-train's own.
  const fs::path exe = fs::path("/proc") / std::to_string(pid) / "exe";
  auto exec_done = [&] {
    std::error_code ec;
    return fs::read_symlink(exe, ec).filename() == fs::path(TITAN_TRAIN_PATH).filename();
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!(exec_done() && catches_sigterm()) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  REQUIRE(kill(pid, SIGTERM) == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  std::ifstream in(log);
  const std::string text(std::istreambuf_iterator<char>(in), {});
  INFO(text);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  CHECK_THAT(text, Contains("titan-train: interrupted during start-up by SIGTERM"));
}

TEST_CASE("the disagreement message names the key, the values and the ranks", "[bad_input]") {
  using titan::trainer::config::describe_disagreement;
  CHECK_THAT(describe_disagreement("training.seq_len", {"2048", "1024", "2048", "2048"}, 0),
             Contains("config differs across ranks: training.seq_len is 2048 on ranks 0,2,3 but 1024 on rank 1"));
  CHECK_THAT(describe_disagreement("model.flavor", {"\"a\"", "\"b\"", "\"c\""}, 2),
             Contains("model.flavor is \"a\" on rank 0, \"b\" on rank 1 but \"c\" on rank 2 (and 2 more keys differ)"));
  // Per-rank keys are not compared; everything else is, the build first.
  const auto entries = titan::trainer::config::agreement_entries(titan::trainer::config::JobConfig{});
  REQUIRE(!entries.empty());
  CHECK(entries.front().first == "titan.build");
  for (const auto& [key, value] : entries) {
    CHECK(key != "job.config_file");
    CHECK(key != "job.print_args");
  }
}

// Real ranks under titan-run; rank 1 gets one override more through a `sh -c` wrapper.
TEST_CASE("ranks started with different configs refuse to start, naming the key", "[dist]") {
  const std::string tiny = tiny_run() + " --training.global_batch_size 2";
  auto job = [&](const std::string& rank1_extra) {
    return std::string(TITAN_RUN_PATH) + " --nproc-per-node 2 -- sh -c 'if [ \"$RANK\" = 1 ]; then extra=\"" +
           rank1_extra + "\"; fi; exec " + TITAN_TRAIN_PATH + " " + tiny +
           " --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 60 $extra'";
  };
  const std::vector<Row> rows = {
      {"seq_len differs on rank 1 (was: trained without a word)", job("--training.seq_len 8"), 2,
       "config differs across ranks: training.seq_len is 16 on rank 0 but 8 on rank 1"},
      {"float8 recipe differs on rank 1 (was: trained without a word)",
       job("--float8.enable_float8_linear --float8.recipe_name rowwise"), 2,
       "config differs across ranks: float8.enable_float8_linear is false on rank 0 but true on rank 1 "
       "(and 1 more key differs)"},
      {"bf16 on rank 1 (was: Gloo \"Received data size doesn't match\")",
       job("--training.mixed_precision_param bfloat16"), 2,
       "config differs across ranks: training.mixed_precision_param is \"float32\" on rank 0 but "
       "\"bfloat16\" on rank 1"},
      {"another flavor on rank 1 (was: Gloo \"Received data size doesn't match\")",
       job("--model.flavor 8B"), 2,
       "config differs across ranks: model.flavor is \"debugmodel\" on rank 0 but \"8B\" on rank 1"},
  };
  for (const Row& row : rows) check_row(row);
}
