// planner/planner.h — the layout planner: every layout of a job on a cluster that the trainer
// accepts (config::check_layout, the trainer's own start-up checks) and that fits in memory (the
// trainer's memory estimate), ranked by predicted step time (planner/predict.h); the rest
// counted by why they were rejected. `titan-plan` and `titan-train --job.plan` print it
// (docs/planner.md).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "planner/cluster.h"
#include "planner/layout.h"
#include "planner/predict.h"
#include "trainer/config/job_config.h"

namespace titan::trainer::observe {
class BlockTermsMemo;  // trainer/observe/memory_estimate.h
}

namespace titan::planner {

struct PlannedLayout {
  Layout layout;
  Prediction prediction;
};

struct PlanResult {
  Cluster cluster;
  int64_t global_batch = 0;      // rows per optimizer step, the same for every layout
  int64_t considered = 0;        // candidates looked at
  std::vector<PlannedLayout> fits;  // accepted and fitting, fastest first
  int64_t rejected_by_rules = 0, rejected_by_memory = 0;
  // Not examined (plan.exhaustive false): a candidate some fitting one of the same layout beats
  // by construction (See Note [Dominated layouts] in planner.cpp).
  int64_t dominated = 0;
  // Not listed: a split=flops candidate whose stages hold exactly what its split=layers twin's
  // do (the same run; the twin is listed).
  int64_t same_split = 0;
  // Why: the trainer's error (rules) or "memory: <estimate> > <capacity>", with how many
  // candidates and one family each reason hit.
  std::map<std::string, std::pair<int64_t, std::string>> reasons;
};

// The user's config as the planner reads it: on a GPU cluster the compute dtype is bfloat16 and
// the device cuda (torchtitan's defaults there), whatever the machine running the planner is.
trainer::config::JobConfig planning_config(const trainer::config::JobConfig& cfg);

// Every candidate of the planner's search space for `world` ranks (before any check): each
// product dp_replicate x dp_shard x tp x cp x pp = world, with every schedule and micro-batch
// size under pp, every rotate method under cp, async TP on and off under tp, expert-parallel
// degrees dividing dp_shard x cp for MoE flavors, every local batch dividing the global batch's
// share of one data-parallel rank (under pp: at most 16 x pp micro-batches per pass), and
// plan.ac_modes x plan.precisions.
// The families (degrees, and ep for MoE flavors) of `world` ranks, and one family's candidates.
std::vector<Layout> layout_families(const trainer::config::JobConfig& cfg, int64_t world);
std::vector<Layout> family_layouts(const trainer::config::JobConfig& cfg, const Layout& family, int64_t global_batch);
// A family's structures: the fields the trainer's checks read beyond the degrees (local batch,
// schedule, micro-batch, split, CP method; AC "", precision "", async TP off), and one
// structure's candidates (async TP x plan.ac_modes x plan.precisions). family_layouts is every
// structure's candidates, in order.
std::vector<Layout> family_structures(const trainer::config::JobConfig& cfg, const Layout& family, int64_t global_batch);
void add_structure_candidates(const trainer::config::JobConfig& cfg, const Layout& structure, std::vector<Layout>& out);
std::vector<Layout> enumerate_layouts(const trainer::config::JobConfig& cfg, int64_t world, int64_t global_batch);

// The global batch every layout keeps: training.global_batch_size, or when unset
// training.local_batch_size x the world (what pure FSDP would run).
int64_t planned_global_batch(const trainer::config::JobConfig& cfg, int64_t world);

// Checks, estimates and predicts every candidate (plan.exhaustive) or every one not dominated
// (the default); a family that no candidate of it can pass (a refusal not about pipeline
// micro-batches, or parameters + optimizer state over the GPU's memory) is rejected whole.
// `progress(families done, families)` is called per family.
PlanResult plan_layouts(const trainer::config::JobConfig& cfg, const Cluster& cluster,
                        const std::function<void(int64_t, int64_t)>& progress = {});

// The memory estimate of `cfg` (a layout applied) for its busiest pipeline rank, in bytes.
double estimated_memory_bytes(const trainer::config::JobConfig& cfg, int64_t world, int64_t vocab_size,
                              const parallel::pipeline::PipelinePlan* pipeline = nullptr,
                              trainer::observe::BlockTermsMemo* memo = nullptr);

// The vocabulary the run trains: the tokenizer's (model.tokenizer_path), else the flavor's.
int64_t vocab_of(const trainer::config::JobConfig& cfg);
// v with `digits` decimals; bytes in GiB with one.
std::string fixed(double v, int digits);
std::string gib(double bytes);

// titan-plan / --job.plan (planner/report.cpp): the table (or plan.explain's breakdown) to `out`,
// progress to `err`.
// Returns the exit code: 0, or 1 when nothing fits.
int run_planner(const trainer::config::JobConfig& cfg, std::ostream& out, std::ostream& err);

}  // namespace titan::planner
