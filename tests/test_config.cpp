// Tests for the job config: defaults < TOML file < command line, every error path, --help,
// the printed config round trip, and the shipped configs/*.toml.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "trainer/config/job_config.h"
#include "trainer/config/key_table.h"

namespace fs = std::filesystem;
using titan::trainer::config::ConfigError;
using titan::trainer::config::config_help;
using titan::trainer::config::config_to_toml;
using titan::trainer::config::JobConfig;
using titan::trainer::config::parse_job_config;
using Catch::Matchers::Contains;

namespace {

// A per-process scratch folder, removed when the test binary exits.
struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("titan_test_config_" + std::to_string(getpid()));
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Writes `text` to a file in the scratch folder and returns its path.
std::string write_file(const std::string& name, const std::string& text) {
  static ScratchDir scratch;
  fs::create_directories(scratch.path);
  const fs::path path = scratch.path / name;
  std::ofstream(path) << text;
  return path.string();
}

JobConfig parse_file(const std::string& toml, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--job.config_file", write_file("job.toml", toml)};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_job_config(args);
}

// The message of the ConfigError that parsing `args` throws ("" if it does not throw).
std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_job_config(args);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string file_error_of(const std::string& toml) {
  return error_of({"--job.config_file", write_file("bad.toml", toml)});
}

}  // namespace

TEST_CASE("defaults are the struct initializers and pass validation", "[config]") {
  const JobConfig cfg = parse_job_config(std::vector<std::string>{});
  CHECK(cfg.job.dump_folder == "./outputs");
  CHECK(cfg.model.flavor == "debugmodel");
  CHECK(cfg.model.converters.empty());
  CHECK(cfg.optimizer.name == "AdamW");
  CHECK(cfg.optimizer.lr == 8e-4);
  CHECK(cfg.lr_scheduler.decay_ratio == -1);
  CHECK(cfg.training.global_batch_size == -1);
  CHECK(cfg.training.steps == 10000);
  CHECK(cfg.training.device == "cpu");
  CHECK_FALSE(cfg.training.compile);
  CHECK(cfg.warnings.empty());
  CHECK_FALSE(cfg.help_requested);
}

TEST_CASE("a TOML file sets keys of every type", "[config]") {
  const JobConfig cfg = parse_file(R"(
[job]
description = "from file"
[model]
flavor = "8B"
converters = ["float8"]
[optimizer]
lr = 1          # an integer is fine for a float key
beta2 = 0.99
[training]
steps = 7
deterministic = true
[float8]        # a section with no keys yet may appear empty
)");
  CHECK(cfg.job.description == "from file");
  CHECK(cfg.model.flavor == "8B");
  CHECK(cfg.model.converters == std::vector<std::string>{"float8"});
  CHECK(cfg.optimizer.lr == 1.0);
  CHECK(cfg.optimizer.beta2 == 0.99);
  CHECK(cfg.training.steps == 7);
  CHECK(cfg.training.deterministic);
  CHECK(cfg.training.seq_len == 2048);  // untouched keys keep their defaults

  // TOML dotted keys at the top level are the same as a [section] table.
  CHECK(parse_file("training.steps = 9\n").training.steps == 9);
}

TEST_CASE("command-line overrides in both spellings", "[config]") {
  const JobConfig cfg = parse_job_config(std::vector<std::string>{
      "--training.steps", "5", "--optimizer.lr=0.001", "--lr_scheduler.decay_ratio", "-1",
      "--lr_scheduler.min_lr_factor=0.1", "--model.converters", "float8,float8",
      "--job.description", "a run with spaces", "--training.dataset_path=", "--training.seed",
      "-3"});
  CHECK(cfg.training.steps == 5);
  CHECK(cfg.optimizer.lr == 0.001);
  CHECK(cfg.lr_scheduler.decay_ratio == -1);
  CHECK(cfg.lr_scheduler.min_lr_factor == 0.1);
  CHECK(cfg.model.converters == std::vector<std::string>{"float8", "float8"});
  CHECK(cfg.job.description == "a run with spaces");
  CHECK(cfg.training.dataset_path.empty());
  CHECK(cfg.training.seed == -3);

  const char* argv[] = {"titan", "--training.seq_len=64", "--metrics.log_freq", "1"};
  const JobConfig from_argv = parse_job_config(4, argv);
  CHECK(from_argv.training.seq_len == 64);
  CHECK(from_argv.metrics.log_freq == 1);
}

TEST_CASE("precedence: defaults < file < command line; the last repeat wins", "[config]") {
  const std::string toml = "[training]\nsteps = 50\nseq_len = 256\n";
  const JobConfig cfg = parse_file(toml, {"--training.steps", "60"});
  CHECK(cfg.training.steps == 60);                 // command line beats file
  CHECK(cfg.training.seq_len == 256);              // file beats default
  CHECK(cfg.training.local_batch_size == 8);       // default
  // The file is read first even when --job.config_file comes after the overrides.
  const JobConfig late = parse_job_config(std::vector<std::string>{
      "--training.steps", "61", "--job.config_file", write_file("late.toml", toml)});
  CHECK(late.training.steps == 61);
  CHECK(parse_job_config(std::vector<std::string>{"--training.steps", "1", "--training.steps=2"})
            .training.steps == 2);
  // A bad file value that the command line replaces is not an error.
  CHECK(parse_file("[training]\nsteps = 0\n", {"--training.steps", "3"}).training.steps == 3);
}

TEST_CASE("boolean on/off forms", "[config]") {
  auto det = [](std::vector<std::string> args) {
    return parse_job_config(args).training.deterministic;
  };
  CHECK(det({"--training.deterministic"}));
  CHECK(det({"--training.deterministic=true"}));
  CHECK(det({"--training.deterministic", "true"}));
  CHECK(det({"--training.deterministic=yes"}));
  CHECK_FALSE(det({"--training.deterministic=false"}));
  CHECK_FALSE(det({"--training.deterministic", "false"}));
  CHECK_FALSE(det({"--training.deterministic", "--training.no_deterministic"}));
  CHECK(det({"--training.no_deterministic", "--training.deterministic"}));
  CHECK(det({"--training.deterministic", "--training.steps", "4"}));
  CHECK_FALSE(parse_file("[training]\ndeterministic = true\n", {"--training.no_deterministic"})
                  .training.deterministic);
  CHECK(parse_job_config(std::vector<std::string>{"--job.print_args"}).job.print_args);
  CHECK_THAT(error_of({"--training.deterministic=maybe"}),
             Contains("training.deterministic") && Contains("boolean") && Contains("maybe"));
}

TEST_CASE("unknown sections and keys name the closest valid key", "[config]") {
  CHECK_THAT(error_of({"--training.stepz", "5"}),
             Contains("unknown config key 'training.stepz' (did you mean 'training.steps'?)"));
  CHECK_THAT(error_of({"--training.lr", "1"}), Contains("did you mean 'optimizer.lr'?"));
  CHECK_THAT(error_of({"--trainin.steps", "5"}),
             Contains("unknown config section 'trainin'") && Contains("'training.steps'"));
  CHECK_THAT(error_of({"--steps", "5"}), Contains("'--steps'") && Contains("--training.steps"));
  CHECK_THAT(error_of({"stray"}), Contains("unexpected argument 'stray'"));

  const std::string in_file = file_error_of("[training]\n\nstepz = 5\n");
  CHECK_THAT(in_file, Contains("bad.toml:3") &&
                          Contains("unknown config key 'training.stepz' (did you mean "
                                   "'training.steps'?)"));
  CHECK_THAT(file_error_of("[trainin]\nsteps = 5\n"),
             Contains("bad.toml") && Contains("unknown config section [trainin]") &&
                 Contains("did you mean [training]?"));
  CHECK_THAT(file_error_of("[float8]\nenable_float8_linaer = true\n"),
             Contains("unknown config key 'float8.enable_float8_linaer'") &&
                 Contains("did you mean 'float8.enable_float8_linear'?"));
  CHECK_THAT(file_error_of("steps = 5\n"),
             Contains("top-level key 'steps'") && Contains("'training.steps'"));
  CHECK_THAT(file_error_of("training = 5\n"), Contains("must be a [training] table"));
  CHECK_THAT(file_error_of("[[training]]\nsteps = 5\n"), Contains("must be a [training] table"));
  CHECK_THAT(file_error_of("[job]\nconfig_file = \"x.toml\"\n"),
             Contains("job.config_file") && Contains("command line"));
}

TEST_CASE("wrong types name the key and the expected type", "[config]") {
  CHECK_THAT(error_of({"--training.steps", "abc"}),
             Contains("training.steps") && Contains("an integer") && Contains("'abc'"));
  CHECK_THAT(error_of({"--training.steps=2.5"}), Contains("an integer"));
  CHECK_THAT(error_of({"--optimizer.lr", "fast"}), Contains("optimizer.lr") && Contains("number"));
  CHECK_THAT(error_of({"--training.steps"}), Contains("--training.steps needs a value"));
  CHECK_THAT(error_of({"--training.steps", "--training.seed", "1"}), Contains("needs a value"));
  CHECK_THAT(file_error_of("[training]\nsteps = \"ten\"\n"),
             Contains("bad.toml:2") && Contains("training.steps expects an integer") &&
                 Contains("got a string"));
  CHECK_THAT(file_error_of("[training]\nsteps = 5.5\n"), Contains("expects an integer"));
  CHECK_THAT(file_error_of("[training]\ncompile = \"yes\"\n"),
             Contains("training.compile expects a boolean"));
  CHECK_THAT(file_error_of("[optimizer]\nlr = \"1e-3\"\n"),
             Contains("optimizer.lr expects a number"));
  CHECK_THAT(file_error_of("[model]\nconverters = 8\n"),
             Contains("model.converters expects a list of strings"));
  // A string for a list key is a comma-separated list, as torchtitan reads it.
  CHECK(parse_file("[model]\nconverters = \"float8\"\n").model.converters ==
        std::vector<std::string>{"float8"});
  CHECK_THAT(file_error_of("[model]\nconverters = [\"float8\", 8]\n"),
             Contains("item 1 is an integer"));
}

TEST_CASE("values out of range say what is allowed", "[config]") {
  CHECK_THAT(error_of({"--training.steps", "0"}),
             Contains("training.steps = 0 is out of range: must be in [1, 2147483647]"));
  CHECK_THAT(error_of({"--optimizer.beta1", "1"}), Contains("must be in [0, 1)"));
  CHECK_THAT(error_of({"--optimizer.lr", "0"}), Contains("must be > 0"));
  CHECK_THAT(error_of({"--training.max_norm", "0"}), Contains("must be > 0"));
  CHECK_THAT(error_of({"--training.global_batch_size", "0"}), Contains("must be -1 or in [1, 2147483647]"));
  CHECK_THAT(error_of({"--lr_scheduler.decay_ratio", "1.5"}), Contains("-1 or in [0, 1]"));
  CHECK_THAT(error_of({"--optimizer.lr", "nan"}), Contains("not a finite number"));
  CHECK_THAT(error_of({"--model.load_balance_coeff", "-0.001"}),
             Contains("model.load_balance_coeff = -0.001 is out of range: must be >= 0"));
  CHECK(parse_job_config(std::vector<std::string>{"--model.load_balance_coeff", "0"}).model.load_balance_coeff == 0);
  CHECK_THAT(file_error_of("[metrics]\nlog_freq = 0\n"),
             Contains("bad.toml:2") && Contains("metrics.log_freq = 0"));
  CHECK(parse_job_config(std::vector<std::string>{"--training.global_batch_size", "32",
                                                  "--lr_scheduler.decay_ratio", "0"})
            .training.global_batch_size == 32);
}

TEST_CASE("a value not among the choices lists the choices", "[config]") {
  CHECK_THAT(error_of({"--model.flavor", "8b"}),
             Contains("model.flavor = '8b' is not allowed") &&
                 Contains("debugmodel, 8B, 70B, 405B") && Contains("did you mean '8B'?"));
  CHECK_THAT(error_of({"--lr_scheduler.decay_type=step"}), Contains("linear, sqrt, cosine"));
  CHECK_THAT(error_of({"--model.converters", "float8,int4"}),
             Contains("model.converters item 'int4'") && Contains("float8"));
}

TEST_CASE("bad or missing TOML files name the file", "[config]") {
  const std::string syntax = file_error_of("[training]\nsteps = = 5\n");
  CHECK_THAT(syntax, Contains("bad.toml") && Contains("not valid TOML") && Contains("line 2"));
  CHECK_THAT(file_error_of("[training]\nsteps = 1\nsteps = 2\n"), Contains("not valid TOML"));
  CHECK_THAT(error_of({"--job.config_file", "/nonexistent/titan.toml"}),
             Contains("/nonexistent/titan.toml") && Contains("does not exist"));
  CHECK_THAT(error_of({"--job.config_file", fs::temp_directory_path().string()}),
             Contains("is a directory"));
}

TEST_CASE("config_to_toml re-parses to the same config", "[config]") {
  const JobConfig cfg = parse_job_config(std::vector<std::string>{
      "--job.description", "quote \" backslash \\ tab \t newline \n end", "--job.print_args",
      "--model.converters", "float8", "--optimizer.lr", "3e-4", "--optimizer.eps", "1e-08",
      "--optimizer.beta2", "0.95", "--metrics.peak_flops", "989e12", "--training.seed", "-7",
      "--training.max_norm", "2", "--lr_scheduler.decay_ratio", "0.1", "--training.compile"});
  const std::string toml = config_to_toml(cfg);
  JobConfig back = parse_job_config(
      std::vector<std::string>{"--job.config_file", write_file("printed.toml", toml)});
  back.job.config_file.clear();  // the command line named the printed file
  CHECK(config_to_toml(back) == toml);
  CHECK(back.job.description == cfg.job.description);
  CHECK(back.optimizer.lr == cfg.optimizer.lr);
  CHECK(back.optimizer.eps == cfg.optimizer.eps);
  CHECK(back.metrics.peak_flops == 989e12);
  CHECK(back.training.max_norm == 2.0);
  CHECK(back.model.converters == cfg.model.converters);
  CHECK(back.job.print_args);
  CHECK(back.training.compile);
  // The defaults print and re-parse too.
  const std::string defaults = config_to_toml(JobConfig{});
  CHECK(config_to_toml(parse_job_config(std::vector<std::string>{
            "--job.config_file", write_file("defaults.toml", defaults)})) != "");
  CHECK_THAT(defaults, Contains("[float8]") && Contains("steps = 10000"));
}

TEST_CASE("training.compile is accepted with a warning", "[config]") {
  const JobConfig on = parse_job_config(std::vector<std::string>{"--training.compile"});
  CHECK(on.training.compile);
  REQUIRE(on.warnings.size() == 1);
  CHECK_THAT(on.warnings[0], Contains("training.compile") && Contains("ignored") &&
                                 Contains("no JIT"));
  CHECK(on.warnings[0].find('\n') == std::string::npos);
  CHECK(parse_file("[training]\ncompile = false\n").warnings.empty());
  CHECK(parse_file("[training]\ncompile = true\n").warnings.size() == 1);
}

TEST_CASE("warmup longer than the run is clamped with a warning, as torchtitan does", "[config]") {
  const JobConfig long_warmup = parse_job_config(
      std::vector<std::string>{"--training.steps", "3", "--lr_scheduler.warmup_steps", "5"});
  CHECK(long_warmup.lr_scheduler.warmup_steps == 5);  // the schedule clamps; the config keeps it
  REQUIRE(long_warmup.warnings.size() == 1);
  CHECK_THAT(long_warmup.warnings[0], Contains("lr_scheduler.warmup_steps (5)") &&
                                          Contains("training.steps (3)") &&
                                          Contains("clamped to 3 steps"));
  CHECK(parse_job_config(std::vector<std::string>{"--training.steps", "5",
                                                  "--lr_scheduler.warmup_steps", "5"})
            .warnings.empty());
  // warmup 8 + round(10 x 0.5) = 5 decay steps > 10: the decay keeps the 2 steps left.
  const JobConfig long_decay = parse_job_config(std::vector<std::string>{
      "--training.steps", "10", "--lr_scheduler.warmup_steps", "8", "--lr_scheduler.decay_ratio", "0.5"});
  REQUIRE(long_decay.warnings.size() == 1);
  CHECK_THAT(long_decay.warnings[0], Contains("decay steps (5") && Contains("decay clamped to 2 steps"));
}

TEST_CASE("--help sets help_requested and the help lists every key", "[config]") {
  CHECK(parse_job_config(std::vector<std::string>{"--help"}).help_requested);
  CHECK(parse_job_config(std::vector<std::string>{"--training.stepz", "-h"}).help_requested);
  const std::string help = config_help();
  for (const char* key : {"--job.config_file", "--metrics.peak_flops", "--model.converters",
                          "--optimizer.weight_decay", "--lr_scheduler.min_lr_factor",
                          "--training.num_threads", "--checkpoint.export_dtype", "--model.load_balance_coeff"}) {
    CHECK_THAT(help, Contains(key));
  }
  CHECK_THAT(help, Contains("--training.compile, --training.no_compile") &&
                       Contains("accepted but ignored") &&
                       Contains("one of: linear, sqrt, cosine") &&
                       Contains("default 10000; in [1, 2147483647]") && Contains("[float8]"));
}

TEST_CASE("every configs/*.toml parses", "[config]") {
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  REQUIRE(src != nullptr);  // ctest sets it
  int parsed = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(src) / "configs")) {
    if (entry.path().extension() != ".toml") continue;
    INFO(entry.path().string());
    JobConfig cfg;
    REQUIRE_NOTHROW(cfg = parse_job_config(
                        std::vector<std::string>{"--job.config_file", entry.path().string()}));
    CHECK(cfg.warnings.empty());
    ++parsed;
  }
  CHECK(parsed >= 4);
  const JobConfig debug = parse_job_config(std::vector<std::string>{
      "--job.config_file", std::string(src) + "/configs/llama3_debugmodel.toml"});
  CHECK(debug.training.seq_len == 128);
  CHECK(debug.training.seed == 42);
  const JobConfig big = parse_job_config(std::vector<std::string>{
      "--job.config_file", std::string(src) + "/configs/llama3_405b.toml"});
  CHECK(big.model.flavor == "405B");
  CHECK(big.optimizer.lr == 8e-5);
  CHECK(big.training.mixed_precision_param == "bfloat16");
  CHECK(big.activation_checkpoint.mode == "full");  // torchtitan's 405B choice
  const JobConfig eight = parse_job_config(std::vector<std::string>{
      "--job.config_file", std::string(src) + "/configs/llama3_8b.toml"});
  CHECK(eight.activation_checkpoint.mode == "selective");
  CHECK(eight.activation_checkpoint.selective_ac_option == "op");
  CHECK(eight.float8.filter_fqns == std::vector<std::string>{"output"});
}

// Note [Every integer key has an upper bound] (trainer/config/key_table.h): no row may let an int64
// through to a narrower user unchecked.
TEST_CASE("every integer key has an upper bound", "[config]") {
  using namespace titan::trainer::config::detail;
  for (const auto& section : config_table()) {
    for (const auto& spec : section.keys) {
      if (spec.type != ValueType::kInt || spec.kind != KeyKind::kImplemented) continue;
      INFO(spec.dotted());
      REQUIRE(spec.range.has_value());
      CHECK(spec.range->hi.has_value());
    }
  }
  CHECK_THAT(error_of({"--training.seq_len", "2147483648"}),
             Contains("training.seq_len = 2147483648 is out of range: must be in [1, 2147483647]"));
  CHECK_THAT(error_of({"--comm.init_timeout_seconds", "9223372036854775807"}),
             Contains("comm.init_timeout_seconds = 9223372036854775807 is out of range: must be in [1, 2592000]"));
  CHECK_THAT(error_of({"--training.seed", "9223372036854775808"}), Contains("out of the representable range"));
  CHECK(parse_job_config(std::vector<std::string>{"--training.seed", "-9223372036854775808"}).training.seed ==
        INT64_MIN);
}

TEST_CASE("model.name picks the family; a flavor must be one of its family's", "[config]") {
  const JobConfig qwen = parse_job_config(std::vector<std::string>{"--model.name", "qwen3", "--model.flavor", "0.6B"});
  CHECK(qwen.model.name == "qwen3");
  CHECK_THAT(error_of({"--model.name", "qwen3", "--model.flavor", "70B"}),
             Contains("model.flavor = '70B' is not a qwen3 flavor (model.name)") && Contains("0.6B, 1.7B"));
  CHECK_THAT(error_of({"--model.flavor", "0.6B"}), Contains("'0.6B' is not a llama3 flavor"));
  CHECK_THAT(error_of({"--model.name", "gpt2"}), Contains("model.name = 'gpt2' is not allowed") && Contains("llama3, qwen3"));
  // A tied flavor trains under PP too (the two stages share the embedding).
  CHECK(parse_job_config(std::vector<std::string>{"--model.name", "qwen3", "--parallelism.pipeline_parallel_degree", "2"})
            .parallelism.pipeline_parallel_degree == 2);
  const JobConfig moe = parse_job_config(std::vector<std::string>{
      "--model.name", "qwen3", "--model.flavor", "debugmodel_moe", "--parallelism.data_parallel_shard_degree", "4",
      "--parallelism.expert_parallel_degree", "4"});
  CHECK(moe.parallelism.expert_parallel_degree == 4);
  // torchtitan: expert parallelism has no effect on a dense model; titan says so once.
  const JobConfig dense = parse_job_config(std::vector<std::string>{"--parallelism.expert_parallel_degree", "2"});
  REQUIRE(dense.warnings.size() == 1);
  CHECK_THAT(dense.warnings[0], Contains("parallelism.expert_parallel_degree = 2 has no effect: model llama3 / "
                                          "debugmodel has no experts"));
}

TEST_CASE("titan-plan's help: the [plan] section alone, every key with its default and choices", "[config]") {
  using titan::trainer::config::config_help;
  using titan::trainer::config::config_help_of;
  const std::string help = config_help_of("plan");
  for (const char* key : {"--plan.nodes INT", "--plan.gpus_per_node INT", "--plan.device STRING", "--plan.precisions",
                          "--plan.ac_modes", "--plan.explain STRING", "--plan.exhaustive, --plan.no_exhaustive"})
    CHECK_THAT(help, Catch::Contains(key));
  CHECK_THAT(help, Catch::Contains("one of: h100, h200, b200, a100, cpu"));
  CHECK_THAT(help, !Catch::Contains("--training."));  // one section only
  CHECK(config_help().find(help) != std::string::npos);  // as titan-train --help prints it
  CHECK(config_help_of("no_such_section").empty());
}
