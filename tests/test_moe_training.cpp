// Training a mixture-of-experts model (model.name = qwen3, titan's small MoE flavor) through the
// Trainer: the once-per-step load balancing moves expert_bias, the line and the JSONL report each
// layer's expert load, and a checkpoint carries expert_bias so a resume continues bit for bit.
#include <ATen/ops/equal.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
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

TEST_CASE("a skipped non-finite step leaves the load balancing as it was: no bias moves, its counts are dropped",
          "[trainer][moe][slow]") {
  // Step 2's gradients are made NaN after its backward (training.debug_nonfinite_at_step), when
  // its forward has counted its tokens, and the step is skipped. After it every expert_bias and
  // every master equals the 1-step run's bit for bit, and no token count is left for the next
  // step to balance from; step 3 then moves the biases from its own counts.
  // One warmup step: the learning rate of step 1 is then the peak's whatever training.steps (the
  // default warmup is clamped to each run's length, which would change it).
  const std::filesystem::path dump = titan::testing::fresh_temp_dir("test_moe_training_skip");
  Trainer one(moe_job(dump / "one", {"--training.steps", "1", "--lr_scheduler.warmup_steps", "1"}));
  one.train();
  const std::vector<std::string> skip_step_2 = {"--training.skip_nonfinite_steps", "true",
                                                "--training.debug_nonfinite_at_step", "2",
                                                "--lr_scheduler.warmup_steps", "1"};
  std::vector<std::string> two_steps = skip_step_2;
  two_steps.insert(two_steps.end(), {"--training.steps", "2"});
  Trainer skipped(moe_job(dump / "skipped", two_steps));
  const TrainResult r = skipped.train();
  REQUIRE(r.grad_norms.size() == 2);
  CHECK(std::isfinite(r.grad_norms[0]));
  CHECK(std::isnan(r.grad_norms[1]));
  const std::vector<at::Tensor> after_one = expert_biases(one), after_skip = expert_biases(skipped);
  REQUIRE(after_one.size() == 4);
  for (size_t i = 0; i < after_one.size(); ++i) {
    INFO("layer " << i);
    CHECK(after_one[i].abs().max().item<double>() > 0);  // step 1 did move it
    CHECK(at::equal(after_skip[i], after_one[i]));
    CHECK(skipped.model().blocks()[i]->moe->tokens_per_expert.abs().sum().item<double>() == 0);
  }
  for (size_t i = 0; i < one.master_params().size(); ++i) {
    INFO(one.param_names()[i]);
    CHECK(at::equal(skipped.master_params()[i], one.master_params()[i]));
  }
  const auto lines = titan::testing::read_metrics_lines(dump / "skipped" / "metrics.jsonl");
  REQUIRE(lines.size() == 2);
  CHECK(lines[1].at("skipped_steps") == 1);
  CHECK_FALSE(lines[1].contains("expert_load"));  // a skipped step has no load to report

  std::vector<std::string> three_steps = skip_step_2;
  three_steps.insert(three_steps.end(), {"--training.steps", "3"});
  Trainer resumed_balancing(moe_job(dump / "three", three_steps));
  resumed_balancing.train();
  const std::vector<at::Tensor> after_three = expert_biases(resumed_balancing);
  bool moved = false;
  for (size_t i = 0; i < after_three.size(); ++i) moved = moved || !at::equal(after_three[i], after_one[i]);
  CHECK(moved);
}

TEST_CASE("model.load_balance_coeff: 0 keeps every expert_bias at zero, the default moves it, 2e-3 twice as far",
          "[trainer][moe][slow]") {
  // 0 is torchtitan 0.2.2's Qwen3, whose optimizer registers no balancing hook: the bias exists
  // (the checkpoints hold it) and never moves; the load is still measured and logged.
  const std::filesystem::path dump = titan::testing::fresh_temp_dir("test_moe_training_coeff");
  Trainer off(moe_job(dump / "off", {"--model.load_balance_coeff", "0"}));
  off.train();
  for (const at::Tensor& b : expert_biases(off)) CHECK(b.abs().max().item<double>() == 0);
  const auto lines = titan::testing::read_metrics_lines(dump / "off" / "metrics.jsonl");
  REQUIRE(lines.size() == 4);
  for (const auto& line : lines) CHECK(line.at("expert_load").size() == 4);
  // One step: the update is coeff * (sign - mean(sign)) of the same counts, and doubling a
  // float32 is exact, so 2e-3 moves every bias by exactly twice 1e-3's (the default's).
  Trainer by_default(moe_job(dump / "default", {"--training.steps", "1"}));
  by_default.train();
  Trainer doubled(moe_job(dump / "doubled", {"--training.steps", "1", "--model.load_balance_coeff", "2e-3"}));
  doubled.train();
  const std::vector<at::Tensor> once = expert_biases(by_default), twice = expert_biases(doubled);
  REQUIRE(once.size() == 4);
  for (size_t i = 0; i < once.size(); ++i) {
    INFO("layer " << i);
    CHECK(once[i].abs().max().item<double>() > 0);
    CHECK(at::equal(twice[i], 2 * once[i]));
  }
}
