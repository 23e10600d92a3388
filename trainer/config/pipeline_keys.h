// trainer/config/pipeline_keys.h — the [parallelism] pipeline keys as the plan's input
// (parallel/pipeline/plan.h), for the trainer and the memory estimate. Header-only: the config
// library itself does not link the parallel one.
#pragma once

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "model/args.h"
#include "model/family.h"
#include "model/flavors.h"
#include "parallel/pipeline/plan.h"
#include "trainer/config/job_config.h"

namespace titan::trainer::config {

// Note [Stage split by FLOPs]: training FLOPs per token of a block (its matmuls, and attention
// over the causal half of the square, which the flash kernels compute), of norm + output (the
// output projection's GEMMs) and of the embedding (a lookup: none).
inline parallel::pipeline::ModuleFlops module_flops(const model::ModelArgs& args, int64_t seq_len) {
  const model::ParamCount count = model::count_params(args);
  const double output_params = static_cast<double>(args.vocab_size) * static_cast<double>(args.dim);
  const double block_params = static_cast<double>(count.active - count.embedding - args.dim) -
                              (args.tie_embeddings ? 0.0 : output_params);
  parallel::pipeline::ModuleFlops costs;
  costs.block = (6.0 * block_params + 0.5 * model::attention_flops_per_token(args, seq_len)) /
                static_cast<double>(args.n_layers);
  // Blocks that differ (a family's dense and MoE blocks): each its own cost.
  const model::Family& family = model::family(args.family);
  std::vector<double> per_block;
  for (int64_t i = 0; i < args.n_layers; ++i)
    per_block.push_back(6.0 * static_cast<double>(count.per_block_active[static_cast<size_t>(i)]) +
                        0.5 * family.attention_flops_per_token(args, i, seq_len));
  if (std::any_of(per_block.begin(), per_block.end(), [&](double c) { return c != per_block.front(); }))
    costs.per_block = std::move(per_block);
  costs.output = 6.0 * output_params;
  costs.embedding = 0;
  return costs;
}

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
  pc.stage_balance = p.pipeline_parallel_stage_balance;
  // Only the FLOP split reads them (a block's costs: the layout planner builds this config for
  // every pipeline candidate it checks).
  if (pc.stage_balance == "flops") {
    // The last model's, per thread: the same model's costs for every candidate of a search.
    thread_local std::string last_model;
    thread_local int64_t last_seq_len = -1;
    thread_local parallel::pipeline::ModuleFlops last_flops;
    const std::string model = cfg.model.name + '\x1f' + cfg.model.flavor;
    if (model != last_model || cfg.training.seq_len != last_seq_len) {
      last_flops = module_flops(model::model_flavor(cfg.model.name, cfg.model.flavor), cfg.training.seq_len);
      last_model = model, last_seq_len = cfg.training.seq_len;
    }
    pc.module_flops = last_flops;
  }
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
