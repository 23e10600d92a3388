// tests/layout_check.h — the harness of the layout tests (test_parallel.cpp, test_pipeline.cpp):
// real titan-train processes under titan-run, every rank's metrics checked step by step against
// the single-process run of the same global batch.
//
// Tolerances: every layout computes the same float32 math in a different reduction order
// (row-parallel partial sums, reduce-scatters, vocab-parallel softmax sums, per-shard norms).
// One such reordering changes a float32 sum by a few ulps (~1e-7 relative); over 10 AdamW
// steps the losses measured here stay within ~1e-7 relative and grad norms within ~1.2e-6
// (per-shard float32 norms vs one norm per full tensor). 1e-5 relative is ~10x that margin and
// still far below any real bug (a missed reduction or a wrong shard moves the loss by > 1e-3).
#pragma once

#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/job_runs.h"

#if !defined(TITAN_RUN_PATH) || !defined(TITAN_TRAIN_PATH)
#error "TITAN_RUN_PATH and TITAN_TRAIN_PATH must be defined by the build"
#endif

namespace titan::testing::layout {

namespace fs = std::filesystem;

constexpr double kLossRelTol = 1e-5;
constexpr double kGradNormRelTol = 1e-5;

inline fs::path root() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("titan_test_parallel_" + std::to_string(getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

struct Step {
  double loss = 0, grad_norm = 0;
};

// 10 steps of debugmodel, global batch 8 x seq_len 32 in micro-batches of 2 (so the
// single-process run and small data-parallel degrees accumulate gradients).
inline std::string train_args(const fs::path& dump, int64_t global_batch = 8, int64_t steps = 10) {
  std::ostringstream os;
  os << "--training.seq_len 32 --training.local_batch_size 2 --training.global_batch_size "
     << global_batch << " --training.steps " << steps
     << " --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --training.num_threads 1"
     << " --metrics.peak_flops 1e12 --training.seed 3 --job.dump_folder " << dump.string();
  return os.str();
}

using Run = titan::testing::JobRun;
using titan::testing::run_job;

inline std::vector<Step> read_metrics(const fs::path& path) {
  std::vector<Step> steps;
  for (const auto& j : titan::testing::read_metrics_lines(path))
    if (j.contains("loss"))  // training lines (validation lines carry validation_metrics/*)
      steps.push_back({j.at("loss").get<double>(), j.at("grad_norm").get<double>()});
  return steps;
}

// The validation losses a run logged (its validation lines' validation_metrics/loss), in order.
inline std::vector<double> validation_losses(const fs::path& path) {
  std::vector<double> losses;
  for (const auto& j : titan::testing::read_metrics_lines(path))
    if (j.contains("validation_metrics/loss")) losses.push_back(j.at("validation_metrics/loss").get<double>());
  return losses;
}

// Each logged step's expert load of every MoE layer (metrics.jsonl's expert_load), in order.
inline std::vector<std::vector<double>> expert_loads(const fs::path& path) {
  std::vector<std::vector<double>> loads;
  for (const auto& j : titan::testing::read_metrics_lines(path))
    if (j.contains("expert_load")) loads.push_back(j.at("expert_load").get<std::vector<double>>());
  return loads;
}

// Bit-identical runs: every step's loss and grad norm equal, not just close.
inline void check_same_steps(const std::string& what, const std::vector<Step>& got, const std::vector<Step>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    INFO(what << ", step " << s + 1);
    CHECK(got[s].loss == want[s].loss);
    CHECK(got[s].grad_norm == want[s].grad_norm);
  }
}

// The single-process reference, run once per global batch size and extra overrides (e.g. the
// float8 recipe, which the reference must share with the layout it is compared to).
struct Reference {
  fs::path dump;
  std::vector<Step> steps;
};
inline const Reference& reference_run(int64_t global_batch = 8, const std::string& extra = "") {
  static std::map<std::pair<int64_t, std::string>, Reference> cache;
  const auto key = std::make_pair(global_batch, extra);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const fs::path dump = root() / ("single_" + std::to_string(global_batch) + "_" + std::to_string(cache.size()));
  const Run r = run_job(std::string(TITAN_TRAIN_PATH) + " " + train_args(dump, global_batch) + " " + extra,
                      dump.string() + ".log");
  INFO(r.log);
  REQUIRE(r.exit_code == 0);
  return cache[key] = Reference{dump, read_metrics(dump / "metrics.jsonl")};
}
inline const std::vector<Step>& reference(int64_t global_batch = 8, const std::string& extra = "") {
  return reference_run(global_batch, extra).steps;
}

struct Tolerance {
  double loss = kLossRelTol, grad_norm = kGradNormRelTol;
  double first_loss = kLossRelTol;  // step 1 (identical weights, only reduction order differs)
};

// Runs `nproc` ranks under titan-run with extra config overrides; checks every rank against
// the reference; returns the max relative loss difference seen (for the log).
inline double check_layout(const std::string& name, int nproc, const std::string& overrides,
                    int64_t global_batch = 8, const std::string& shared = "",
                    const Tolerance& tol = {}) {
  const auto& ref = reference(global_batch, shared);
  const fs::path dump = root() / name;
  const Run r = run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node " + std::to_string(nproc) +
                          " -- " + TITAN_TRAIN_PATH + " " + train_args(dump, global_batch) + " " +
                          shared + " " + overrides,
                      dump.string() + ".log");
  INFO(name << ":\n" << r.log);
  REQUIRE(r.exit_code == 0);
  double worst = 0;
  for (int rank = 0; rank < nproc; ++rank) {
    const auto got = read_metrics(dump / ("metrics_rank" + std::to_string(rank) + ".jsonl"));
    REQUIRE(got.size() == ref.size());
    for (size_t s = 0; s < ref.size(); ++s) {
      INFO(name << " rank " << rank << " step " << s + 1);
      CHECK(got[s].loss == Approx(ref[s].loss).epsilon(s == 0 ? tol.first_loss : tol.loss));
      CHECK(got[s].grad_norm == Approx(ref[s].grad_norm).epsilon(tol.grad_norm));
      worst = std::max(worst, std::abs(got[s].loss - ref[s].loss) / ref[s].loss);
    }
  }
  CHECK(fs::exists(dump / "metrics.jsonl"));  // rank 0's, under the single-process name
  WARN(name << ": max relative loss difference vs 1 process " << worst << " (" << r.seconds << " s)");
  return worst;
}

}  // namespace titan::testing::layout
