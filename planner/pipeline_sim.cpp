// planner/pipeline_sim.cpp — see pipeline_sim.h.
#include "planner/pipeline_sim.h"

#include <algorithm>
#include <stdexcept>

namespace titan::planner {

double PipelineTiming::idle_fraction() const {
  if (step_seconds <= 0 || busy_seconds.empty()) return 0;
  return 1.0 - *std::max_element(busy_seconds.begin(), busy_seconds.end()) / step_seconds;
}

PipelineTiming simulate_pipeline(const parallel::pipeline::PipelinePlan& plan, const std::vector<StageCosts>& costs,
                                 double transfer_seconds) {
  using parallel::pipeline::Action;
  using parallel::pipeline::ActionType;
  const int ranks = static_cast<int>(plan.order->size());
  const int stages = plan.num_stages();
  // Each rank's actions in order, idle slots dropped: a real rank waits on its receive, not on
  // the lock-step slot.
  std::vector<std::vector<Action>> queue(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    for (const auto& slot : (*plan.order)[static_cast<size_t>(r)])
      if (slot) queue[static_cast<size_t>(r)].push_back(*slot);
  // When each (stage, kind, micro-batch) ended (< 0: not yet); kind: F, or G = the input
  // gradient (B or I), or W.
  const int64_t m = plan.microbatches;
  std::vector<double> done(static_cast<size_t>(stages) * 3 * static_cast<size_t>(m), -1.0);
  auto slot = [&](int stage, char kind, int64_t mb) -> double& {
    const int k = kind == 'F' ? 0 : kind == 'G' ? 1 : 2;
    return done[(static_cast<size_t>(stage) * 3 + k) * static_cast<size_t>(m) + static_cast<size_t>(mb)];
  };
  auto ended = [&](int stage, char kind, int64_t mb) -> const double* {
    const double& e = slot(stage, kind, mb);
    return e < 0 ? nullptr : &e;
  };
  PipelineTiming t;
  t.busy_seconds.assign(static_cast<size_t>(ranks), 0.0);
  std::vector<double> free_at(static_cast<size_t>(ranks), 0.0);
  std::vector<size_t> next(static_cast<size_t>(ranks), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < ranks; ++r) {
      auto& q = queue[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      for (; i < q.size(); ++i) {
        const Action& a = q[i];
        double ready = free_at[static_cast<size_t>(r)];
        auto after = [&](int stage, char kind) -> bool {  // the input from `stage` has arrived
          const double* e = ended(stage, kind, a.microbatch);
          if (!e) return false;
          const bool remote = plan.stage_rank[static_cast<size_t>(stage)] != r;
          ready = std::max(ready, *e + (remote ? transfer_seconds : 0.0));
          return true;
        };
        const StageCosts& c = costs[static_cast<size_t>(a.stage)];
        double cost = 0;
        char kind = 'F';
        if (a.type == ActionType::kForward) {
          if (a.stage > 0 && !after(a.stage - 1, 'F')) break;
          cost = c.forward;
        } else if (a.type == ActionType::kBackwardWeight) {
          if (!after(a.stage, 'G')) break;
          cost = c.backward_weight;
          kind = 'W';
        } else {
          if (!after(a.stage, 'F')) break;
          if (a.stage + 1 < stages && !after(a.stage + 1, 'G')) break;
          cost = a.type == ActionType::kBackward ? c.backward : c.backward_input;
          kind = 'G';
        }
        free_at[static_cast<size_t>(r)] = ready + cost;
        t.busy_seconds[static_cast<size_t>(r)] += cost;
        slot(a.stage, kind, a.microbatch) = ready + cost;
        progress = true;
      }
    }
  }
  for (int r = 0; r < ranks; ++r) {
    if (next[static_cast<size_t>(r)] != queue[static_cast<size_t>(r)].size())
      throw std::logic_error("pipeline order of " + plan.schedule_name + " cannot finish: pp rank " + std::to_string(r) +
                             " waits at " + queue[static_cast<size_t>(r)][next[static_cast<size_t>(r)]].str());
    t.step_seconds = std::max(t.step_seconds, free_at[static_cast<size_t>(r)]);
  }
  return t;
}

}  // namespace titan::planner
