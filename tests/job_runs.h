// tests/job_runs.h — run a titan job as a shell command and read its metrics, for the tests
// that start real processes.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace titan::testing {

struct JobRun {
  int exit_code = -1;
  std::string log;      // stdout + stderr
  double seconds = 0;   // wall time of the whole command
};

// Runs `command` with OMP_NUM_THREADS=1 and every rank's output shown, into `log_path`.
inline JobRun run_job(const std::string& command, const std::filesystem::path& log_path) {
  const auto start = std::chrono::steady_clock::now();
  const std::string full = "OMP_NUM_THREADS=1 LOG_RANK= " + command + " > " + log_path.string() + " 2>&1";
  const int status = std::system(full.c_str());
  JobRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log_path);
  r.log.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

// One JSON object per logged step (metrics.jsonl / metrics_rank<R>.jsonl).
inline std::vector<nlohmann::json> read_metrics_lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("no metrics file " + path.string());
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace titan::testing
