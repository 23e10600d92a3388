// apps/plan_main.cpp — titan-plan: the layout planner (planner/planner.h, docs/planner.md).
// Takes titan-train's config and overrides (a TOML file, --section.key values) and the [plan]
// keys for the cluster; prints the fastest layouts that the trainer accepts and that fit, or with
// --plan.explain LAYOUT one layout's prediction term by term. The same as titan-train --job.plan.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "planner/planner.h"
#include "trainer/config/job_config.h"

int main(int argc, char** argv) {
  using titan::trainer::config::ConfigError;
  std::vector<std::string> args(argv + 1, argv + argc);
  titan::trainer::config::JobConfig cfg;
  try {
    cfg = titan::trainer::config::parse_job_config(args);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "titan-plan: error: %s\n", e.what());
    return 2;
  }
  if (cfg.help_requested) {
    std::cout << "usage: titan-plan [--job.config_file FILE] [--section.key value ...]\n"
                 "The [plan] keys describe the cluster (titan-train --help lists them); every other key is\n"
                 "the job's, as titan-train reads it. --plan.explain LAYOUT breaks one layout down.\n";
    return 0;
  }
  try {
    return titan::planner::run_planner(cfg, std::cout, std::cerr);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "titan-plan: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "titan-plan: error: %s\n", e.what());
    return 1;
  }
}
