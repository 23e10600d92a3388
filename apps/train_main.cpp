// titan-train: one training process (one rank). Reads the job config (TOML + --section.key
// overrides), then trains. Exit codes: 0 done (or stopped by a signal at a step boundary),
// 1 runtime failure, 2 bad input (config, flags).
#include <c10/util/Exception.h>

#include <cstdio>
#include <iostream>

#include "trainer/config.h"
#include "trainer/logging.h"
#include "trainer/memory.h"
#include "trainer/signals.h"
#include "trainer/train.h"

using namespace titan::trainer;

int main(int argc, char** argv) {
  // Before any tensor exists: storages made earlier would keep the old allocator's deleter.
  install_cpu_memory_tracker();

  JobConfig cfg;
  try {
    cfg = parse_job_config(argc - 1, argv + 1);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "titan-train: error: %s\n", e.what());
    return 2;
  }
  if (cfg.help_requested) {
    std::cout << config_help();
    return 0;
  }
  if (cfg.job.print_args) std::cout << config_to_toml(cfg) << std::flush;

  init_logging(/*rank=*/-1, cfg.metrics.disable_color_printing);
  install_stop_handlers();
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
  } catch (const c10::Error& e) {
    log_error(e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    log_error(e.what());
    return 1;
  }
}
