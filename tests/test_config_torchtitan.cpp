// torchtitan's schema in titan's config: every fixture config (tests/fixtures/torchtitan/<release>/,
// written in the schema each torchtitan release publishes) parses unchanged, and each of its
// keys lands where the test's own rename list says, checked through the printed config
// (--job.print_args); torchtitan command lines; keys refused by feature; every problem at once.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "trainer/config/job_config.h"
#include "trainer/config/key_table.h"

namespace fs = std::filesystem;
using titan::trainer::config::ConfigError;
using titan::trainer::config::config_to_toml;
using titan::trainer::config::JobConfig;
using titan::trainer::config::MachineFacts;
using titan::trainer::config::parse_job_config;
using Catch::Matchers::Contains;

namespace {

const MachineFacts kCpuMachine{false};
const MachineFacts kGpuMachine{true};

fs::path fixture_root() {
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  REQUIRE(src != nullptr);  // ctest sets it
  return fs::path(src) / "tests" / "fixtures" / "torchtitan";
}

// torchtitan's older names and the titan key each one is, written out independently of the key
// table so that the table is checked against it.
const std::map<std::string, std::string>& renames() {
  static const std::map<std::string, std::string> table = {
      {"job.print_config", "job.print_args"},
      {"training.batch_size", "training.local_batch_size"},
      {"training.warmup_steps", "lr_scheduler.warmup_steps"},
      {"training.data_parallel_replicate_degree", "parallelism.data_parallel_replicate_degree"},
      {"training.data_parallel_shard_degree", "parallelism.data_parallel_shard_degree"},
      {"training.tensor_parallel_degree", "parallelism.tensor_parallel_degree"},
      {"training.disable_loss_parallel", "parallelism.disable_loss_parallel"},
      {"training.fsdp_reshard_after_forward", "parallelism.fsdp_reshard_after_forward"},
      {"experimental.pipeline_parallel_degree", "parallelism.pipeline_parallel_degree"},
      {"experimental.context_parallel_degree", "parallelism.context_parallel_degree"},
      {"experimental.enable_async_tensor_parallel", "parallelism.enable_async_tensor_parallel"},
      {"lr_scheduler.lr_min", "lr_scheduler.min_lr_factor"},
      {"compile.enable", "training.compile"},
      {"checkpoint.enable", "checkpoint.enable_checkpoint"},
      {"checkpoint.last_save_model_only", "checkpoint.model_weights_only"},
      {"checkpoint.last_save_model_weights_only", "checkpoint.model_weights_only"},
      {"debug.seed", "training.seed"},
      {"quantize.linear.float8.enable_fsdp_float8_all_gather",
       "float8.enable_fsdp_float8_all_gather"},
      {"quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
       "float8.precompute_float8_dynamic_scale_for_fsdp"},
      {"quantize.linear.float8.filter_fqns", "float8.filter_fqns"},
      {"quantize.linear.float8.recipe_name", "float8.recipe_name"},
      {"quantize.linear.mx.recipe_name", "mx.recipe_name"},
      {"quantize.linear.mx.filter_fqns", "mx.filter_fqns"},
      {"quantize.linear.mx.mxfp8_dim1_cast_kernel_choice", "mx.mxfp8_dim1_cast_kernel_choice"},
  };
  return table;
}

// A TOML value as titan prints it; a string given for a list key reads as a one-item list.
std::string as_printed(const toml::node& node, bool list_key) {
  std::ostringstream os;
  if (list_key && node.is_string()) {
    os << toml::array{node.as_string()->get()};
    return os.str();
  }
  node.visit([&](const auto& n) { os << n; });
  return os.str();
}

void leaves(const toml::table& table, const std::string& prefix,
            std::vector<std::pair<std::string, const toml::node*>>& out) {
  for (auto&& [k, v] : table) {
    const std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (v.is_table()) {
      leaves(*v.as_table(), name, out);
    } else {
      out.emplace_back(name, &v);
    }
  }
}

// The value the printed config (what --job.print_args writes) gives `dotted`, or "" if the
// printed config leaves it out (an accepted torchtitan key at torchtitan's default).
std::string printed_value(const toml::table& printed, const std::string& dotted, bool list_key) {
  const toml::node_view<const toml::node> node = printed.at_path(dotted);
  return node ? as_printed(*node.node(), list_key) : "";
}

}  // namespace

TEST_CASE("every torchtitan fixture config parses and each key lands where it should",
          "[config][torchtitan]") {
  using namespace titan::trainer::config::detail;
  int configs = 0, keys_checked = 0;
  std::vector<std::string> releases;
  for (const auto& release : fs::directory_iterator(fixture_root())) {
    releases.push_back(release.path().filename().string());
    for (const auto& file : fs::directory_iterator(release.path())) {
      if (file.path().extension() != ".toml") continue;  // defaults.json: the next test's
      INFO(file.path().string());
      JobConfig cfg;
      REQUIRE_NOTHROW(cfg = parse_job_config(
                          {"--job.config_file", file.path().string()}, kCpuMachine));
      ++configs;
      const toml::table printed = toml::parse(config_to_toml(cfg));
      std::vector<std::pair<std::string, const toml::node*>> fixture_keys;
      const toml::table fixture = toml::parse_file(file.path().string());
      leaves(fixture, "", fixture_keys);
      for (const auto& [dotted, node] : fixture_keys) {
        INFO(dotted);
        const KeySpec* spec = find_key(dotted);
        REQUIRE(spec != nullptr);
        auto rename = renames().find(dotted);
        if (spec->kind == KeyKind::kAlias) {
          REQUIRE(rename != renames().end());  // every alias in a fixture is in the test's list
          CHECK(spec->alias_of == rename->second);
          bool noted = false;
          for (const auto& n : cfg.notes) noted |= n.rfind(dotted + " (torchtitan", 0) == 0;
          CHECK(noted);  // the log says which titan key it became
        } else {
          CHECK(rename == renames().end());
        }
        const std::string target = rename == renames().end() ? dotted : rename->second;
        const KeySpec* target_spec = find_key(target);
        REQUIRE(target_spec != nullptr);
        const bool list_key = target_spec->type == ValueType::kStringList;
        const std::string want = as_printed(*node, list_key);
        std::string got = printed_value(printed, target, list_key);
        if (got.empty()) {
          // Left out of the print: only an accepted key at torchtitan's default may be.
          REQUIRE(target_spec->kind == KeyKind::kAccepted);
          got = format_config_value(*target_spec->default_value);
          got = as_printed(*toml::parse("v = " + got)["v"].node(), list_key);
        }
        CHECK(got == want);
        ++keys_checked;
      }
    }
  }
  CHECK(releases.size() == 6);
  CHECK(configs == 24);
  CHECK(keys_checked > 900);
}

// Note [torchtitan's defaults]: titan's default of every torchtitan v0.2.2 key is v0.2.2's
// (tests/fixtures/torchtitan/v0.2.2/defaults.json, written by scripts/reference/torchtitan_defaults.py
// from torchtitan's JobConfig), except where torchtitan's None has a titan spelling and where
// titan differs on purpose; both lists are below, each entry with its reason, and the test fails
// when an entry no longer holds.
namespace {

using Json = nlohmann::json;

Json as_json(const titan::trainer::config::ConfigValue& value) {
  return std::visit([](const auto& v) { return Json(v); }, value);
}

// The default a torchtitan user gets from titan for `spec` (an alias: its target's).
Json titan_default(const titan::trainer::config::detail::KeySpec& spec, const JobConfig& defaults) {
  using namespace titan::trainer::config::detail;
  if (spec.kind == KeyKind::kAccepted) return as_json(*spec.default_value);
  if (spec.kind == KeyKind::kAlias) {
    const Json target = titan_default(*find_key(spec.alias_of), defaults);
    return spec.alias_negates ? Json(!target.get<bool>()) : target;
  }
  return std::visit([](auto* member) { return Json(*member); }, spec.get(defaults));
}

// torchtitan's None, for keys whose titan value for "not given" is not "" or [].
struct NoneSpelling {
  Json titan;
  const char* why;
};
const std::map<std::string, NoneSpelling>& none_spellings() {
  static const std::map<std::string, NoneSpelling> table = {
      {"lr_scheduler.decay_ratio", {-1.0, "-1: decay over every step after warmup, what None means"}},
      {"lr_scheduler.total_steps", {0, "0: the schedule is training.steps long, what None means"}},
      {"parallelism.pipeline_parallel_layers_per_stage", {0, "0: inferred from the schedule, what None means"}},
      {"quantize.linear.float8.recipe_name",
       {"tensorwise", "None builds torchao's Float8LinearConfig(), whose scaling is tensorwise"}},
      {"training.dataloader.prefetch_factor", {0, "no DataLoader workers, so nothing to prefetch"}},
      {"validation.dataloader.prefetch_factor", {0, "no DataLoader workers, so nothing to prefetch"}},
  };
  return table;
}

// Where titan's default is deliberately not torchtitan's.
struct Difference {
  Json titan, torchtitan;
  const char* why;
};
const std::map<std::string, Difference>& deliberate_differences() {
  static const std::map<std::string, Difference> table = {
      // torchtitan's default names its repository's test tokenizer; titan ships no third-party
      // assets, and "" is its byte-level tokenizer.
      {"model.hf_assets_path", {"", "./tests/assets/tokenizer", "titan ships no tokenizer files"}},
      // c4_test is torchtitan's repository's C4 sample; titan ships no third-party data, and the
      // fortunes corpus comes with the Debian package scripts/setup.sh installs.
      {"training.dataset", {"fortunes", "c4_test", "titan ships no third-party data"}},
      // None seeds from whatever torch's default generator holds (rank 0's, broadcast); titan's
      // weight init and data order are functions of an integer seed (docs/architecture.md).
      {"debug.seed", {0, nullptr, "titan's init needs an integer seed"}},
      // Every torchtitan config names its mode (all 24 fixture configs do), so torchtitan's files
      // run as torchtitan runs them; a bare titan command line keeps every activation instead of
      // checkpointing every second block.
      {"activation_checkpoint.mode", {"none", "selective", "bare command lines keep every activation"}},
      // Early torchtitan hard-coded the output projection as high precision; v0.1.0 made it the
      // filter_fqns entry ["output"] that every one of its float8 configs sets. titan keeps the
      // output out of float8 unless the list says otherwise (docs/float8.md).
      {"quantize.linear.float8.filter_fqns",
       {Json::array({"output"}), Json::array(), "the output projection stays high precision"}},
  };
  return table;
}

}  // namespace

TEST_CASE("titan's defaults of torchtitan v0.2.2's keys are v0.2.2's", "[config][torchtitan]") {
  using namespace titan::trainer::config::detail;
  std::ifstream in(fixture_root() / "v0.2.2" / "defaults.json");
  REQUIRE(in);
  const Json fixture = Json::parse(in);
  REQUIRE(fixture.at("release") == "v0.2.2");
  // On a GPU machine, as torchtitan runs (training.mixed_precision_param is bfloat16 there; the
  // CPU's float32 is the previous test's).
  const JobConfig defaults = parse_job_config({}, kGpuMachine);
  std::set<std::string> none_used, differences_used;
  int compared = 0;
  for (const auto& [dotted, torchtitan_value] : fixture.at("defaults").items()) {
    const KeySpec* spec = find_key(dotted);
    INFO("torchtitan v0.2.2 key " << dotted);
    REQUIRE(spec != nullptr);  // Note [torchtitan's schema in the key table]: every key has a row
    const Json titan_value = titan_default(*spec, defaults);
    Json want = torchtitan_value;
    if (want.is_null()) {
      auto none = none_spellings().find(dotted);
      if (none != none_spellings().end()) {
        want = none->second.titan;
        none_used.insert(dotted);
      } else if (titan_value.is_string() || titan_value.is_array()) {
        want = titan_value.is_string() ? Json("") : Json::array();  // "" and []: "not given"
      }
    }
    auto diff = deliberate_differences().find(dotted);
    if (diff != deliberate_differences().end()) {
      differences_used.insert(dotted);
      CHECK(titan_value == diff->second.titan);
      CHECK(torchtitan_value == diff->second.torchtitan);
      continue;
    }
    INFO("titan's default " << titan_value.dump() << ", torchtitan v0.2.2's " << torchtitan_value.dump());
    CHECK(titan_value == want);
    ++compared;
  }
  CHECK(compared >= 140);
  // Every entry of both lists is a key whose defaults still need it.
  for (const auto& [key, none] : none_spellings()) {
    INFO("None spelling of " << key << " is used by no v0.2.2 default (" << none.why << ")");
    CHECK(none_used.count(key) == 1);
  }
  for (const auto& [key, diff] : deliberate_differences()) {
    INFO("deliberate difference " << key << " (" << diff.why << ") names no v0.2.2 key");
    CHECK(differences_used.count(key) == 1);
  }
}

TEST_CASE("torchtitan's own defaults differ only where the machine says so", "[config]") {
  const JobConfig cpu = parse_job_config({}, kCpuMachine);
  CHECK(cpu.training.device == "cpu");
  CHECK(cpu.training.mixed_precision_param == "float32");
  const JobConfig gpu = parse_job_config({}, kGpuMachine);
  CHECK(gpu.training.device == "cuda");
  CHECK(gpu.training.mixed_precision_param == "bfloat16");  // torchtitan's default
  // What the config says wins over the machine.
  const JobConfig told = parse_job_config(
      {"--training.device", "cpu", "--training.mixed_precision_param=bfloat16"}, kGpuMachine);
  CHECK(told.training.device == "cpu");
  CHECK(told.training.mixed_precision_param == "bfloat16");
  CHECK(parse_job_config({"--training.mixed_precision_param", "float32"}, kGpuMachine)
            .training.mixed_precision_param == "float32");
  // cuda named on a machine without a GPU still computes in bfloat16, as torchtitan would.
  CHECK(parse_job_config({"--training.device", "cuda"}, kCpuMachine)
            .training.mixed_precision_param == "bfloat16");
}

TEST_CASE("torchtitan command lines run unchanged", "[config][torchtitan]") {
  const std::string eight_b = (fixture_root() / "early-2025-01" / "llama3_8b.toml").string();
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--job.config_file", eight_b};
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_job_config(args, kCpuMachine);
  };
  const JobConfig rowwise = with(
      {"--float8.enable_float8_linear", "--training.compile", "--float8.recipe_name", "all_axiswise"});
  CHECK(rowwise.float8.enable_float8_linear);
  CHECK(rowwise.float8.recipe_name == "all_axiswise");
  const JobConfig all_gather =
      with({"--float8.enable_float8_linear", "--training.compile",
            "--float8.enable_fsdp_float8_all_gather",
            "--float8.precompute_float8_dynamic_scale_for_fsdp"});
  CHECK(all_gather.float8.precompute_float8_dynamic_scale_for_fsdp);
  const JobConfig snapshot =
      with({"--training.compile", "--profiling.enable_memory_snapshot",
            "--profiling.save_memory_snapshot_folder", "memory_snapshot"});
  CHECK(snapshot.profiling.enable_memory_snapshot);
  CHECK(snapshot.training.local_batch_size == 1);  // training.batch_size in the file

  // v0.2's spellings: converters by section name, nested sections on the command line.
  const JobConfig v02 = parse_job_config(
      {"--model.converters", "quantize.linear.float8", "--quantize.linear.float8.recipe_name",
       "rowwise", "--compile.enable", "--job.print_config", "--debug.seed", "7",
       "--metrics.no_rank_0_only"},
      kCpuMachine);
  CHECK(v02.model.converters == std::vector<std::string>{"float8"});
  CHECK(v02.float8.recipe_name == "rowwise");
  // MX by both of torchtitan's spellings: v0.1's [mx] (recipe "mxfp8") and v0.2's section name.
  const JobConfig mx01 = parse_job_config({"--model.converters", "mx", "--mx.recipe_name", "mxfp8"}, kCpuMachine);
  CHECK(mx01.model.converters == std::vector<std::string>{"mx"});
  CHECK(mx01.mx.recipe_name == "mxfp8_cublas");
  const JobConfig mx02 = parse_job_config(
      {"--model.converters", "quantize.linear.mx", "--quantize.linear.mx.recipe_name", "mxfp8_cublas_rceil"},
      kCpuMachine);
  CHECK(mx02.model.converters == std::vector<std::string>{"mx"});
  CHECK(mx02.mx.recipe_name == "mxfp8_cublas_rceil");
  CHECK(v02.training.compile);
  CHECK(v02.job.print_args);
  CHECK(v02.training.seed == 7);
  CHECK(v02.metrics.save_for_all_ranks);  // rank_0_only = false
  CHECK(v02.notes.size() >= 5);
  // torchtitan's checkpoint switches are titan keys (v0.1.0's initial_load_model_weights_only too).
  const JobConfig ckpt = parse_job_config({"--checkpoint.enable", "--checkpoint.enable_first_step_checkpoint",
                                           "--checkpoint.load_only", "--checkpoint.initial_load_model_weights_only",
                                           "false", "--training.dataset", "c4_validation"},
                                          kCpuMachine);
  CHECK(ckpt.checkpoint.enable_first_step_checkpoint);
  CHECK(ckpt.checkpoint.load_only);
  CHECK(!ckpt.checkpoint.initial_load_model_only);
  CHECK(ckpt.training.dataset == "c4");  // C4's validation split: a local copy, read as c4
}

TEST_CASE("a torchtitan key asking for a feature titan lacks is refused by name",
          "[config][torchtitan]") {
  auto error_of = [](std::vector<std::string> args) {
    try {
      parse_job_config(args, kCpuMachine);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error_of({"--metrics.enable_wandb"}),
             Contains("titan does not implement Weights & Biases logging yet: "
                      "metrics.enable_wandb = true (accepted only as false); W&B has no C++"));
  CHECK_THAT(error_of({"--fault_tolerance.enable"}),
             Contains("titan does not implement") && Contains("fault_tolerance.enable"));
  CHECK_THAT(error_of({"--model.converters", "mx", "--mx.recipe_name", "mxfp4_cutlass"}),
             Contains("titan does not implement the MXFP4 hardware GEMM"));
  CHECK_THAT(error_of({"--checkpoint.initial_load_in_hf"}),
             Contains("checkpoint.initial_load_in_hf = true needs the Hugging Face folder to read"));
  // torchtitan v0.2.2's last_save_model_only is true by default, so its documented
  // `--checkpoint.enable --checkpoint.last_save_in_hf` runs as it is; a full last save cannot be HF.
  CHECK(parse_job_config({"--checkpoint.enable", "--checkpoint.last_save_in_hf"}, kCpuMachine).checkpoint.last_save_in_hf);
  CHECK_THAT(error_of({"--checkpoint.enable", "--checkpoint.no_last_save_model_only", "--checkpoint.last_save_in_hf"}),
             Contains("needs checkpoint.last_save_model_only"));
  CHECK_THAT(error_of({"--checkpoint.initial_load_in_hf", "--model.hf_assets_path", "/hf",
                       "--checkpoint.no_initial_load_model_only"}),
             Contains("checkpoint.initial_load_model_only = false reads checkpoint.initial_load_path as a full"));
  CHECK_THAT(error_of({"--checkpoint.load_only", "--checkpoint.create_seed_checkpoint"}),
             Contains("checkpoint.load_only = true saves no checkpoint"));
  CHECK_THAT(error_of({"--activation_checkpoint.mode", "memory_budget"}),
             Contains("titan does not implement memory-budget activation checkpointing"));
  CHECK_THAT(error_of({"--training.dtype", "bfloat16"}),
             Contains("titan does not implement pure bfloat16 training"));
  // Accepted with a value that asks for nothing, and printed only when not torchtitan's default.
  const JobConfig ok = parse_job_config(
      {"--validation.freq", "7", "--parallelism.pipeline_parallel_expert_parallel_overlap", "true", "--checkpoint.folder",
       "ckpt", "--experimental.pipeline_parallel_schedule", "Interleaved1F1B"},
      kCpuMachine);
  const std::string printed = config_to_toml(ok);
  CHECK_THAT(printed, Contains("[validation]") && Contains("freq = 7") &&
                          Contains("folder = \"ckpt\"") &&
                          Contains("pipeline_parallel_schedule = \"Interleaved1F1B\""));
  CHECK(printed.find("pipeline_parallel_expert_parallel_overlap") == std::string::npos);
}

TEST_CASE("every problem of a config is reported at once, with file:line", "[config]") {
  const fs::path path = fs::temp_directory_path() / "titan_test_config_all_errors.toml";
  {
    std::ofstream out(path);
    out << "[training]\nstepz = 5\nsteps = 0\nseq_len = \"long\"\n[optimizer]\nlr = -1\n"
           "[metrics]\nenable_wandb = true\n[trainin]\nx = 1\n";
  }
  std::string message;
  try {
    parse_job_config({"--job.config_file", path.string(), "--model.flavor", "9B", "--nope.x", "1"},
                     kCpuMachine);
  } catch (const ConfigError& e) {
    message = e.what();
  }
  fs::remove(path);
  const std::string file = path.string();
  CHECK_THAT(message, Contains(file + ":2: unknown config key 'training.stepz'"));
  CHECK_THAT(message, Contains(file + ":3: training.steps = 0 is out of range"));
  CHECK_THAT(message, Contains(file + ":4: training.seq_len expects an integer"));
  CHECK_THAT(message, Contains(file + ":6: optimizer.lr = -1.0 is out of range"));
  CHECK_THAT(message, Contains(file + ":8: titan does not implement Weights & Biases"));
  CHECK_THAT(message, Contains(file + ":9: unknown config section [trainin]"));
  CHECK_THAT(message, Contains("command line: model.flavor = '9B' is not allowed"));
  CHECK_THAT(message, Contains("command line: unknown config section 'nope'"));
  CHECK_THAT(message, Contains("(8 problems in this config)"));
}
