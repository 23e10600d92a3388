// parallel/pipeline/orders.cpp — see orders.h. The generators follow
// torch.distributed.pipelining's (schedules.py: ScheduleGPipe, Schedule1F1B, ScheduleLoopedBFS,
// ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble); the tests pin
// their output against orders torch generated.
#include "parallel/pipeline/orders.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "util/read_file.h"

namespace titan::parallel::pipeline {
namespace {

struct KindInfo {
  PipelineScheduleKind kind;
  const char* name;
  bool single_stage;
  bool v_placement;
};

constexpr KindInfo kKinds[] = {
    {PipelineScheduleKind::kGPipe, "GPipe", true, false},
    {PipelineScheduleKind::k1F1B, "1F1B", true, false},
    {PipelineScheduleKind::kInterleaved1F1B, "Interleaved1F1B", false, false},
    {PipelineScheduleKind::kLoopedBFS, "LoopedBFS", false, false},
    {PipelineScheduleKind::kInterleavedZeroBubble, "InterleavedZeroBubble", false, false},
    {PipelineScheduleKind::kZBVZeroBubble, "ZBVZeroBubble", false, true},
};

const KindInfo& info(PipelineScheduleKind kind) {
  for (const KindInfo& k : kKinds)
    if (k.kind == kind) return k;
  throw std::logic_error("unknown pipeline schedule kind");
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Action act(int stage, ActionType type, int64_t microbatch) { return Action{stage, type, microbatch}; }

void append_idle(RankActions& actions, int64_t n) {
  for (int64_t i = 0; i < n; ++i) actions.emplace_back(std::nullopt);
}

// GPipe: every forward, then every backward (torch's ScheduleGPipe order).
PipelineOrder gpipe(int pp, int64_t m) {
  PipelineOrder order(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankActions& a = order[static_cast<size_t>(r)];
    append_idle(a, r);
    for (int64_t i = 0; i < m; ++i) a.push_back(act(r, ActionType::kForward, i));
    append_idle(a, 3 * (pp - 1 - r));
    for (int64_t i = 0; i < m; ++i) a.push_back(act(r, ActionType::kBackward, i));
  }
  return order;
}

// 1F1B: pp - 1 - r warm-up forwards, then a forward and a backward in turn, then the remaining
// backwards (torch's Schedule1F1B, numbered from 0 on every rank: See orders.h).
PipelineOrder one_f_one_b(int pp, int64_t m) {
  PipelineOrder order(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankActions& a = order[static_cast<size_t>(r)];
    append_idle(a, r);
    const int64_t warmup = pp - 1 - r;
    for (int64_t i = 0; i < warmup; ++i) a.push_back(act(r, ActionType::kForward, i));
    append_idle(a, 2 * (pp - 1 - r));
    int64_t f = warmup, b = 0;
    for (int64_t i = 0; i < m - warmup; ++i) {
      a.push_back(act(r, ActionType::kForward, f++));
      a.push_back(act(r, ActionType::kBackward, b++));
    }
    while (b < m) {
      append_idle(a, 1);
      a.push_back(act(r, ActionType::kBackward, b++));
    }
  }
  return order;
}

// LoopedBFS: all micro-batches through each local stage in turn, backwards in reverse.
PipelineOrder looped_bfs(int pp, int stages_per_rank, int64_t m) {
  PipelineOrder order(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    RankActions& a = order[static_cast<size_t>(r)];
    const std::vector<int> stages = stages_of_rank(r, pp, pp * stages_per_rank, false);
    append_idle(a, r);
    for (int s : stages)
      for (int64_t i = 0; i < m; ++i) a.push_back(act(s, ActionType::kForward, i));
    append_idle(a, 2 * (pp - 1 - r));
    for (auto s = stages.rbegin(); s != stages.rend(); ++s)
      for (int64_t i = m - 1; i >= 0; --i) a.push_back(act(*s, ActionType::kBackward, i));
  }
  return order;
}

// Micro-batches per round of the interleaved schedules; m must be a multiple of the rounds.
int64_t microbatches_per_round(int pp, int64_t m) {
  const int64_t rounds = std::max<int64_t>(1, m / pp);
  return m / rounds;
}

// Interleaved1F1B (zero_bubble false) and InterleavedZeroBubble (true): warm-up forwards over the
// local stages round by round, then forward + backward in turn, then the cooldown backwards; the
// zero-bubble variant runs I instead of B and puts each W right after a later I (from the rank's
// own 1F1B position on), the rest at the end.
RankActions interleaved_rank(int pp, int stages_per_rank, int64_t m, int r, bool zero_bubble) {
  const int64_t per_round = microbatches_per_round(pp, m);
  const int64_t total = m * stages_per_rank;
  const int64_t warmup =
      std::min<int64_t>((stages_per_rank - 1) * per_round + (zero_bubble ? 1 : 2) * (pp - 1 - r), total);
  const int64_t steady = total - warmup;
  const int64_t cooldown = warmup;
  auto forward_stage = [&](int64_t op) { return static_cast<int>(((op / per_round) % stages_per_rank) * pp + r); };
  auto backward_stage = [&](int64_t op) {
    return static_cast<int>((stages_per_rank - 1 - ((op - warmup) / per_round) % stages_per_rank) * pp + r);
  };
  std::map<int, int64_t> next_f, next_b, next_w;  // per stage: the next micro-batch of each kind
  RankActions a;
  append_idle(a, r);
  const int64_t idle_after_warmup =
      zero_bubble ? pp - r - 1 : (stages_per_rank * pp + 2 * (pp - 1 - r)) - (warmup + r);
  const ActionType backward = zero_bubble ? ActionType::kBackwardInput : ActionType::kBackward;
  std::vector<int64_t> backward_ops;  // the ops whose I ran, in order; W follows them
  size_t weights_done = 0;
  auto weight = [&] {
    const int s = backward_stage(backward_ops[weights_done++]);
    a.push_back(act(s, ActionType::kBackwardWeight, next_w[s]++));
  };
  for (int64_t op = 0; op < warmup + steady + cooldown; ++op) {
    if (op < warmup) {
      const int s = forward_stage(op);
      a.push_back(act(s, ActionType::kForward, next_f[s]++));
      if (op == warmup - 1) append_idle(a, idle_after_warmup);
      continue;
    }
    if (op < warmup + steady) {
      const int s = forward_stage(op);
      a.push_back(act(s, ActionType::kForward, next_f[s]++));
    } else if (!zero_bubble) {
      append_idle(a, 1);
    }
    const int s = backward_stage(op);
    a.push_back(act(s, backward, next_b[s]++));
    backward_ops.push_back(op);
    if (zero_bubble && op - warmup >= r) weight();
  }
  while (zero_bubble && weights_done < backward_ops.size()) weight();
  return a;
}

// InterleavedZeroBubble's last pass (torch's _add_bubbles_to_actions): replay every rank in
// lock-step and hold back a forward of stage s > 0 (an idle slot instead) until the forward of
// stage s - 1 for its micro-batch ran in an earlier step.
PipelineOrder add_forward_bubbles(const PipelineOrder& order) {
  int stages = 0;
  int64_t m = 0;
  for (const RankActions& actions : order)
    for (const std::optional<Action>& x : actions)
      if (x) stages = std::max(stages, x->stage + 1), m = std::max(m, x->microbatch + 1);
  // Which (stage, micro-batch) forwards ran in an earlier step: flat flags.
  std::vector<uint8_t> forward_done(static_cast<size_t>(stages) * static_cast<size_t>(m), 0);
  auto done = [&](int stage, int64_t mb) -> uint8_t& {
    return forward_done[static_cast<size_t>(stage) * static_cast<size_t>(m) + static_cast<size_t>(mb)];
  };
  PipelineOrder out(order.size());
  std::vector<size_t> next(order.size(), 0);
  std::vector<std::pair<int, int64_t>> this_step;
  while (true) {
    bool finished = true;
    this_step.clear();
    for (size_t r = 0; r < order.size(); ++r) {
      if (next[r] >= order[r].size()) continue;
      finished = false;
      const std::optional<Action>& x = order[r][next[r]];
      if (!x) {
        out[r].emplace_back(std::nullopt);
        ++next[r];
      } else if (x->type == ActionType::kForward && x->stage > 0 && !done(x->stage - 1, x->microbatch)) {
        out[r].emplace_back(std::nullopt);  // its input is not there yet: wait a step
      } else {
        out[r].push_back(*x);
        if (x->type == ActionType::kForward) this_step.emplace_back(x->stage, x->microbatch);
        ++next[r];
      }
    }
    for (const auto& [stage, mb] : this_step) done(stage, mb) = 1;
    if (finished) return out;
  }
}

PipelineOrder interleaved(int pp, int stages_per_rank, int64_t m, bool zero_bubble) {
  PipelineOrder order;
  for (int r = 0; r < pp; ++r) order.push_back(interleaved_rank(pp, stages_per_rank, m, r, zero_bubble));
  return zero_bubble ? add_forward_bubbles(order) : order;
}

// ZBVZeroBubble: rank r holds chunk 0 = stage r and chunk 1 = stage 2 pp - 1 - r; the order runs
// n = max(2 pp - 1, m) micro-batch slots and leaves the ones past m idle.
PipelineOrder zbv_zero_bubble(int pp, int64_t m) {
  const int num_stages = 2 * pp;
  const int64_t n = std::max<int64_t>(2 * pp - 1, m);
  PipelineOrder order;
  for (int r = 0; r < pp; ++r) {
    const int c0 = r, c1 = num_stages - 1 - r;
    RankActions a;
    append_idle(a, r);
    int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto add = [&](int stage, ActionType type, int64_t& counter) { a.push_back(act(stage, type, counter++)); };
    auto add_at = [&](int stage, ActionType type, int64_t mb) { a.push_back(act(stage, type, mb)); };
    for (int i = 0; i < 2 * (pp - r) - 1; ++i) add(c0, ActionType::kForward, f0);
    for (int i = 0; i < r; ++i) {
      add(c1, ActionType::kForward, f1);
      add(c0, ActionType::kForward, f0);
    }
    for (int i = 0; i < pp - r; ++i) {
      add(c1, ActionType::kForward, f1);
      add_at(c1, ActionType::kBackwardInput, b1);
      add(c1, ActionType::kBackwardWeight, b1);
    }
    while (f1 < f0 || f0 < n) {
      if (f0 < n) add(c0, ActionType::kForward, f0);
      add_at(c0, ActionType::kBackwardInput, b0);
      add(c0, ActionType::kBackwardWeight, b0);
      add(c1, ActionType::kForward, f1);
      add_at(c1, ActionType::kBackwardInput, b1);
      add(c1, ActionType::kBackwardWeight, b1);
    }
    int64_t w0 = b0, w1 = b1;
    for (int i = 0; i < r; ++i) {
      add(c0, ActionType::kBackwardInput, b0);
      add(c1, ActionType::kBackwardInput, b1);
    }
    for (int i = 0; i < pp - r; ++i) {
      add(c0, ActionType::kBackwardInput, b0);
      add(c0, ActionType::kBackwardWeight, w0);
    }
    while (w1 < b1) add(c1, ActionType::kBackwardWeight, w1);
    while (w0 < b0) add(c0, ActionType::kBackwardWeight, w0);
    for (auto& x : a)
      if (x && x->microbatch >= m) x.reset();
    order.push_back(std::move(a));
  }
  return order;
}

std::string at_step(int rank, size_t step) {
  return "rank " + std::to_string(rank) + ", step " + std::to_string(step) + ": ";
}

}  // namespace

const std::vector<PipelineScheduleKind>& pipeline_schedule_kinds() {
  static const std::vector<PipelineScheduleKind> kinds = [] {
    std::vector<PipelineScheduleKind> v;
    for (const KindInfo& k : kKinds) v.push_back(k.kind);
    return v;
  }();
  return kinds;
}

const char* pipeline_schedule_name(PipelineScheduleKind kind) { return info(kind).name; }
bool is_single_stage(PipelineScheduleKind kind) { return info(kind).single_stage; }
bool uses_v_placement(PipelineScheduleKind kind) { return info(kind).v_placement; }
int default_stages_per_rank(PipelineScheduleKind kind) { return is_single_stage(kind) ? 1 : 2; }

PipelineScheduleKind pipeline_schedule_from_name(const std::string& name) {
  for (const KindInfo& k : kKinds)
    if (lower(name) == lower(k.name)) return k.kind;
  if (lower(name) == "dualpipev")
    throw std::invalid_argument(
        "pipeline schedule 'DualPipeV' is not supported by titan yet: it overlaps one micro-batch's forward "
        "with another's backward to hide the MoE all-to-all, which titan's expert parallelism runs in "
        "place; ZBVZeroBubble has the same V placement and fills the bubbles with weight gradients");
  std::string valid;
  for (const KindInfo& k : kKinds) valid += std::string(valid.empty() ? "" : ", ") + k.name;
  throw std::invalid_argument("unknown pipeline schedule '" + name + "' (valid: " + valid +
                              "; compared without regard to case)");
}

std::vector<int> stages_of_rank(int rank, int pp, int num_stages, bool v_placement) {
  if (pp < 1 || num_stages % pp != 0)
    throw std::invalid_argument(std::to_string(num_stages) + " pipeline stages cannot be spread evenly over " +
                                std::to_string(pp) + " ranks");
  const int per_rank = num_stages / pp;
  if (v_placement) {
    if (per_rank != 2)
      throw std::invalid_argument("V schedules place exactly 2 stages on each rank, got " + std::to_string(per_rank));
    return {rank, num_stages - 1 - rank};
  }
  std::vector<int> stages;
  for (int i = 0; i < per_rank; ++i) stages.push_back(rank + i * pp);
  return stages;
}

void check_pipeline_schedule(PipelineScheduleKind kind, int pp, int stages_per_rank, int64_t microbatches) {
  const std::string name = pipeline_schedule_name(kind);
  const int64_t num_stages = static_cast<int64_t>(pp) * stages_per_rank;
  if (pp < 1 || stages_per_rank < 1 || microbatches < 1)
    throw std::invalid_argument("pipeline schedule " + name +
                                " needs pp, stages per rank and micro-batches >= 1, got " +
                                std::to_string(pp) + ", " + std::to_string(stages_per_rank) + ", " +
                                std::to_string(microbatches));
  if (is_single_stage(kind) && stages_per_rank != 1)
    throw std::invalid_argument(name + " is a single-stage schedule: it runs exactly 1 stage per rank, got " +
                                std::to_string(stages_per_rank));
  if (!is_single_stage(kind) && !uses_v_placement(kind) && stages_per_rank < 2)
    throw std::invalid_argument(name + " is a multi-stage schedule: it runs at least 2 stages per rank, got " +
                                std::to_string(stages_per_rank));
  if (uses_v_placement(kind) && stages_per_rank != 2)
    throw std::invalid_argument(name + " requires exactly 2 stages per rank, but got " +
                                std::to_string(stages_per_rank));
  if (is_single_stage(kind) && microbatches < num_stages)
    throw std::invalid_argument(name + ": the number of microbatches (" + std::to_string(microbatches) +
                                ") must be greater than or equal to the number of stages (" +
                                std::to_string(num_stages) + ")");
  if (kind == PipelineScheduleKind::kInterleaved1F1B || kind == PipelineScheduleKind::kInterleavedZeroBubble) {
    const int64_t rounds = std::max<int64_t>(1, microbatches / pp);
    if (microbatches % rounds != 0)
      throw std::invalid_argument(name +
                                  " requires the number of microbatches to be a multiple of the number of rounds (" +
                                  std::to_string(rounds) + " = max(1, microbatches / pp " + std::to_string(pp) +
                                  ")), but got " + std::to_string(microbatches));
  }
}

PipelineOrder pipeline_order(PipelineScheduleKind kind, int pp, int stages_per_rank, int64_t microbatches) {
  check_pipeline_schedule(kind, pp, stages_per_rank, microbatches);
  switch (kind) {
    case PipelineScheduleKind::kGPipe: return gpipe(pp, microbatches);
    case PipelineScheduleKind::k1F1B: return one_f_one_b(pp, microbatches);
    case PipelineScheduleKind::kLoopedBFS: return looped_bfs(pp, stages_per_rank, microbatches);
    case PipelineScheduleKind::kInterleaved1F1B: return interleaved(pp, stages_per_rank, microbatches, false);
    case PipelineScheduleKind::kInterleavedZeroBubble: return interleaved(pp, stages_per_rank, microbatches, true);
    case PipelineScheduleKind::kZBVZeroBubble: return zbv_zero_bubble(pp, microbatches);
  }
  throw std::logic_error("unknown pipeline schedule kind");
}

std::vector<int> validate_pipeline_order(const PipelineOrder& order, int pp, int num_stages, int64_t microbatches) {
  if (static_cast<int>(order.size()) != pp)
    throw std::invalid_argument("the schedule has " + std::to_string(order.size()) + " ranks, the pipeline " +
                                std::to_string(pp) + " (pipeline_parallel_degree)");
  std::vector<int> owner(static_cast<size_t>(num_stages), -1);
  // Per stage and type (F, B, I, W), which micro-batches ran so far, and how many: flat flags,
  // since the layout planner validates thousands of orders of hundreds of micro-batches.
  constexpr int kTypes = 4;
  auto type_index = [](ActionType t) {
    return t == ActionType::kForward ? 0 : t == ActionType::kBackward ? 1 : t == ActionType::kBackwardInput ? 2 : 3;
  };
  const auto m = static_cast<size_t>(std::max<int64_t>(0, microbatches));
  std::vector<uint8_t> ran(static_cast<size_t>(num_stages) * kTypes * m, 0);
  std::vector<int64_t> count(static_cast<size_t>(num_stages) * kTypes, 0);
  auto ran_at = [&](int stage, int type, int64_t mb) -> uint8_t& {
    return ran[(static_cast<size_t>(stage) * kTypes + static_cast<size_t>(type)) * m + static_cast<size_t>(mb)];
  };
  for (int r = 0; r < pp; ++r) {
    const RankActions& actions = order[static_cast<size_t>(r)];
    for (size_t step = 0; step < actions.size(); ++step) {
      if (!actions[step]) continue;
      const Action& x = *actions[step];
      auto where = [&] { return at_step(r, step) + x.str() + ": "; };
      if (x.stage < 0 || x.stage >= num_stages)
        throw std::invalid_argument(where() + "stage " + std::to_string(x.stage) + " does not exist (stages 0.." +
                                    std::to_string(num_stages - 1) + ")");
      if (x.microbatch < 0 || x.microbatch >= microbatches)
        throw std::invalid_argument(where() + "micro-batch " + std::to_string(x.microbatch) + " does not exist (" +
                                    std::to_string(microbatches) + " micro-batches)");
      const int type = type_index(x.type);
      if ((x.type == ActionType::kBackward || x.type == ActionType::kBackwardInput) && !ran_at(x.stage, 0, x.microbatch))
        throw std::invalid_argument(where() + "a backward of stage " + std::to_string(x.stage) + ", micro-batch " +
                                    std::to_string(x.microbatch) + " without first running its forward");
      if (x.type == ActionType::kBackwardWeight && !ran_at(x.stage, 2, x.microbatch))
        throw std::invalid_argument(where() + "a weight backward (W) of stage " + std::to_string(x.stage) +
                                    ", micro-batch " + std::to_string(x.microbatch) +
                                    " without first running its input backward (I)");
      uint8_t& seen = ran_at(x.stage, type, x.microbatch);
      if (seen) throw std::invalid_argument(where() + "runs a second time");
      seen = 1;
      ++count[static_cast<size_t>(x.stage) * kTypes + static_cast<size_t>(type)];
      int& o = owner[static_cast<size_t>(x.stage)];
      if (o >= 0 && o != r)
        throw std::invalid_argument(where() + "stage " + std::to_string(x.stage) + " is assigned to both rank " +
                                    std::to_string(o) + " and rank " + std::to_string(r));
      o = r;
    }
  }
  for (int s = 0; s < num_stages; ++s) {
    const int64_t* c = &count[static_cast<size_t>(s) * kTypes];
    const int64_t f = c[0], b = c[1], i = c[2], w = c[3];
    const std::string stage = "stage " + std::to_string(s) + ": ";
    if (owner[static_cast<size_t>(s)] < 0) throw std::invalid_argument(stage + "no rank runs it");
    if (f != microbatches)
      throw std::invalid_argument(stage + std::to_string(f) + " forwards, expected " + std::to_string(microbatches));
    if (i != w)
      throw std::invalid_argument(stage + "I and W must come in pairs, got I=" + std::to_string(i) + ", W=" +
                                  std::to_string(w));
    if (b + i != microbatches)
      throw std::invalid_argument(stage + "expected " + std::to_string(microbatches) + " backwards, got B=" +
                                  std::to_string(b) + ", I=" + std::to_string(i) + ", W=" + std::to_string(w));
    for (int64_t mb = 0; mb < microbatches; ++mb)  // a micro-batch's backward runs once, whole (B) or split (I + W)
      if (ran_at(s, 1, mb) && ran_at(s, 2, mb))
        throw std::invalid_argument(stage + "micro-batch " + std::to_string(mb) +
                                    " has both a full backward (B) and an input backward (I)");
  }
  return owner;
}

PipelineOrder parse_pipeline_csv(const std::string& text, const std::string& origin) {
  PipelineOrder order;
  std::istringstream lines(text);
  std::string line;
  int row = 0;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    RankActions actions;
    std::istringstream cells(line);
    std::string cell;
    int column = 0;
    auto add = [&](std::string c) {
      const size_t b = c.find_first_not_of(" \t"), e = c.find_last_not_of(" \t");
      c = b == std::string::npos ? "" : c.substr(b, e - b + 1);
      if (c.empty()) {
        actions.emplace_back(std::nullopt);
      } else {
        try {
          actions.push_back(parse_action(c));
        } catch (const std::invalid_argument& e) {
          const bool comm = c.find("SEND") != std::string::npos || c.find("RECV") != std::string::npos ||
                            c.find("SHARD") != std::string::npos || c.find("REDUCE") != std::string::npos;
          throw std::invalid_argument(origin + ": row " + std::to_string(row) + " (rank " + std::to_string(row) +
                                      "), column " + std::to_string(column) + ": " +
                                      (comm ? "communication action '" + c +
                                                  "': a schedule file holds compute actions only (F, B, I, W); "
                                                  "titan derives the transfers between stages from them"
                                            : std::string(e.what())));
        }
      }
      ++column;
    };
    while (std::getline(cells, cell, ',')) add(cell);
    if (!line.empty() && line.back() == ',') add("");
    order.push_back(std::move(actions));
    ++row;
  }
  if (order.empty())
    throw std::invalid_argument(origin + ": the schedule file is empty (one row per pipeline rank expected)");
  return order;
}

PipelineOrder read_pipeline_csv(const std::string& path) {
  constexpr size_t kMaxBytes = size_t{64} << 20;  // far above any real schedule
  try {
    return parse_pipeline_csv(util::read_regular_file(path, kMaxBytes), "pipeline schedule file '" + path + "'");
  } catch (const util::ReadFileError& e) {
    throw std::invalid_argument(std::string("pipeline schedule file ") + e.what());
  }
}

std::string pipeline_order_csv(const PipelineOrder& order) {
  std::string out;
  for (const RankActions& actions : order) {
    for (size_t i = 0; i < actions.size(); ++i) out += (i ? "," : "") + (actions[i] ? actions[i]->str() : "");
    out += "\n";
  }
  return out;
}

std::string format_pipeline_order(const PipelineOrder& order) {
  size_t steps = 0;
  for (const RankActions& a : order) steps = std::max(steps, a.size());
  const size_t label_digits = std::to_string(steps == 0 ? 0 : steps - 1).size();
  auto label = [&](size_t i) {
    std::string n = std::to_string(i);
    return "Step " + std::string(label_digits - n.size(), '0') + n;
  };
  auto cell = [&](size_t r, size_t i) {
    return i < order[r].size() && order[r][i] ? order[r][i]->str() : std::string();
  };
  std::vector<size_t> width(order.size());
  for (size_t r = 0; r < order.size(); ++r) {
    width[r] = ("Rank " + std::to_string(r)).size();
    for (size_t i = 0; i < steps; ++i) width[r] = std::max(width[r], cell(r, i).size());
  }
  std::ostringstream os;
  os << std::string(label(0).size() + 2, ' ');
  for (size_t r = 0; r < order.size(); ++r)
    os << (r ? " " : "") << std::left << std::setw(static_cast<int>(width[r])) << "Rank " + std::to_string(r);
  os << "\n";
  for (size_t i = 0; i < steps; ++i) {
    os << label(i) << ": ";
    for (size_t r = 0; r < order.size(); ++r)
      os << (r ? " " : "") << std::left << std::setw(static_cast<int>(width[r])) << cell(r, i);
    os << "\n";
  }
  return os.str();
}

}  // namespace titan::parallel::pipeline
