// trainer/config/pipeline_keys.h — the [parallelism] pipeline keys as the plan's input
// (parallel/pipeline/plan.h), for the trainer and the memory estimate. Header-only: the config
// library itself does not link the parallel one.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "parallel/pipeline/plan.h"
#include "trainer/config/job_config.h"

namespace titan::trainer::config {

inline parallel::pipeline::PipelineConfig pipeline_config(const JobConfig& cfg) {
  const auto& p = cfg.parallelism;
  parallel::pipeline::PipelineConfig pc;
  pc.schedule = p.pipeline_parallel_schedule;
  pc.schedule_csv = p.pipeline_parallel_schedule_csv;
  pc.microbatch_size = p.pipeline_parallel_microbatch_size;
  pc.num_microbatches = p.num_pp_microbatches;
  pc.layers_per_stage = p.pipeline_parallel_layers_per_stage;
  pc.first_stage_less_layers = p.pipeline_parallel_first_stage_less_layers;
  pc.last_stage_less_layers = p.pipeline_parallel_last_stage_less_layers;
  pc.split_points = p.pipeline_parallel_split_points;
  for (const std::string& stage : p.module_fqns_per_model_part) {  // "tok_embeddings layers.0"
    std::vector<std::string> modules;
    std::istringstream words(stage);
    for (std::string m; words >> m;) modules.push_back(m);
    pc.module_fqns.push_back(modules);
  }
  return pc;
}

}  // namespace titan::trainer::config
