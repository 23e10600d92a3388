// planner/pipeline_sim.cpp — see pipeline_sim.h.
//
// Note [Pipeline simulation by events]: a rank starts its next action as soon as that action's
// inputs have arrived. Where the ranks have a device each, an action ends at start + cost, and
// each rank's times follow from its queue and its inputs' end times alone: the simulation
// advances every rank as far as its inputs allow, over and over (fast: the planner runs it for
// thousands of layouts of up to 128 ranks and 2,048 micro-batches). Where the ranks share fewer
// cores than they are (device cpu: four ranks on two cores), a rank that waits gives its core
// share to the ranks that compute: with `busy` of the pp ranks computing, each computes
// min(max_speedup, pp / busy) times faster than when all do (the stage costs' rate), so a
// pipeline's fill and drain cost less there than on GPUs. An action's end then depends on what
// the other ranks do meanwhile: that simulation keeps one clock and a queue of events (an
// action's end, or the moment a waited-for input arrives), and every change of `busy` re-times
// the running actions (their remaining work at the new speed). The two agree where nothing is
// shared (tests/test_planner.cpp).
#include "planner/pipeline_sim.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <stdexcept>

namespace titan::planner {

namespace {

using parallel::pipeline::Action;
using parallel::pipeline::ActionType;

// Each rank's actions in order, idle slots dropped: a real rank waits on its receive, not on the
// lock-step slot.
std::vector<std::vector<Action>> rank_queues(const parallel::pipeline::PipelinePlan& plan) {
  std::vector<std::vector<Action>> queue(plan.order->size());
  for (size_t r = 0; r < queue.size(); ++r)
    for (const auto& slot : (*plan.order)[r])
      if (slot) queue[r].push_back(*slot);
  return queue;
}

// When each (stage, kind, micro-batch) ended (< 0: not yet); kind: F, or G = the input gradient
// (B or I), or W.
class EndTimes {
 public:
  EndTimes(int stages, int64_t microbatches)
      : m_(static_cast<size_t>(microbatches)), ends_(static_cast<size_t>(stages) * 3 * m_, -1.0) {}
  double& at(int stage, char kind, int64_t mb) {
    const size_t k = kind == 'F' ? 0 : kind == 'G' ? 1 : 2;
    return ends_[(static_cast<size_t>(stage) * 3 + k) * m_ + static_cast<size_t>(mb)];
  }

 private:
  size_t m_;
  std::vector<double> ends_;
};

// Rank r's action `a`: whether its inputs have ended; if so, `ready` raised to when the last of
// them has arrived (a transfer after a remote one), and its cost and kind.
struct Step {
  double cost = 0;
  char kind = 'F';
};
bool inputs_ended(const parallel::pipeline::PipelinePlan& plan, const std::vector<StageCosts>& costs, EndTimes& ends,
                  double transfer_seconds, int r, const Action& a, double& ready, Step& step) {
  const int stages = plan.num_stages();
  auto arrived = [&](int stage, char kind) -> bool {
    const double e = ends.at(stage, kind, a.microbatch);
    if (e < 0) return false;
    const bool remote = plan.stage_rank[static_cast<size_t>(stage)] != r;
    ready = std::max(ready, e + (remote ? transfer_seconds : 0.0));
    return true;
  };
  const StageCosts& c = costs[static_cast<size_t>(a.stage)];
  if (a.type == ActionType::kForward) {
    if (a.stage > 0 && !arrived(a.stage - 1, 'F')) return false;
    step = {c.forward, 'F'};
  } else if (a.type == ActionType::kBackwardWeight) {
    if (!arrived(a.stage, 'G')) return false;
    step = {c.backward_weight, 'W'};
  } else {
    if (!arrived(a.stage, 'F')) return false;
    if (a.stage + 1 < stages && !arrived(a.stage + 1, 'G')) return false;
    step = {a.type == ActionType::kBackward ? c.backward : c.backward_input, 'G'};
  }
  return true;
}

std::logic_error cannot_finish(const parallel::pipeline::PipelinePlan& plan, int r, const Action& a) {
  return std::logic_error("pipeline order of " + plan.schedule_name + " cannot finish: pp rank " + std::to_string(r) +
                          " waits at " + a.str());
}

// A device per rank: every rank advanced as far as its inputs allow, until none can move.
PipelineTiming simulate_devices(const parallel::pipeline::PipelinePlan& plan, const std::vector<StageCosts>& costs,
                                double transfer_seconds) {
  const int ranks = static_cast<int>(plan.order->size());
  const std::vector<std::vector<Action>> queue = rank_queues(plan);
  EndTimes ends(plan.num_stages(), plan.microbatches);
  PipelineTiming t;
  t.busy_seconds.assign(static_cast<size_t>(ranks), 0.0);
  std::vector<double> free_at(static_cast<size_t>(ranks), 0.0);
  std::vector<size_t> next(static_cast<size_t>(ranks), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < ranks; ++r) {
      const auto& q = queue[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      for (; i < q.size(); ++i) {
        double ready = free_at[static_cast<size_t>(r)];
        Step step;
        if (!inputs_ended(plan, costs, ends, transfer_seconds, r, q[i], ready, step)) break;
        free_at[static_cast<size_t>(r)] = ready + step.cost;
        t.busy_seconds[static_cast<size_t>(r)] += step.cost;
        ends.at(q[i].stage, step.kind, q[i].microbatch) = ready + step.cost;
        progress = true;
      }
    }
  }
  for (int r = 0; r < ranks; ++r) {
    if (next[static_cast<size_t>(r)] != queue[static_cast<size_t>(r)].size())
      throw cannot_finish(plan, r, queue[static_cast<size_t>(r)][next[static_cast<size_t>(r)]]);
    t.step_seconds = std::max(t.step_seconds, free_at[static_cast<size_t>(r)]);
  }
  return t;
}

// Ranks sharing cores: by events (the Note).
PipelineTiming simulate_shared_cores(const parallel::pipeline::PipelinePlan& plan, const std::vector<StageCosts>& costs,
                                     double transfer_seconds, double max_speedup) {
  const int ranks = static_cast<int>(plan.order->size());
  const int stages = plan.num_stages();
  const std::vector<std::vector<Action>> queue = rank_queues(plan);
  EndTimes ends(stages, plan.microbatches);
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
  std::vector<double> wake_at(static_cast<size_t>(ranks), -1.0);  // the wake-up pending per rank
  PipelineTiming t;
  t.busy_seconds.assign(static_cast<size_t>(ranks), 0.0);
  double now = 0, speed = 1.0;
  int busy = 0;
  auto speed_of = [&](int n) { return n == 0 ? 1.0 : std::clamp(static_cast<double>(ranks) / n, 1.0, max_speedup); };
  auto schedule_end = [&](int r) {
    const Running& a = run[static_cast<size_t>(r)];
    events.push({now + a.remaining / speed, r, ++version[static_cast<size_t>(r)]});
  };
  // `busy` changed: re-time every running action if the speed did.
  auto retime = [&](int started) {
    const double s = speed_of(busy);
    if (s == speed) {
      if (started >= 0) schedule_end(started);
      return;
    }
    for (Running& a : run) {
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
    double ready = now;
    Step step;
    if (!inputs_ended(plan, costs, ends, transfer_seconds, r, q[next[static_cast<size_t>(r)]], ready, step)) return;
    if (ready > now) {
      // Its inputs arrive at `ready`, whoever asks: one wake-up per rank and time.
      if (wake_at[static_cast<size_t>(r)] != ready) events.push({ready, r, kWake});
      wake_at[static_cast<size_t>(r)] = ready;
      return;
    }
    a = {true, step.cost, now, now, step.kind};
    ++busy;
    retime(r);
  };

  for (int r = 0; r < ranks; ++r) try_start(r);
  while (!events.empty()) {
    const Event e = events.top();
    events.pop();
    if (e.version == kWake) {
      now = e.time;
      wake_at[static_cast<size_t>(e.rank)] = -1.0;
      try_start(e.rank);
      continue;
    }
    Running& a = run[static_cast<size_t>(e.rank)];
    if (!a.on || e.version != version[static_cast<size_t>(e.rank)]) continue;  // re-timed since
    now = e.time;
    const Action& act = queue[static_cast<size_t>(e.rank)][next[static_cast<size_t>(e.rank)]];
    ends.at(act.stage, a.kind, act.microbatch) = now;
    t.busy_seconds[static_cast<size_t>(e.rank)] += now - a.started;
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
      throw cannot_finish(plan, r, queue[static_cast<size_t>(r)][next[static_cast<size_t>(r)]]);
  t.step_seconds = now;
  return t;
}

}  // namespace

double PipelineTiming::idle_fraction() const {
  if (step_seconds <= 0 || busy_seconds.empty()) return 0;
  return 1.0 - *std::max_element(busy_seconds.begin(), busy_seconds.end()) / step_seconds;
}

PipelineTiming simulate_pipeline(const parallel::pipeline::PipelinePlan& plan, const std::vector<StageCosts>& costs,
                                 double transfer_seconds, double max_speedup) {
  return max_speedup > 1.0 ? simulate_shared_cores(plan, costs, transfer_seconds, max_speedup)
                           : simulate_devices(plan, costs, transfer_seconds);
}

}  // namespace titan::planner
