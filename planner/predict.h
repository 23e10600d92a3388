// planner/predict.h — the layout planner's step-time model (Note [Step-time model] in
// predict.cpp): compute at the device's rate, memory-bound work at its bandwidth, each
// collective's exposed time over the link its group crosses, the pipeline's idle time from the
// schedule's real order, and activation-checkpointing recompute.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/args.h"
#include "planner/cluster.h"
#include "planner/layout.h"
#include "trainer/config/parallel_options.h"

namespace titan::planner {

struct Prediction {
  double step_seconds = 0;
  double tokens_per_second_per_gpu = 0;
  double mfu = 0;                 // model FLOPs (no recompute) / (step x bf16 peak), per GPU
  double memory_bytes = 0;        // the memory estimate's, the busiest pp rank
  double pipeline_idle = 0;       // fraction of the step a pp rank waits (0 without pp)
  double exposed_comm_seconds = 0;
  // Each term of the step, seconds (compute, memory-bound, recompute, each collective's exposed
  // time, pipeline idle, optimizer), for plan.explain.
  std::vector<std::pair<std::string, double>> terms;
  std::vector<std::string> notes;  // what the model assumed for this layout
};

// `cfg`: the user's config with the layout applied; `checked`: what config::check_layout made of
// it; `args`: the model with the tokenizer's vocabulary.
Prediction predict(const trainer::config::JobConfig& cfg, const trainer::config::CheckedLayout& checked,
                   const model::ModelArgs& args, const Layout& layout, const Cluster& cluster);

}  // namespace titan::planner
