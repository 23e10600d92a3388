// titan-train: one training process (one rank). Reads the job config (TOML + --section.key
// overrides), then trains. Exit codes: 0 done (or stopped by a signal at a step boundary),
// 1 runtime failure, 2 bad input (config, flags), 128 + signal when SIGINT/SIGTERM arrives
// during start-up (trainer/signals.h). Every exception ends as one line naming what failed.
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "apps/dry_run.h"
#include "planner/planner.h"
#include "launcher/launcher.h"
#include "parallel/comm/process_group.h"
#include "launcher/world.h"
#include "trainer/config/job_config.h"
#include "trainer/observe/memory.h"
#include "trainer/observe/memory_estimate.h"
#include "trainer/signals.h"
#include "trainer/train.h"
#include "util/atomic_file.h"
#include "util/logging.h"
#include "util/malloc_policy.h"

using namespace titan::trainer;
using namespace titan::trainer::config;
using namespace titan::trainer::observe;
using namespace titan::util;

namespace {

// The whole program; main() below turns anything that escapes it into one line and an exit code.
int run(int argc, char** argv) {
  // Before any tensor exists: storages made earlier would keep the old allocator's deleter.
  install_cpu_memory_tracker();
  // Started by titan-run: exit with it, even through a wrapper (launcher/launcher.h).
  titan::launcher::watch_launcher([] { titan::util::remove_temp_files_in_flight(); });

  // --estimate-memory: same config and overrides, but print the per-rank memory estimate
  // (trainer/observe/memory_estimate.h) instead of training. Handled here: it is not a job setting.
  std::vector<std::string> args(argv + 1, argv + argc);
  bool estimate_only = false;
  // --dry-run-rank R --dry-run-world N: the start-up dry run (apps/dry_run.h), not a job setting.
  titan::apps::DryRunRequest dry_run;
  bool dry_run_rank_given = false, dry_run_world_given = false;
  for (auto it = args.begin(); it != args.end();) {
    if (*it == "--estimate-memory") {
      estimate_only = true;
      it = args.erase(it);
    } else if (*it == "--dry-run-rank" || *it == "--dry-run-world") {
      const std::string flag = *it;
      it = args.erase(it);
      int value = -1;
      try {
        size_t used = 0;
        if (it == args.end()) throw std::invalid_argument("missing");
        value = std::stoi(*it, &used);
        if (used != it->size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        std::fprintf(stderr, "titan-train: error: %s needs an integer value (e.g. %s %s)\n",
                     flag.c_str(), flag.c_str(), flag == "--dry-run-rank" ? "0" : "8");
        return 2;
      }
      it = args.erase(it);
      (flag == "--dry-run-rank" ? dry_run.rank : dry_run.world) = value;
      (flag == "--dry-run-rank" ? dry_run_rank_given : dry_run_world_given) = true;
    } else {
      ++it;
    }
  }
  const bool dry_run_requested = dry_run_rank_given || dry_run_world_given;

  JobConfig cfg;
  try {
    cfg = parse_job_config(args);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "titan-train: error: %s\n", e.what());
    return 2;
  }
  if (cfg.help_requested) {
    std::cout << config_help();
    return 0;
  }
  if (cfg.job.print_args) std::cout << config_to_toml(cfg) << std::flush;
  if (estimate_only) {
    try {
      EstimateInputs in = estimate_inputs_from_config(cfg);
      // Pipeline parallel: one report per pp rank (each holds other stages).
      const int pp_ranks = in.pipeline ? in.pipeline->pp : 1;
      for (in.pp_rank = 0; in.pp_rank < pp_ranks; ++in.pp_rank)
        std::cout << format_memory_estimate(in, estimate_memory(in)) << std::flush;
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "titan-train: error: %s\n", e.what());
      return 2;
    }
  }

  if (cfg.job.plan) {  // the layout planner (planner/planner.h): titan-plan runs the same
    try {
      return titan::planner::run_planner(cfg, std::cout, std::cerr);
    } catch (const ConfigError& e) {
      std::fprintf(stderr, "titan-train: error: %s\n", e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "titan-train: error: planner: %s\n", e.what());
      return 1;
    }
  }

  if (dry_run_requested) {
    try {
      if (!dry_run_rank_given || !dry_run_world_given)
        throw ConfigError("the dry run needs both --dry-run-rank R and --dry-run-world N");
      titan::apps::run_dry_run(cfg, dry_run, std::cout);
      return 0;
    } catch (const ConfigError& e) {
      std::fprintf(stderr, "titan-train: error: %s\n", e.what());
      return 2;
    } catch (const c10::Error& e) {
      std::fprintf(stderr, "titan-train: error: dry run: %s\n", e.what_without_backtrace());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "titan-train: error: dry run: %s\n", e.what());
      return 1;
    }
  }

  // Distributed (WORLD_SIZE > 1 from titan-run / torchrun / srun): every line carries the rank.
  int rank = -1;
  try {
    const titan::launcher::WorldInfo world = titan::launcher::world_from_env();
    const char* prefixed = std::getenv("TITAN_RUN_PREFIXES_OUTPUT");  // titan-run adds "[rank N] "
    if (world.world_size > 1 && !(prefixed && std::string(prefixed) == "1")) rank = world.rank;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "titan-train: error: distributed environment: %s\n", e.what());
    return 2;
  }
  init_logging(rank, cfg.metrics.disable_color_printing);
  try {
    Trainer trainer(cfg);
    const TrainResult result = trainer.train();
    if (result.stopped_by_signal)
      log_info("stopped cleanly after step " + std::to_string(result.steps_completed));
    else
      log_info("training completed: " + std::to_string(result.steps_completed) + " steps");
    return 0;
  } catch (const ConfigError& e) {
    log_error(std::string("bad config: ") + e.what());
    return 2;
  } catch (const titan::parallel::comm::CommError& e) {
    // Usually the echo of another rank's failure (its sockets closed). Exit a moment later, so
    // that the launcher reports the rank that failed first rather than this one.
    log_error(e.what());
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return 1;
  } catch (const c10::Error& e) {
    log_error(e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    log_error(e.what());
    return 1;
  }
}

}  // namespace

// A signal during start-up ends the process with a message (trainer/signals.h), also while the
// libraries' static initializers run (LibTorch's take ~0.15 s before main): the handlers are
// installed from the executable's .preinit_array, which the dynamic loader runs before any
// library's initializer (as sanitizers install theirs). Only the loader's own ~2 ms of mapping
// and relocation come before it.
static void install_stop_handlers_first(int, char**, char**) { install_stop_handlers(); }
__attribute__((section(".preinit_array"), used)) static void (*const g_preinit_stop_handlers)(int, char**, char**) =
    &install_stop_handlers_first;

int main(int argc, char** argv) {
  // First of all: a signal before the training loop ends the process with a message.
  install_stop_handlers();
  titan::util::keep_freed_memory_for_reuse();  // Note [Freed memory kept for the next step]
  // Whatever escapes run() (before logging exists, or a type no handler there names) is one
  // line on stderr that says what failed; never std::terminate's abort.
  const char* failed = "titan-train: error: ";
  try {
    return run(argc, argv);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%sbad config: %s\n", failed, e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%sout of memory (std::bad_alloc) during start-up or training\n", failed);
  } catch (const std::ios_base::failure& e) {
    std::fprintf(stderr, "%sI/O failure (std::ios_base::failure): %s\n", failed, e.what());
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s%s\n", failed, e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s%s\n", failed, e.what());
  } catch (...) {
    std::fprintf(stderr, "%san exception of unknown type\n", failed);
  }
  return 1;
}
