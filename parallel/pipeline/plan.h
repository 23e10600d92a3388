// parallel/pipeline/plan.h — the pipeline-parallel plan from torchtitan's keys: which modules each
// stage holds, which rank holds each stage, how many micro-batches one pipeline pass runs and
// every rank's actions. Pure arithmetic and file reading, no process group: every impossible
// combination is found here, before any rank connects (the trainer turns the
// std::invalid_argument into a config error).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "parallel/pipeline/orders.h"
#include "parallel/pipeline/split.h"

namespace titan::parallel::pipeline {

// torchtitan's [parallelism] pipeline keys, as the config holds them.
struct PipelineConfig {
  std::string schedule = "1F1B";  // pipeline_parallel_schedule
  std::string schedule_csv;       // pipeline_parallel_schedule_csv: a path, or "" (generated)
  int64_t microbatch_size = 1;    // pipeline_parallel_microbatch_size (v0.1 - v0.2.x)
  int64_t num_microbatches = 0;   // num_pp_microbatches (torchtitan main); 0: from microbatch_size
  int64_t layers_per_stage = 0;   // pipeline_parallel_layers_per_stage; 0: unset
  int64_t first_stage_less_layers = 1;
  int64_t last_stage_less_layers = 1;
  // pipeline_parallel_stage_balance: "layers" (torchtitan's split, by the two keys above) or
  // "flops" (Note [Stage split by FLOPs], by module_flops, which the caller computes from the model).
  std::string stage_balance = "layers";
  ModuleFlops module_flops;
  std::vector<std::string> split_points;              // v0.1's pipeline_parallel_split_points
  std::vector<std::vector<std::string>> module_fqns;  // module_fqns_per_model_part
};

struct PipelinePlan {
  std::string schedule_name;       // "1F1B", or "CSV <path>"
  PipelineScheduleKind kind = PipelineScheduleKind::k1F1B;
  int pp = 1;
  // Per stage, its modules in order. Shared and immutable like the order: the layout planner
  // copies plans by the million, and a plan of 126 blocks names them all.
  std::shared_ptr<const StageModules> stage_modules = std::make_shared<const StageModules>();
  std::vector<model::ModelPart> stage_parts;  // the same as model parts
  std::vector<int> stage_rank;     // per stage, the pp rank that holds it
  int64_t microbatches = 1;        // per pipeline pass (one local batch)
  int64_t microbatch_rows = 1;     // rows of one micro-batch
  // Every pp rank's slots. Shared and immutable: plans of the same (schedule, pp, stages per
  // rank, micro-batches) share one generated order (the layout planner builds thousands).
  std::shared_ptr<const PipelineOrder> order;

  int num_stages() const { return static_cast<int>(stage_modules->size()); }
  std::vector<int> stages_of(int pp_rank) const;  // ascending
  // The start-up plan: one line per rank (its stages and modules), the schedule, the bubble.
  std::vector<std::string> describe() const;
};

// The plan for `pp` ranks, a model of `n_layers` blocks and training.local_batch_size rows per
// pass. Throws std::invalid_argument naming the keys and the valid values: an unknown schedule,
// a microbatch size that does not divide the local batch, more stages than layers, a split the
// schedule cannot run (stages per rank), a micro-batch count it cannot run, norm and output on
// different stages, a CSV that is malformed or not a complete schedule of these stages.
PipelinePlan plan_pipeline(const PipelineConfig& config, int pp, int64_t n_layers, int64_t local_batch_size);

// A stage's modules (contiguous in model order, as check_stage_modules guarantees) as a model
// part; throws std::invalid_argument when norm and output are split between stages.
model::ModelPart model_part_of(const std::vector<std::string>& modules, int stage);

}  // namespace titan::parallel::pipeline
