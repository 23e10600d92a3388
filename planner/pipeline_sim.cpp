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
#include <deque>
#include <memory>
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

// Note [Device simulation compiled]: with a device per rank, an action ends at
// max(its rank free, each input's end + its transfer) + its cost: a longest path over the order's
// dependencies, whose values do not depend on the order they are computed in. So an order is
// walked once without times (every rank advanced as far as its inputs allow, until none can move:
// the same walk finds an order that cannot finish), and what the walk visited, in that sequence,
// is kept as flat steps (the end slots it reads and writes); a layout's simulation is then one
// pass over them with its costs. The planner simulates the same order for many layouts (another
// local batch of the same micro-batches, another split, CP method or precision): the compiled
// steps are kept per thread, by order, up to kKeptSteps steps.
struct CompiledStep {
  int32_t out;         // its end's slot
  int32_t input[2];    // the slots it waits for (kNoInput: the slot that stays 0)
  int32_t rank;
  int32_t cost;        // stage * 4 + 0 F, 1 B, 2 I, 3 W
  uint8_t remote[2];   // whether each input arrives from another rank (its transfer added)
};
struct CompiledOrder {
  std::shared_ptr<const parallel::pipeline::PipelineOrder> order;  // the key, kept alive
  std::vector<int> stage_rank;
  int64_t microbatches = 0;
  std::vector<CompiledStep> steps;
  size_t slots = 0;  // end slots, the last one kNoInput's
};
constexpr size_t kKeptSteps = size_t{1} << 22;

std::shared_ptr<const CompiledOrder> compile_order(const parallel::pipeline::PipelinePlan& plan) {
  const int ranks = static_cast<int>(plan.order->size());
  const int stages = plan.num_stages();
  const std::vector<std::vector<Action>> queue = rank_queues(plan);
  auto compiled = std::make_shared<CompiledOrder>();
  compiled->order = plan.order, compiled->stage_rank = plan.stage_rank, compiled->microbatches = plan.microbatches;
  const size_t m = static_cast<size_t>(plan.microbatches);
  const size_t no_input = static_cast<size_t>(stages) * 3 * m;
  if (no_input >= static_cast<size_t>(INT32_MAX)) throw std::logic_error("pipeline simulation: order too large to compile");
  compiled->slots = no_input + 1;
  auto slot = [m](int stage, int k, int64_t mb) {
    return static_cast<int32_t>((static_cast<size_t>(stage) * 3 + static_cast<size_t>(k)) * m + static_cast<size_t>(mb));
  };
  std::vector<uint8_t> ended(compiled->slots, 0);
  ended[no_input] = 1;
  std::vector<size_t> next(static_cast<size_t>(ranks), 0);
  size_t total = 0;
  for (const auto& q : queue) total += q.size();
  compiled->steps.reserve(total);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < ranks; ++r) {
      const auto& q = queue[static_cast<size_t>(r)];
      for (size_t& i = next[static_cast<size_t>(r)]; i < q.size(); ++i) {
        const Action& a = q[i];
        CompiledStep step{};
        step.rank = r;
        step.input[0] = step.input[1] = static_cast<int32_t>(no_input);
        auto wait_for = [&](int n, int stage, int k) {
          step.input[n] = slot(stage, k, a.microbatch);
          step.remote[n] = plan.stage_rank[static_cast<size_t>(stage)] != r;
        };
        if (a.type == ActionType::kForward) {
          if (a.stage > 0) wait_for(0, a.stage - 1, 0);
          step.out = slot(a.stage, 0, a.microbatch), step.cost = a.stage * 4;
        } else if (a.type == ActionType::kBackwardWeight) {
          wait_for(0, a.stage, 1);
          step.out = slot(a.stage, 2, a.microbatch), step.cost = a.stage * 4 + 3;
        } else {
          wait_for(0, a.stage, 0);
          if (a.stage + 1 < stages) wait_for(1, a.stage + 1, 1);
          step.out = slot(a.stage, 1, a.microbatch);
          step.cost = a.stage * 4 + (a.type == ActionType::kBackward ? 1 : 2);
        }
        if (!ended[static_cast<size_t>(step.input[0])] || !ended[static_cast<size_t>(step.input[1])]) break;
        ended[static_cast<size_t>(step.out)] = 1;
        compiled->steps.push_back(step);
        progress = true;
      }
    }
  }
  for (int r = 0; r < ranks; ++r)
    if (next[static_cast<size_t>(r)] != queue[static_cast<size_t>(r)].size())
      throw cannot_finish(plan, r, queue[static_cast<size_t>(r)][next[static_cast<size_t>(r)]]);
  return compiled;
}

// The compiled order of `plan`, from this thread's kept ones when it is there.
std::shared_ptr<const CompiledOrder> compiled_order(const parallel::pipeline::PipelinePlan& plan) {
  thread_local std::deque<std::shared_ptr<const CompiledOrder>> kept;  // most recent first
  thread_local size_t kept_steps = 0;
  for (auto it = kept.begin(); it != kept.end(); ++it)
    if ((*it)->order == plan.order && (*it)->microbatches == plan.microbatches && (*it)->stage_rank == plan.stage_rank) {
      std::shared_ptr<const CompiledOrder> hit = *it;
      kept.erase(it);
      kept.push_front(hit);
      return hit;
    }
  std::shared_ptr<const CompiledOrder> compiled = compile_order(plan);
  if (compiled->steps.size() > kKeptSteps) return compiled;
  kept.push_front(compiled);
  kept_steps += compiled->steps.size();
  while (kept_steps > kKeptSteps) {
    kept_steps -= kept.back()->steps.size();
    kept.pop_back();
  }
  return compiled;
}

// A device per rank (Note [Device simulation compiled]).
PipelineTiming simulate_devices(const parallel::pipeline::PipelinePlan& plan, const std::vector<StageCosts>& costs,
                                double transfer_seconds) {
  const int ranks = static_cast<int>(plan.order->size());
  const std::shared_ptr<const CompiledOrder> compiled = compiled_order(plan);
  std::vector<double> cost(costs.size() * 4);
  for (size_t s = 0; s < costs.size(); ++s)
    cost[s * 4] = costs[s].forward, cost[s * 4 + 1] = costs[s].backward, cost[s * 4 + 2] = costs[s].backward_input,
             cost[s * 4 + 3] = costs[s].backward_weight;
  std::vector<double> ends(compiled->slots, 0.0);  // the last slot (no input) stays 0
  const double transfer[2] = {0.0, transfer_seconds};
  PipelineTiming t;
  t.busy_seconds.assign(static_cast<size_t>(ranks), 0.0);
  std::vector<double> free_at(static_cast<size_t>(ranks), 0.0);
  for (const CompiledStep& step : compiled->steps) {
    double& free = free_at[static_cast<size_t>(step.rank)];
    const double ready = std::max({free, ends[static_cast<size_t>(step.input[0])] + transfer[step.remote[0]],
                                   ends[static_cast<size_t>(step.input[1])] + transfer[step.remote[1]]});
    const double c = cost[static_cast<size_t>(step.cost)];
    free = ready + c;
    t.busy_seconds[static_cast<size_t>(step.rank)] += c;
    ends[static_cast<size_t>(step.out)] = free;
  }
  for (int r = 0; r < ranks; ++r) t.step_seconds = std::max(t.step_seconds, free_at[static_cast<size_t>(r)]);
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
