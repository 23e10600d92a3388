// float8 / int8 training end to end through the Trainer: config errors, conversion, and the
// debug model's loss with every recipe against the high-precision run.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <numeric>

#include "trainer/config.h"
#include "trainer/train.h"

using namespace titan::trainer;

namespace {
JobConfig job(std::vector<std::string> extra) {
  const std::string dump = (std::filesystem::temp_directory_path() /
                            ("titan_test_lp_" + std::to_string(getpid()))).string();
  // The debug model at a CI-sized batch: 2 x 64 tokens per step.
  std::vector<std::string> args = {"--training.seq_len", "64", "--training.local_batch_size", "2",
                                   "--training.steps", "200", "--lr_scheduler.warmup_steps", "10",
                                   "--training.seed", "3", "--metrics.log_freq", "50",
                                   "--job.dump_folder", dump};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_job_config(args);
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  return std::accumulate(v.end() - n, v.end(), 0.0) / n;
}
}  // namespace

TEST_CASE("float8 config: aliases, bad names and impossible combinations", "[float8][config]") {
  CHECK(job({"--float8.recipe_name", "all_axiswise"}).float8.recipe_name == "all_axiswise");
  CHECK_THROWS_WITH(job({"--float8.recipe_name", "rowwize"}),
                    Catch::Contains("tensorwise, rowwise, rowwise_with_gw_hp, tensorwise_delayed"));
  JobConfig both = job({"--float8.enable_float8_linear", "--int8.enable_int8_linear", "--training.steps", "1"});
  CHECK_THROWS_AS(Trainer(both), ConfigError);
  JobConfig ag = job({"--float8.enable_float8_linear", "--float8.recipe_name", "rowwise",
                      "--float8.enable_fsdp_float8_all_gather", "--training.steps", "1"});
  CHECK_THROWS_AS(Trainer(ag), ConfigError);
}

TEST_CASE("every low-precision recipe tracks the high-precision loss over 200 steps",
          "[float8][int8][slow]") {
  Trainer hp(job({}));
  const double hp_loss = mean_of_last(hp.train().losses, 20);
  const std::vector<std::vector<std::string>> runs = {
      {"--float8.enable_float8_linear", "--float8.recipe_name", "tensorwise"},
      {"--float8.enable_float8_linear", "--float8.recipe_name", "rowwise"},
      {"--float8.enable_float8_linear", "--float8.recipe_name", "rowwise_with_gw_hp"},
      {"--float8.enable_float8_linear", "--float8.recipe_name", "tensorwise_delayed"},
      {"--int8.enable_int8_linear"},
  };
  for (const auto& extra : runs) {
    Trainer lp(job(extra));
    const TrainResult r = lp.train();
    const double loss = mean_of_last(r.losses, 20);
    INFO(extra.back() << ": mean loss of the last 20 steps " << loss << " vs high precision " << hp_loss);
    // The requirement (docs/float8.md): within 2% of the high-precision run. Per-step losses of a
    // 2x64-token batch are noisy (~5%), the 20-step mean much less so; quantization error itself is
    // 25-40 dB SQNR per GEMM, far below that.
    CHECK(std::abs(loss - hp_loss) <= 0.02 * hp_loss);
    CHECK(r.losses.front() > loss);  // it learns
  }
}
