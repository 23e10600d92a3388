// Training a mixture-of-experts model (model.name = qwen3, titan's small MoE flavor) through the
// Trainer: the once-per-step load balancing moves expert_bias, the line and the JSONL report each
// layer's expert load, and a checkpoint carries expert_bias so a resume continues bit for bit.
#include <ATen/ops/equal.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/job_runs.h"
#include "tests/temp_dir.h"
#include "trainer/config/job_config.h"
#include "trainer/train.h"

using namespace titan::trainer;
using namespace titan::trainer::config;

namespace {

JobConfig moe_job(const std::filesystem::path& dump, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--model.name", "qwen3", "--model.flavor", "debugmodel_moe_small",
                                   "--training.seq_len", "32", "--training.local_batch_size", "2",
                                   "--training.steps", "4", "--training.seed", "5", "--metrics.log_freq", "1",
                                   "--job.dump_folder", dump.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_job_config(args);
}

std::vector<at::Tensor> expert_biases(Trainer& trainer) {
  std::vector<at::Tensor> out;
  for (titan::model::TransformerBlock* block : trainer.model().blocks()) out.push_back(block->moe->expert_bias.clone());
  return out;
}

}  // namespace

TEST_CASE("MoE training: the bias moves once per step, the load is logged, a resume continues bit for bit",
          "[trainer][moe]") {
  const std::filesystem::path dump = titan::testing::fresh_temp_dir("test_moe_training");
  const std::vector<std::string> ckpt = {"--checkpoint.enable_checkpoint", "--checkpoint.interval", "2"};
  Trainer whole(moe_job(dump / "whole", ckpt));
  const TrainResult all = whole.train();
  REQUIRE(all.losses.size() == 4);
  const std::vector<at::Tensor> bias = expert_biases(whole);
  // 4 updates of +-1e-3 (zero-mean): every expert moved, by a multiple of 1e-3 / 8 at most 4e-3.
  for (const at::Tensor& b : bias) {
    CHECK(b.abs().max().item<double>() > 0);
    CHECK(b.abs().max().item<double>() <= 4 * 2e-3);
    CHECK(std::abs(b.sum().item<double>()) < 1e-6);  // zero-mean deltas
  }
  const auto lines = titan::testing::read_metrics_lines(dump / "whole" / "metrics.jsonl");
  REQUIRE(lines.size() == 4);
  REQUIRE(lines[0].contains("expert_load"));
  CHECK(lines[0].at("expert_load").size() == 4);  // one value per MoE layer
  for (double load : lines[0].at("expert_load").get<std::vector<double>>()) CHECK(load >= 1.0);

  // Resume from step 2: steps 3 and 4 and the final biases equal the uninterrupted run's.
  std::filesystem::remove_all(dump / "whole" / "checkpoint" / "step-4");
  Trainer resumed(moe_job(dump / "whole", ckpt));
  const TrainResult rest = resumed.train();
  REQUIRE(rest.losses.size() == 2);
  CHECK(rest.losses[0] == all.losses[2]);
  CHECK(rest.losses[1] == all.losses[3]);
  const std::vector<at::Tensor> resumed_bias = expert_biases(resumed);
  for (size_t i = 0; i < bias.size(); ++i) CHECK(at::equal(resumed_bias[i], bias[i]));
}

TEST_CASE("validation adds no token counts: the biases equal a run without validation", "[trainer][moe]") {
  // Note [Counted tokens]: only a training forward counts. Validation every step (its tokens are
  // not the step's) must leave every bias as it is without validation; a forward that counted
  // would move the counts, and with them the sign() of some expert's update.
  const std::filesystem::path dump = titan::testing::fresh_temp_dir("test_moe_training_validation");
  Trainer plain(moe_job(dump / "plain"));
  plain.train();
  Trainer validated(moe_job(dump / "validated", {"--validation.enable", "--validation.dataset", "fortunes",
                                                 "--validation.freq", "1", "--validation.steps", "2",
                                                 "--validation.local_batch_size", "4", "--validation.seq_len", "32"}));
  validated.train();
  const std::vector<at::Tensor> want = expert_biases(plain), got = expert_biases(validated);
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(at::equal(got[i], want[i]));
  const auto lines = titan::testing::read_metrics_lines(dump / "validated" / "metrics.jsonl");
  CHECK(std::count_if(lines.begin(), lines.end(), [](const auto& j) { return j.contains("validation_metrics/loss"); }) == 4);
}
