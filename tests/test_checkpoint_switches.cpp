// torchtitan's checkpoint switches in one process (docs/checkpoint.md): enable_first_step_checkpoint,
// load_only, initial_load_model_only and the last save's default (last_save_model_only = true, as
// torchtitan v0.2.2). Every resumed run continues bitwise: same process, same layout, same kernels.
#include <catch2/catch.hpp>

#include <ATen/ops/equal.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/job_runs.h"
#include "model/flavors.h"
#include "tests/temp_dir.h"
#include "trainer/checkpoint/hf_weights.h"
#include "trainer/checkpoint/manager.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/train.h"

#if !defined(TITAN_TRAIN_PATH)
#error "TITAN_TRAIN_PATH must be defined by the build"
#endif

namespace fs = std::filesystem;
using namespace titan::trainer;
using namespace titan::trainer::checkpoint;
using namespace titan::trainer::config;
using Catch::Matchers::Contains;

namespace {

// A 5-step debug-model run writing to `dump`; `extra` adds keys.
JobConfig five_steps(const fs::path& dump, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--training.seq_len", "32", "--training.local_batch_size", "2",
                                   "--training.steps", "5", "--lr_scheduler.warmup_steps", "2",
                                   "--training.seed", "3", "--training.num_threads", "1",
                                   "--metrics.peak_flops", "1e12", "--job.dump_folder", dump.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_job_config(args);
}

std::vector<int64_t> complete_steps(const fs::path& dump) {
  std::vector<int64_t> steps;
  for (const auto& [step, dir] : complete_checkpoints((dump / "checkpoint").string())) steps.push_back(step);
  return steps;
}

// Steps 4 and 5 of a resumed run against the uninterrupted run's.
void check_steps_4_5(const TrainResult& whole, const TrainResult& resumed) {
  REQUIRE(resumed.losses.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    INFO("step " << i + 4);
    CHECK(resumed.losses[i] == whole.losses[i + 3]);  // bitwise
    CHECK(resumed.grad_norms[i] == whole.grad_norms[i + 3]);
  }
}

}  // namespace

TEST_CASE("torchtitan's checkpoint switches: first-step save, load_only, full initial load, model-only last save",
          "[checkpoint][slow]") {
  const fs::path dir = titan::testing::fresh_temp_dir("checkpoint_switches");
  // The uninterrupted run; its only save is the last, by default the model alone in export_dtype.
  TrainResult whole;
  {
    Trainer t(five_steps(dir / "whole", {"--checkpoint.enable", "--checkpoint.interval", "100"}));
    whole = t.train();
  }
  REQUIRE(whole.losses.size() == 5);
  CHECK(complete_steps(dir / "whole") == std::vector<int64_t>{5});
  {
    CheckpointReader last((dir / "whole" / "checkpoint" / "step-5").string());
    CHECK(last.manifest().at("model_weights_only") == true);
    CHECK(last.manifest().at("holders") == nlohmann::json::array({"model"}));
  }

  // enable_first_step_checkpoint: step-1 besides the interval's step-3, both full checkpoints;
  // the injected failure stops the run before step 4, as a killed run would.
  const fs::path first = dir / "first";
  const std::vector<std::string> saving = {"--checkpoint.enable", "--checkpoint.interval", "3",
                                           "--checkpoint.enable_first_step_checkpoint"};
  {
    std::vector<std::string> stopped = saving;
    stopped.insert(stopped.end(), {"--comm.debug_fail_at_step", "4"});
    Trainer t(five_steps(first, stopped));
    CHECK_THROWS_WITH(t.train(), Contains("fails on purpose at step 4"));
  }
  REQUIRE(complete_steps(first) == std::vector<int64_t>({1, 3}));
  for (const char* step : {"step-1", "step-3"}) {
    CheckpointReader reader((first / "checkpoint" / step).string());
    CHECK(reader.has_holder("optimizer"));
    CHECK(reader.has_holder("dataloader"));
  }

  // load_only: resumes from step-3 and trains on, but saves nothing, not even the last step.
  {
    std::vector<std::string> load_only = saving;
    load_only.push_back("--checkpoint.load_only");
    Trainer t(five_steps(first, load_only));
    CHECK(t.start_step() == 3);
    check_steps_4_5(whole, t.train());
  }
  CHECK(complete_steps(first) == std::vector<int64_t>({1, 3}));

  // initial_load_model_only = false: another run, checkpointing off, resumes from the folder as
  // from its own checkpoint (optimizer, data position, step).
  const std::string step3 = (first / "checkpoint" / "step-3").string();
  {
    Trainer t(five_steps(dir / "full_initial",
                         {"--checkpoint.initial_load_path", step3, "--checkpoint.no_initial_load_model_only"}));
    CHECK(t.start_step() == 3);
    check_steps_4_5(whole, t.train());
  }
  // The default (true): the weights alone, a fresh run from step 0.
  CHECK(Trainer(five_steps(dir / "model_initial", {"--checkpoint.initial_load_path", step3})).start_step() == 0);
  // A file that is not a titan checkpoint cannot be resumed from.
  CHECK_THROWS_WITH(Trainer(five_steps(dir / "bad_initial", {"--checkpoint.initial_load_path",
                                                             (dir / "first" / "metrics.jsonl").string(),
                                                             "--checkpoint.no_initial_load_model_only"})),
                    Contains("initial_load_model_only = false") && Contains("is not one"));
}

TEST_CASE("an export carries every MoE expert_bias, an initial load restores them, a file without them says so",
          "[checkpoint][moe]") {
  const fs::path dir = titan::testing::fresh_temp_dir("checkpoint_export_bias");
  const std::vector<std::string> moe = {"--model.name", "qwen3", "--model.flavor", "debugmodel_moe_small",
                                        "--training.seq_len", "32", "--training.local_batch_size", "2",
                                        "--training.seed", "5", "--training.num_threads", "1",
                                        "--metrics.peak_flops", "1e12"};
  auto job = [&](const fs::path& dump, std::vector<std::string> extra) {
    std::vector<std::string> args = moe;
    args.insert(args.end(), {"--job.dump_folder", dump.string()});
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_job_config(args);
  };
  auto biases = [](Trainer& t) {
    std::map<std::string, at::Tensor> out;
    for (titan::model::TransformerBlock* block : t.model().blocks())
      out[block->moe->prefix + ".expert_bias"] = block->moe->expert_bias.clone();
    return out;
  };
  // bfloat16 weights: the biases still go out in float32, bit for bit.
  const fs::path exported = dir / "final.safetensors";
  Trainer saver(job(dir / "saver", {"--training.steps", "3", "--checkpoint.export_path", exported.string(),
                                    "--checkpoint.export_dtype", "bfloat16"}));
  saver.train();
  const std::map<std::string, at::Tensor> trained = biases(saver);
  REQUIRE(trained.size() == 4);
  const auto file = load_safetensors(exported.string());
  for (const auto& [name, bias] : trained) {
    INFO(name);
    CHECK(bias.abs().max().item<double>() > 0);  // 3 steps of balancing moved it
    REQUIRE(file.count(name) == 1);
    CHECK(file.at(name).scalar_type() == at::kFloat);
    CHECK(at::equal(file.at(name), bias));
  }
  CHECK(file.at("layers.0.moe.router.gate.weight").scalar_type() == at::kBFloat16);

  // A run started from the export continues the balancing from the trained biases.
  {
    Trainer loaded(job(dir / "loaded", {"--training.steps", "1", "--checkpoint.initial_load_path", exported.string()}));
    for (const auto& [name, bias] : biases(loaded)) {
      INFO(name);
      CHECK(at::equal(bias, trained.at(name)));
    }
  }
  // A file without them (an export written before titan exported them) still loads; the biases
  // start at zero and the log says so, naming the key and a layer.
  std::vector<std::pair<std::string, at::Tensor>> weights_only;
  for (const auto& [name, tensor] : file)
    if (trained.count(name) == 0) weights_only.emplace_back(name, tensor);
  const fs::path old_export = dir / "no_bias.safetensors";
  save_safetensors(old_export.string(), weights_only);
  std::string command = TITAN_TRAIN_PATH;
  for (const std::string& a : moe) command += " " + a;
  command += " --training.steps 1 --job.dump_folder " + (dir / "from_old").string() +
             " --checkpoint.initial_load_path " + old_export.string();
  const titan::testing::JobRun run = titan::testing::run_job(command, dir / "from_old.log");
  INFO(run.log);
  CHECK(run.exit_code == 0);
  CHECK_THAT(run.log, Contains("checkpoint.initial_load_path '" + old_export.string() + "' holds no load-balancing bias "
                               "for 4 MoE layer(s) ('layers.0.moe.expert_bias'") &&
                          Contains("starts at zero"));
}

TEST_CASE("Qwen3-MoE's Hugging Face format has no tensor for expert_bias: the HF mapping names none",
          "[checkpoint][moe]") {
  const titan::model::ModelArgs args = titan::model::model_flavor("qwen3", "debugmodel_moe_small");
  CHECK_FALSE(hf_buffer_name("layers.0.moe.expert_bias", args).has_value());
  CHECK_FALSE(hf_buffer_name("layers.0.moe.router.gate.weight", args).has_value());  // a parameter, not a buffer
  CHECK_THROWS_WITH(hf_names("layers.0.moe.expert_bias", args), Contains("no Hugging Face name"));
}
