// apps/dry_run.h — titan-train's start-up dry run: `--dry-run-rank R --dry-run-world N`.
//
// Builds the model of the job's config on the meta device, shards it for rank R of an N-rank
// layout (the config's parallelism degrees resolved against N, data_parallel_shard_degree -1 =
// the rest), allocates and initializes ONLY that rank's share on training.device, and prints a
// start-up table (phase, seconds, RSS, peak RSS) — no data, no training, no collectives: the
// mesh's groups have no transport (Comm backend "none"), so anything that would communicate
// fails instead of hanging. What it answers: how long start-up takes and what it costs one
// rank of a job the machine at hand could never run whole (405B as one rank of FSDP 512).
#pragma once

#include <iosfwd>

#include "trainer/config/job_config.h"

namespace titan::apps {

struct DryRunRequest {
  int rank = -1;   // --dry-run-rank
  int world = -1;  // --dry-run-world
};

// Runs the dry run and writes the table to `out`. Throws titan::trainer::ConfigError for a bad
// rank/world/layout (naming the value and the valid range), std::exception otherwise.
void run_dry_run(const trainer::config::JobConfig& cfg, const DryRunRequest& request, std::ostream& out);

}  // namespace titan::apps
