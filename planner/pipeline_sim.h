// planner/pipeline_sim.h — a pipeline schedule's step time from its actual order: every pp rank
// runs its actions (parallel/pipeline/orders.h) in order, each as soon as the rank is free and
// its input has arrived, with each action's cost per stage. What the layout planner uses instead
// of the (p - 1) / (m + p - 1) formula: it sees the schedule's real order, the uneven stages
// (the output layer on the last) and the zero-bubble schedules' split backward.
#pragma once

#include <vector>

#include "parallel/pipeline/plan.h"

namespace titan::planner {

struct StageCosts {
  double forward = 0;          // F, seconds per micro-batch
  double backward = 0;         // B = I + W
  double backward_input = 0;   // I
  double backward_weight = 0;  // W
};

struct PipelineTiming {
  double step_seconds = 0;            // the last action's end
  std::vector<double> busy_seconds;   // per pp rank
  double idle_fraction() const;       // of the busiest rank's step: 1 - max busy / step
};

// `stage_costs[s]`: stage s's costs when every rank computes; `transfer_seconds`: one activation
// (or its gradient) between two ranks; `max_speedup`: where ranks share cores (device cpu, more
// ranks than cores), how much faster a rank computes while others wait, at most (1: a device
// per rank; Note [Pipeline simulation by events]). Throws std::logic_error if the order cannot
// finish (it would hang the real run).
PipelineTiming simulate_pipeline(const parallel::pipeline::PipelinePlan& plan, const std::vector<StageCosts>& stage_costs,
                                 double transfer_seconds, double max_speedup = 1.0);

}  // namespace titan::planner
