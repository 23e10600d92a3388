// tests/training_runs.h — whole titan-train runs (one process or titan-run ranks) and their
// metrics, for the checkpoint and restart tests: the common job, its loss lines, and comparing
// a resumed run's steps with an uninterrupted one's.
#pragma once

#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace titan::testing::runs {

namespace fs = std::filesystem;

inline std::vector<std::string> job_args(const fs::path& dump, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {
      "--training.seq_len", "32", "--training.local_batch_size", "2", "--training.global_batch_size", "8",
      "--training.steps", "20", "--lr_scheduler.warmup_steps", "2", "--metrics.log_freq", "1",
      "--training.num_threads", "1", "--metrics.peak_flops", "1e12", "--training.seed", "3",
      "--checkpoint.enable_checkpoint", "--checkpoint.interval", "10", "--job.dump_folder", dump.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

inline std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += " " + a;
  return s;
}

struct Step {
  int64_t step = 0;
  double loss = 0, grad_norm = 0;
};

inline std::vector<Step> read_metrics(const fs::path& dump) {
  std::ifstream in(dump / "metrics.jsonl");
  std::vector<Step> steps;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    steps.push_back({j.at("step").get<int64_t>(), j.at("loss").get<double>(), j.at("grad_norm").get<double>()});
  }
  return steps;
}

// titan-train (nproc 1) or titan-run with nproc ranks; returns the log, requires exit 0.
inline std::string run_ranks(int nproc, const std::vector<std::string>& args, const fs::path& log) {
  const std::string train = TITAN_TRAIN_PATH + joined(args);
  const std::string cmd = nproc == 1 ? train
                                     : std::string(TITAN_RUN_PATH) + " --nproc-per-node " + std::to_string(nproc) +
                                           " -- " + train;
  const int status = std::system(("OMP_NUM_THREADS=1 LOG_RANK= " + cmd + " > " + log.string() + " 2>&1").c_str());
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  INFO(text);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return text;
}

// The steps of `got` (a resumed run) against the same steps of `want`: equal, or within `rel`.
inline void check_steps(const std::vector<Step>& want, const std::vector<Step>& got, double rel) {
  REQUIRE(!got.empty());
  size_t first = 0;
  while (first < want.size() && want[first].step != got[0].step) ++first;
  REQUIRE(want.size() - first == got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << got[i].step);
    if (rel == 0) {
      CHECK(got[i].loss == want[first + i].loss);
      CHECK(got[i].grad_norm == want[first + i].grad_norm);
    } else {
      CHECK(got[i].loss == Approx(want[first + i].loss).epsilon(rel));
      CHECK(got[i].grad_norm == Approx(want[first + i].grad_norm).epsilon(rel));
    }
  }
}

// Damages a checkpoint file: inverts every bit of the byte `from_end` bytes before its end.
// Inverting, not writing a fixed value: a fixed value leaves the file unchanged whenever the
// data already held it (1 time in 256 over random tensors), and such a run once failed CI.
inline void corrupt_byte(const fs::path& file, std::uintmax_t from_end) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(fs::file_size(file) - from_end);
  f.seekg(at);
  const char byte = static_cast<char>(f.get());
  f.seekp(at);
  f.put(static_cast<char>(~byte));
  REQUIRE(f.good());
}

}  // namespace titan::testing::runs
