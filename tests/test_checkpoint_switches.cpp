// torchtitan's checkpoint switches in one process (docs/checkpoint.md): enable_first_step_checkpoint,
// load_only, initial_load_model_only and the last save's default (last_save_model_only = true, as
// torchtitan v0.2.2). Every resumed run continues bitwise: same process, same layout, same kernels.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "trainer/checkpoint/manager.h"
#include "trainer/train.h"

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
