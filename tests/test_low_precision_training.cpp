// float8 / int8 / MX / blockwise training end to end through the Trainer: config errors, conversion, and the
// debug model's loss with every recipe against the high-precision run: close to it, yet not
// equal to it (a converter that did nothing must fail).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <iostream>
#include <filesystem>
#include <numeric>

#include "tests/job_runs.h"
#include "trainer/config/job_config.h"
#include "trainer/train.h"

using namespace titan::trainer;
using namespace titan::trainer::config;

namespace {
JobConfig job(std::vector<std::string> extra, int steps = 100) {
  const std::string dump = (std::filesystem::temp_directory_path() /
                            ("titan_test_lp_" + std::to_string(getpid()))).string();
  // The debug model at a CI-sized batch: 2 x 64 tokens per step.
  std::vector<std::string> args = {"--training.seq_len", "64", "--training.local_batch_size", "2",
                                   "--training.steps", std::to_string(steps), "--lr_scheduler.warmup_steps", "10",
                                   "--training.seed", "3", "--metrics.log_freq", "50",
                                   "--job.dump_folder", dump};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_job_config(args);
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  return std::accumulate(v.end() - n, v.end(), 0.0) / n;
}

// Every mfu_pct logged in a run's metrics.jsonl.
std::vector<double> logged_mfu(const JobConfig& cfg) {
  std::vector<double> out;
  for (const auto& j : titan::testing::read_metrics_lines(std::filesystem::path(cfg.job.dump_folder) / "metrics.jsonl"))
    if (j.contains("mfu_pct")) out.push_back(j["mfu_pct"].get<double>());
  return out;
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

namespace {

// Each of `runs` (its config overrides) trains as the high-precision run does and tracks it.
// (Three test cases of a few recipes each, so that ctest runs them side by side.)
// `model`: overrides every run shares (the high-precision one too), `steps` each run's length.
// `min_first_step_change`: how far the recipe must move the step-1 loss (see below).
void check_recipes_track_high_precision(const std::vector<std::vector<std::string>>& runs,
                                        const std::vector<std::string>& model = {}, int steps = 100,
                                        double min_first_step_change = 1e-6) {
  auto with_model = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), model.begin(), model.end());
    return job(extra, steps);
  };
  Trainer hp(with_model({}));
  const TrainResult hp_result = hp.train();
  const double hp_loss = mean_of_last(hp_result.losses, 20);
  const double hp_first_loss = hp_result.losses.front();
  for (const auto& extra : runs) {
    Trainer lp(with_model(extra));
    const TrainResult r = lp.train();
    const double loss = mean_of_last(r.losses, 20);
    INFO(extra.back() << ": mean loss of the last 20 steps " << loss << " vs high precision " << hp_loss);
    // The requirement (docs/float8.md): within 2% of the high-precision run. Per-step losses of a
    // 2x64-token batch are noisy (~5%), the 20-step mean much less so; quantization error itself is
    // 25-40 dB SQNR per GEMM, far below that.
    // Measured (CPU, seed 3, 100 steps; 200 steps gave the same picture at twice the CI time):
    // float8 within 0.033%, int8 0.004%, blockwise 0.015%, mxfp8_cublas 0.003%, mxfp8_cublas_rceil
    // 0.006%, and mxfp4_emulated 0.14% (one mantissa bit, ~15.6 dB per GEMM against ~28 for
    // MXFP8: 4x the error amplitude) all sit well inside the same 2%.
    CHECK(std::abs(loss - hp_loss) <= 0.02 * hp_loss);
    CHECK(r.losses.front() > loss);  // it learns
    // ...and it really ran in low precision: a converter that silently left the linears alone
    // gives bit-identical losses, and one that swapped in another float32 GEMM differs only by
    // summation order (<= ~1e-7 relative at step 1; tests/test_reference_loss.cpp measures 5e-8
    // between whole implementations). Step 1 sees the same weights and data in both runs, so its
    // loss differs by the forward's quantization error alone; measured (CPU, 2 x 64 tokens):
    // tensorwise and tensorwise_delayed 7.7e-5, rowwise and rowwise_with_gw_hp 5.4e-5, int8
    // rowwise (the most precise, ~40 dB) 2.9e-6 relative; blockwise 5.7e-5, MXFP8 6.4e-5, MXFP4
    // 1.7e-4. 1e-6 sits ~3x under the smallest
    // and ~10x over float32 reordering noise.
    const double first_step_change = std::abs(r.losses.front() - hp_first_loss) / hp_first_loss;
    INFO("step 1 loss " << r.losses.front() << " vs high precision " << hp_first_loss << ": relative change "
                        << first_step_change);
    std::cout << extra.back() << ": last-20 mean loss " << loss << " vs " << hp_loss << ", step-1 change "
              << first_step_change << "\n";
    CHECK(first_step_change > min_first_step_change);
  }
}

}  // namespace

TEST_CASE("float8 recipes (tensorwise, rowwise, rowwise_with_gw_hp, tensorwise_delayed) track the high-precision "
          "loss over 100 steps",
          "[float8][slow]") {
  check_recipes_track_high_precision({
      {"--float8.enable_float8_linear", "--float8.recipe_name", "tensorwise"},
      {"--float8.enable_float8_linear", "--float8.recipe_name", "rowwise"},
      {"--float8.enable_float8_linear", "--float8.recipe_name", "rowwise_with_gw_hp"},
      {"--float8.enable_float8_linear", "--float8.recipe_name", "tensorwise_delayed"},
  });
}

TEST_CASE("int8 and blockwise float8 track the high-precision loss over 100 steps", "[float8][int8][slow]") {
  check_recipes_track_high_precision({
      {"--int8.enable_int8_linear"},
      {"--float8.enable_float8_linear", "--float8.recipe_name", "blockwise"},
  });
}

TEST_CASE("MX recipes (MXFP8, MXFP8 rceil, MXFP4) track the high-precision loss over 100 steps", "[mx][slow]") {
  check_recipes_track_high_precision({
      {"--model.converters", "mx", "--mx.recipe_name", "mxfp8_cublas"},
      {"--model.converters", "mx", "--mx.recipe_name", "mxfp8_cublas_rceil"},
      {"--model.converters", "mx", "--mx.recipe_name", "mxfp4_emulated"},
  });
}

// The MoE experts' recipes (quantize.grouped_mm.*): the experts in low precision, the dense
// linears in high precision, on each MoE family's CPU flavor for 100 steps; the same 2% rule and
// the same proof that the recipe ran: its step-1 loss differs from the high-precision one by more
// than float32 reordering could (<= ~1e-7 relative, above). Only the experts are quantized, and
// at initialization their outputs are a small part of the residual stream (w2 starts at a depth-
// scaled std), so the move is smaller than a whole model's. Measured (CPU, seed 3; rowwise /
// blockwise / mxfp8 / mxfp8_floor): Qwen3 7.3e-6 / 1.2e-6 / 7.3e-6 / 5.9e-6, DeepSeek-V3
// 1.3e-6 / 7.1e-7 / 1.3e-6 / 3.6e-6; 3e-7 stays 3x above the reordering noise. (rowwise and
// mxfp8 agree: both scale by powers of two, under which an e4m3 rounding does not depend on the
// scale except for elements ~2^15 below their row's or block's largest.) The last-20 means sit
// within 0.4% of the high-precision run.
constexpr double kExpertsFirstStepChange = 3e-7;
const std::vector<std::vector<std::string>> kExpertRecipes = {
    {"--model.converters", "quantize.grouped_mm.float8", "--quantize.grouped_mm.float8.fqns", "experts",
     "--quantize.grouped_mm.float8.recipe_name", "rowwise"},
    {"--model.converters", "quantize.grouped_mm.float8", "--quantize.grouped_mm.float8.fqns", "experts",
     "--quantize.grouped_mm.float8.recipe_name", "blockwise"},
    {"--model.converters", "quantize.grouped_mm.mx", "--quantize.grouped_mm.mx.fqns", "experts",
     "--quantize.grouped_mm.mx.recipe_name", "mxfp8"},
    {"--model.converters", "quantize.grouped_mm.mx", "--quantize.grouped_mm.mx.fqns", "experts",
     "--quantize.grouped_mm.mx.recipe_name", "mxfp8_floor"},
};

TEST_CASE("expert recipes (float8 rowwise, blockwise, MXFP8 rceil and floor) track the high-precision loss of "
          "Qwen3-MoE over 100 steps",
          "[float8][mx][moe][slow]") {
  check_recipes_track_high_precision(kExpertRecipes, {"--model.name", "qwen3", "--model.flavor", "debugmodel_moe_small"},
                                     100, kExpertsFirstStepChange);
}

TEST_CASE("expert recipes (float8 rowwise, blockwise, MXFP8 rceil and floor) track the high-precision loss of "
          "DeepSeek-V3 over 100 steps",
          "[float8][mx][moe][slow]") {
  check_recipes_track_high_precision(kExpertRecipes,
                                     {"--model.name", "deepseek_v3", "--model.flavor", "debugmodel_small"}, 100,
                                     kExpertsFirstStepChange);
}

TEST_CASE("bfloat16 compute tracks float32 over 100 steps, and no logged mfu exceeds 100%", "[bf16][slow]") {
  // metrics.peak_flops is 0 (job() sets none): the peak is the GEMM probe in the compute dtype.
  const std::vector<std::string> shared = {"--training.steps", "100", "--metrics.log_freq", "5"};
  std::vector<std::string> f32_args = shared, bf16_args = shared;
  bf16_args.insert(bf16_args.end(), {"--training.mixed_precision_param", "bfloat16"});
  const JobConfig f32_cfg = job(f32_args);
  const TrainResult f32 = Trainer(f32_cfg).train();
  const std::vector<double> f32_mfu = logged_mfu(f32_cfg);
  const JobConfig bf16_cfg = job(bf16_args);
  const TrainResult bf16 = Trainer(bf16_cfg).train();
  const std::vector<double> bf16_mfu = logged_mfu(bf16_cfg);
  REQUIRE(f32_mfu.size() == 21);  // steps 1, 5, 10, ..., 100
  REQUIRE(bf16_mfu.size() == 21);
  for (double m : f32_mfu) CHECK((m > 0 && m <= 100.0));
  for (double m : bf16_mfu) CHECK((m > 0 && m <= 100.0));
  // bfloat16 keeps 8 significant bits: each GEMM operand is rounded by up to 2^-9 relative,
  // while masters, optimizer state and GEMM accumulation stay float32, so the error does not
  // compound through the weights. Step 1's loss is a mean over 128 tokens of values each moved by
  // many independent roundings, which average down: it may move by at most one rounding, 2^-9
  // (measured, CPU, seed 3: 1.0e-5 relative). The mean of steps 81-100 adds 100 steps of
  // trajectory drift on 128-token batches: 1% (measured 2.6e-5); a broken bf16 path (bf16 masters,
  // a lost update) stalls or diverges by far more.
  const double f = mean_of_last(f32.losses, 20), b = mean_of_last(bf16.losses, 20);
  INFO("float32 " << f << ", bfloat16 " << b << "; step 1: " << f32.losses.front() << " vs " << bf16.losses.front());
  CHECK(std::abs(bf16.losses.front() - f32.losses.front()) <= std::ldexp(1.0, -9) * f32.losses.front());
  CHECK(std::abs(b - f) <= 0.01 * f);
  CHECK(bf16.losses.front() != f32.losses.front());  // it really computed in bf16
}
