// titan-train's start-up dry run (apps/dry_run.h): one rank of a layout it does not run, built,
// sharded and initialized in this one process, with its start-up table; and its bad input.
// One process, the debug model: about a second per case.
#include <catch2/catch.hpp>

#include <string>

#include "tests/job_runs.h"
#include "tests/temp_dir.h"

namespace {
titan::testing::JobRun dry_run(const std::string& args, const std::string& name) {
  const auto dir = titan::testing::fresh_temp_dir("dry_run_" + name);
  return titan::testing::run_job(std::string(TITAN_TRAIN_PATH) + " " + args, dir / "log.txt");
}
}  // namespace

TEST_CASE("dry run: one rank of HSDP 2 x TP 2 holds half of the debug model", "[dry_run]") {
  const auto r = dry_run("--dry-run-rank 3 --dry-run-world 4 --parallelism.data_parallel_replicate_degree 2 "
                         "--parallelism.tensor_parallel_degree 2", "hsdp_tp");
  INFO(r.log);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.log, Catch::Contains("rank 3 of pp 1 x dp_replicate 2 x dp_shard 1 x cp 1 x tp 2 = 4 ranks"));
  CHECK_THAT(r.log, Catch::Contains("init this rank's share"));
  // HSDP replicas hold the same shard; TP 2 halves every linear and the embedding (258 rows or
  // columns split 129 + 129: no padding), the norms (13 x 256 = 3,328 of 5,247,232 elements) are
  // replicated: (5,247,232 - 3,328) / 2 + 3,328 = 2,625,280 elements.
  CHECK_THAT(r.log, Catch::Contains("this rank: 2625280 elements"));
}

TEST_CASE("dry run: a rank of FSDP 2 x CP 4 holds 1/8 of the model and names its positions", "[dry_run][cp]") {
  const auto r = dry_run("--dry-run-rank 5 --dry-run-world 8 --parallelism.data_parallel_shard_degree 2 "
                         "--parallelism.context_parallel_degree 4 --training.seq_len 64", "fsdp_cp");
  INFO(r.log);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.log, Catch::Contains("rank 5 of pp 1 x dp_replicate 1 x dp_shard 2 x cp 4 x tp 1 = 8 ranks"));
  // FSDP shards over dp_shard x cp = 8 ranks, dim 0 padded to a multiple of 8: the embedding and
  // output (258 rows -> 264) hold 33 x 256 each, everything else divides:
  // (5,247,232 - 2 x 66,048) / 8 + 2 x 8,448 = 656,288 elements.
  CHECK_THAT(r.log, Catch::Contains("this rank: 656288 elements"));
  // cp rank 1 of 4: chunks 1 and 6 of 8 chunks of 8 positions.
  CHECK_THAT(r.log, Catch::Contains("(cp rank 1 of 4, attention allgather): positions 8-15 and 48-55 of 64"));
}

TEST_CASE("dry run: bad ranks and layouts are one error each, exit 2", "[dry_run]") {
  struct Case { const char* args; const char* message; };
  for (const Case& c : {Case{"--dry-run-rank 4 --dry-run-world 4", "--dry-run-rank 4: must be in [0, 4)"},
                        Case{"--dry-run-rank 0", "needs both --dry-run-rank R and --dry-run-world N"},
                        Case{"--dry-run-rank x --dry-run-world 2", "--dry-run-rank needs an integer value"},
                        Case{"--dry-run-rank 0 --dry-run-world 0", "--dry-run-world 0: the number of ranks"},
                        Case{"--dry-run-rank 0 --dry-run-world 8 --parallelism.tensor_parallel_degree 3",
                             "Invalid parallel dims"}}) {
    const auto r = dry_run(c.args, "bad");
    INFO(c.args << "\n" << r.log);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.log, Catch::Contains(c.message));
  }
}
