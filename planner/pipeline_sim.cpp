// planner/pipeline_sim.cpp — see pipeline_sim.h.
//
// Note [Pipeline simulation by events]: the simulation keeps one clock and a queue of events (an
// action's end, or the moment a waited-for input arrives). A rank starts its next action as soon
// as that action's inputs have arrived; an action's end is when its work, at the rank's speed,
// is done. Where the ranks have a device each, the speed is 1 throughout and an action ends at
// start + cost. Where they share fewer cores than they are (device cpu: four ranks on two
// cores), a rank that waits gives its core share to the ranks that compute: with `busy` of the
// pp ranks computing, each computes min(max_speedup, pp / busy) times faster than when all do
// (the stage costs' rate), so a pipeline's fill and drain cost less there than on GPUs. Every
// change of `busy` re-times the running actions (their remaining work at the new speed).
#include "planner/pipeline_sim.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <stdexcept>

namespace titan::planner {

double PipelineTiming::idle_fraction() const {
  if (step_seconds <= 0 || busy_seconds.empty()) return 0;
  return 1.0 - *std::max_element(busy_seconds.begin(), busy_seconds.end()) / step_seconds;
}

PipelineTiming simulate_pipeline(const parallel::pipeline::PipelinePlan& plan, const std::vector<StageCosts>& costs,
                                 double transfer_seconds, double max_speedup) {
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

  struct Running {
    bool on = false;
    double remaining = 0;  // work left, in seconds at the all-busy speed
    double since = 0;      // when `remaining` was last brought up to date
    double started = 0;
    char kind = 'F';
  };
  struct Event {
    double time;
    int rank;
    uint64_t version;  // an end event is stale once its rank's version moved on; kWake: a wake-up
    bool operator>(const Event& o) const { return time > o.time || (time == o.time && rank > o.rank); }
  };
  constexpr uint64_t kWake = UINT64_MAX;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  std::vector<Running> run(static_cast<size_t>(ranks));
  std::vector<uint64_t> version(static_cast<size_t>(ranks), 0);
  std::vector<size_t> next(static_cast<size_t>(ranks), 0);
  PipelineTiming t;
  t.busy_seconds.assign(static_cast<size_t>(ranks), 0.0);
  double now = 0, speed = 1.0;
  int busy = 0;
  const double most = std::max(1.0, max_speedup);
  auto speed_of = [&](int n) { return n == 0 ? 1.0 : std::clamp(static_cast<double>(ranks) / n, 1.0, most); };
  auto schedule_end = [&](int r) {
    Running& a = run[static_cast<size_t>(r)];
    events.push({now + a.remaining / speed, r, ++version[static_cast<size_t>(r)]});
  };
  // `busy` changed: re-time every running action if the speed did.
  auto retime = [&](int started) {
    const double s = speed_of(busy);
    if (s == speed) {
      if (started >= 0) schedule_end(started);
      return;
    }
    for (int r = 0; r < ranks; ++r) {
      Running& a = run[static_cast<size_t>(r)];
      if (!a.on) continue;
      a.remaining = std::max(0.0, a.remaining - (now - a.since) * speed);
      a.since = now;
    }
    speed = s;
    for (int r = 0; r < ranks; ++r)
      if (run[static_cast<size_t>(r)].on) schedule_end(r);
  };
  // Starts rank r's next action if its inputs have arrived, or wakes it when they will.
  auto try_start = [&](int r) {
    Running& a = run[static_cast<size_t>(r)];
    const auto& q = queue[static_cast<size_t>(r)];
    if (a.on || next[static_cast<size_t>(r)] >= q.size()) return;
    const Action& act = q[next[static_cast<size_t>(r)]];
    double ready = now;
    auto arrived = [&](int stage, char kind) -> bool {
      const double e = slot(stage, kind, act.microbatch);
      if (e < 0) return false;
      const bool remote = plan.stage_rank[static_cast<size_t>(stage)] != r;
      ready = std::max(ready, e + (remote ? transfer_seconds : 0.0));
      return true;
    };
    const StageCosts& c = costs[static_cast<size_t>(act.stage)];
    double cost = 0;
    char kind = 'F';
    if (act.type == ActionType::kForward) {
      if (act.stage > 0 && !arrived(act.stage - 1, 'F')) return;
      cost = c.forward;
    } else if (act.type == ActionType::kBackwardWeight) {
      if (!arrived(act.stage, 'G')) return;
      cost = c.backward_weight;
      kind = 'W';
    } else {
      if (!arrived(act.stage, 'F')) return;
      if (act.stage + 1 < stages && !arrived(act.stage + 1, 'G')) return;
      cost = act.type == ActionType::kBackward ? c.backward : c.backward_input;
      kind = 'G';
    }
    if (ready > now) {
      events.push({ready, r, kWake});
      return;
    }
    a = {true, cost, now, now, kind};
    ++busy;
    retime(r);
  };

  for (int r = 0; r < ranks; ++r) try_start(r);
  while (!events.empty()) {
    const Event e = events.top();
    events.pop();
    if (e.version == kWake) {
      now = e.time;
      try_start(e.rank);
      continue;
    }
    Running& a = run[static_cast<size_t>(e.rank)];
    if (!a.on || e.version != version[static_cast<size_t>(e.rank)]) continue;  // re-timed since
    now = e.time;
    const Action& act = queue[static_cast<size_t>(e.rank)][next[static_cast<size_t>(e.rank)]];
    slot(act.stage, a.kind, act.microbatch) = now;
    t.busy_seconds[static_cast<size_t>(e.rank)] += now - a.started;
    a.remaining = 0;
    a.since = now;
    a.on = false;
    ++next[static_cast<size_t>(e.rank)];
    --busy;
    retime(-1);
    // Whose next action this end can release: this rank, and the ranks of the neighbouring
    // stages (the next stage's forward, the previous stage's input gradient).
    try_start(e.rank);
    if (act.stage + 1 < stages) try_start(plan.stage_rank[static_cast<size_t>(act.stage + 1)]);
    if (act.stage > 0) try_start(plan.stage_rank[static_cast<size_t>(act.stage - 1)]);
  }
  for (int r = 0; r < ranks; ++r)
    if (next[static_cast<size_t>(r)] != queue[static_cast<size_t>(r)].size())
      throw std::logic_error("pipeline order of " + plan.schedule_name + " cannot finish: pp rank " + std::to_string(r) +
                             " waits at " + queue[static_cast<size_t>(r)][next[static_cast<size_t>(r)]].str());
  t.step_seconds = now;
  return t;
}

}  // namespace titan::planner
