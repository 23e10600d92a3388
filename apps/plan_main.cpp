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
    std::cout << "usage: titan-plan [--job.config_file FILE] [--section.key value ...]\n\n"
                 "Prints the fastest layouts of the job on the cluster that the trainer accepts and that fit\n"
                 "in memory, each with its predicted step time, tokens/s per GPU, MFU, memory, exposed\n"
                 "communication and pipeline idle time (docs/planner.md). The [plan] keys below describe the\n"
                 "cluster and the search; every other key is the job's, as titan-train reads it\n"
                 "(titan-train --help lists them): the model, training.seq_len, training.global_batch_size.\n"
                 "--plan.explain LAYOUT (a row of the table, as printed) breaks one layout down term by term.\n\n"
                 "examples:\n"
                 "  titan-plan --job.config_file configs/llama3_70b.toml --plan.nodes 32 --plan.device h100 \\\n"
                 "      --training.global_batch_size 512\n"
                 "  titan-plan --model.name gpt_oss --model.flavor 120b --training.seq_len 8192 --plan.nodes 4 \\\n"
                 "      --plan.precisions bf16,rowwise --plan.explain "
                 "'dp_replicate=1,dp_shard=1,tp=4,cp=1,pp=8,schedule=1F1B,microbatch=1,split=layers,"
                 "async_tp=1,local_batch=128,ac=selective,precision=bf16'\n"
              << titan::trainer::config::config_help_of("plan");
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
