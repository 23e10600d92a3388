// parallel/pipeline/plan.cpp — see plan.h.
#include "parallel/pipeline/plan.h"
#include "model/param_path.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace titan::parallel::pipeline {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

// A thread-safe memo of a pure function's answers, holding at most `capacity` units (each answer
// weighs what its caller says); past that it starts over. The layout planner asks for the same
// pipeline orders and plans thousands of times, the trainer once.
template <class Key, class Value>
class Memo {
 public:
  explicit Memo(size_t capacity) : capacity_(capacity) {}
  std::optional<Value> find(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto hit = answers_.find(key);
    if (hit == answers_.end()) return std::nullopt;
    return hit->second;
  }
  void keep(const Key& key, const Value& value, size_t weight) {
    std::lock_guard<std::mutex> lock(mu_);
    if (held_ + weight > capacity_) answers_.clear(), held_ = 0;
    if (answers_.emplace(key, value).second) held_ += weight;
  }

 private:
  std::mutex mu_;
  std::map<Key, Value> answers_;
  size_t capacity_;
  size_t held_ = 0;
};

// A generated order and its validation (the stage of every rank), memoized: a pure function of
// (schedule, pp, stages per rank, micro-batches). At most 2M slots (about 50 MB) are kept.
struct GeneratedOrder {
  std::shared_ptr<const PipelineOrder> order;
  std::vector<int> stage_rank;
};
GeneratedOrder generated_order(PipelineScheduleKind kind, int pp, int per_rank, int64_t microbatches) {
  static Memo<std::tuple<int, int, int, int64_t>, GeneratedOrder> memo(size_t{1} << 23);
  const auto key = std::make_tuple(static_cast<int>(kind), pp, per_rank, microbatches);
  if (std::optional<GeneratedOrder> hit = memo.find(key)) return *std::move(hit);
  GeneratedOrder g;
  g.order = std::make_shared<const PipelineOrder>(pipeline_order(kind, pp, per_rank, microbatches));
  g.stage_rank = validate_pipeline_order(*g.order, pp, pp * per_rank, microbatches);
  size_t actions = 0;
  for (const RankActions& r : *g.order) actions += r.size();
  memo.keep(key, g, actions);
  return g;
}

// The stages' modules as model parts.
void set_stage_parts(PipelinePlan& plan) {
  plan.stage_parts.clear();
  for (int s = 0; s < plan.num_stages(); ++s)
    plan.stage_parts.push_back(model_part_of((*plan.stage_modules)[static_cast<size_t>(s)], s));
}

// Runs `f`, adding `context` (the keys the numbers came from) in front of its error.
template <class F>
auto with_context(const std::string& context, F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(context + ": " + e.what());
  }
}

}  // namespace

model::ModelPart model_part_of(const std::vector<std::string>& modules, int stage) {
  model::ModelPart part;
  part.embedding = false;
  part.head = false;
  part.first_layer = -1;
  bool norm = false, output = false;
  for (const std::string& m : modules) {
    if (m == "tok_embeddings") {
      part.embedding = true;
    } else if (m == "norm") {
      norm = true;
    } else if (m == "output") {
      output = true;
    } else {  // "layers.<i>" (check_stage_modules has checked the names and the order)
      const int64_t layer = model::parse_layer_path(m).value().layer;
      if (part.first_layer < 0) part.first_layer = layer;
      part.end_layer = layer + 1;
    }
  }
  if (norm != output)
    throw std::invalid_argument("pipeline stage " + std::to_string(stage) + " holds " + (norm ? "norm" : "output") + " but not " +
                                (norm ? "output" : "norm") +
                                ": titan runs the final norm and the output projection on one stage (put both in "
                                "the same list of parallelism.module_fqns_per_model_part)");
  part.head = norm;
  if (part.first_layer < 0) part.first_layer = part.end_layer = 0;  // no blocks: an empty range
  return part;
}

std::vector<int> PipelinePlan::stages_of(int pp_rank) const {
  std::vector<int> out;
  for (int s = 0; s < num_stages(); ++s)
    if (stage_rank[static_cast<size_t>(s)] == pp_rank) out.push_back(s);
  return out;
}

std::vector<std::string> PipelinePlan::describe() const {
  std::vector<std::string> lines;
  std::ostringstream head;
  head << "pipeline parallel " << pp << ": schedule " << schedule_name << ", " << num_stages() << " stages, "
       << microbatches << " micro-batch" << (microbatches == 1 ? "" : "es") << " of " << microbatch_rows
       << " row" << (microbatch_rows == 1 ? "" : "s") << " per pass";
  lines.push_back(head.str());
  for (int r = 0; r < pp; ++r) {
    std::string line = "  pp rank " + std::to_string(r) + ":";
    for (int s : stages_of(r)) {
      const auto& mods = (*stage_modules)[static_cast<size_t>(s)];
      line += " stage " + std::to_string(s) + " [" + (mods.size() > 4 ? mods.front() + " .. " + mods.back() : join(mods)) + "]";
    }
    size_t slots = 0, busy = 0;
    for (const auto& a : (*order)[static_cast<size_t>(r)]) {
      ++slots;
      busy += a.has_value();
    }
    line += "; " + std::to_string(static_cast<int64_t>(busy)) + " actions in " + std::to_string(static_cast<int64_t>(slots)) + " slots";
    lines.push_back(line);
  }
  return lines;
}

namespace {

PipelinePlan make_plan(const PipelineConfig& c, int pp, int64_t n_layers, int64_t local_batch_size) {
  PipelinePlan plan;
  plan.pp = pp;
  plan.kind = with_context("parallelism.pipeline_parallel_schedule",
                           [&] { return pipeline_schedule_from_name(c.schedule); });
  plan.schedule_name = c.schedule_csv.empty() ? pipeline_schedule_name(plan.kind) : "CSV " + c.schedule_csv;
  // Micro-batches: torchtitan's v0.1 - v0.2 key gives their size, main's their count.
  if (c.num_microbatches > 0) {
    if (local_batch_size % c.num_microbatches != 0)
      throw std::invalid_argument("training.local_batch_size (" + std::to_string(local_batch_size) +
                                  ") must be divisible by parallelism.num_pp_microbatches (" + std::to_string(c.num_microbatches) +
                                  "): each pipeline micro-batch has the same rows");
    plan.microbatches = c.num_microbatches;
    plan.microbatch_rows = local_batch_size / c.num_microbatches;
  } else {
    if (c.microbatch_size < 1 || local_batch_size % c.microbatch_size != 0)
      throw std::invalid_argument("training.local_batch_size (" + std::to_string(local_batch_size) +
                                  ") must be divisible by parallelism.pipeline_parallel_microbatch_size (" +
                                  std::to_string(c.microbatch_size) + "); choose a divisor of the local batch");
    plan.microbatch_rows = c.microbatch_size;
    plan.microbatches = local_batch_size / c.microbatch_size;
  }
  // The split: given module by module, by v0.1 split points, or computed.
  if (c.stage_balance != "layers" && c.stage_balance != "flops")
    throw std::invalid_argument("parallelism.pipeline_parallel_stage_balance '" + c.stage_balance +
                                "': valid values are layers, flops");
  if (c.stage_balance == "flops" && (!c.module_fqns.empty() || !c.split_points.empty()))
    throw std::invalid_argument(
        "parallelism.pipeline_parallel_stage_balance flops computes the split; it cannot be combined with " +
        std::string(!c.module_fqns.empty() ? "parallelism.module_fqns_per_model_part"
                                           : "parallelism.pipeline_parallel_split_points"));
  if (!c.module_fqns.empty() && !c.split_points.empty())
    throw std::invalid_argument(
        "parallelism.module_fqns_per_model_part and parallelism.pipeline_parallel_split_points both set: give one");
  const std::string split_keys =
      !c.module_fqns.empty()    ? "parallelism.module_fqns_per_model_part"
      : !c.split_points.empty() ? "parallelism.pipeline_parallel_split_points"
      : c.stage_balance == "flops"
          ? "the stage split (parallelism.pipeline_parallel_stage_balance flops, pipeline_parallel_layers_per_stage " +
                std::to_string(c.layers_per_stage) + ", " + std::to_string(n_layers) + " layers)"
          : "the stage split (parallelism.pipeline_parallel_layers_per_stage " + std::to_string(c.layers_per_stage) +
                ", pipeline_parallel_first_stage_less_layers " + std::to_string(c.first_stage_less_layers) +
                ", pipeline_parallel_last_stage_less_layers " + std::to_string(c.last_stage_less_layers) + ", " + std::to_string(n_layers) +
                " layers)";
  // A FLOP-balanced split needs the stage count only here: its blocks are placed once the
  // schedule has placed the stages (below).
  const bool by_flops = c.stage_balance == "flops";
  const int num_stages = with_context(split_keys, [&] {
    if (by_flops) {
      const int stages = pipeline_stage_count(plan.kind, pp, n_layers, c.layers_per_stage, 0, 0);
      check_balanced_stage_count(stages, n_layers);
      return stages;
    }
    if (!c.module_fqns.empty()) {
      plan.stage_modules = std::make_shared<const StageModules>(c.module_fqns);
    } else if (!c.split_points.empty()) {
      plan.stage_modules = std::make_shared<const StageModules>(module_fqns_from_split_points(c.split_points, n_layers));
    } else {
      const int stages = pipeline_stage_count(plan.kind, pp, n_layers, c.layers_per_stage, c.first_stage_less_layers,
                                              c.last_stage_less_layers);
      plan.stage_modules = std::make_shared<const StageModules>(
          module_fqns_per_stage(stages, n_layers, c.first_stage_less_layers, c.last_stage_less_layers));
    }
    check_stage_modules(*plan.stage_modules, n_layers);
    set_stage_parts(plan);
    return plan.num_stages();
  });
  if (num_stages % pp != 0)
    throw std::invalid_argument("the split gives " + std::to_string(num_stages) + " pipeline stages, not a multiple of "
                                "parallelism.pipeline_parallel_degree (" + std::to_string(pp) + ")");
  const int per_rank = num_stages / pp;
  const std::string microbatch_keys =
      std::to_string(plan.microbatches) + " micro-batches per pass (training.local_batch_size " + std::to_string(local_batch_size) +
      (c.num_microbatches > 0 ? " over parallelism.num_pp_microbatches"
                              : " / parallelism.pipeline_parallel_microbatch_size " + std::to_string(c.microbatch_size)) +
      ") and " + std::to_string(num_stages) + " stages over " + std::to_string(pp) + " ranks from " + split_keys;
  if (c.schedule_csv.empty()) {
    with_context("parallelism.pipeline_parallel_schedule " + std::string(pipeline_schedule_name(plan.kind)) +
                     " with " + microbatch_keys,
                 [&] {
                   check_pipeline_schedule(plan.kind, pp, per_rank, plan.microbatches);
                   const GeneratedOrder generated = generated_order(plan.kind, pp, per_rank, plan.microbatches);
                   plan.order = generated.order;
                   plan.stage_rank = generated.stage_rank;
                   return 0;
                 });
  }
  with_context(c.schedule_csv.empty() ? "the generated schedule"
                                      : "parallelism.pipeline_parallel_schedule_csv '" + c.schedule_csv + "' with " +
                                            microbatch_keys,
               [&] {
                 if (c.schedule_csv.empty()) return 0;  // generated: validated once when generated
                 plan.order = std::make_shared<const PipelineOrder>(read_pipeline_csv(c.schedule_csv));
                 plan.stage_rank = validate_pipeline_order(*plan.order, pp, num_stages, plan.microbatches);
                 return 0;
               });
  if (by_flops)  // Note [Stage split by FLOPs]: the blocks placed by the ranks that hold the stages
    with_context(split_keys, [&] {
      plan.stage_modules = std::make_shared<const StageModules>(module_fqns_balanced(plan.stage_rank, n_layers, c.module_flops));
      check_stage_modules(*plan.stage_modules, n_layers);
      set_stage_parts(plan);
      return 0;
    });
  for (int r = 0; r < pp; ++r)
    if (static_cast<int>(plan.stages_of(r).size()) != per_rank)
      throw std::invalid_argument("the pipeline schedule " + plan.schedule_name + " gives pp rank " + std::to_string(r) + " " +
                                  std::to_string(static_cast<int64_t>(plan.stages_of(r).size())) + " stages; every rank must hold " +
                                  std::to_string(per_rank) + " (" + std::to_string(num_stages) + " stages over " + std::to_string(pp) + " ranks)");
  return plan;
}

// Everything make_plan reads, as one string.
std::string plan_key(const PipelineConfig& c, int pp, int64_t n_layers, int64_t local_batch_size) {
  std::string key;
  auto add = [&key](const std::string& field) { key += field, key += '\x1f'; };
  char flops[96];
  std::snprintf(flops, sizeof flops, "%a %a %a", c.module_flops.block, c.module_flops.embedding, c.module_flops.output);
  for (int64_t v : {int64_t{pp}, n_layers, local_batch_size, c.microbatch_size, c.num_microbatches, c.layers_per_stage,
                    c.first_stage_less_layers, c.last_stage_less_layers})
    add(std::to_string(v));
  add(c.schedule), add(c.stage_balance), add(flops);
  for (const std::string& point : c.split_points) add(point);
  key += '\x1e';
  for (const auto& stage : c.module_fqns) {
    for (const std::string& module : stage) add(module);
    key += '\x1d';
  }
  return key;
}

}  // namespace

// Note [Pipeline plans memoized]: without a CSV (a file that can change between calls), a plan
// is a pure function of its arguments, and the layout planner asks for the same one once per
// layout family that shares the pipeline degree and the local batch (24 families of the 405B
// search on 16,384 GPUs at pp 64 and a data-parallel degree of 32), most of them refusals. Both
// answers, a plan or the refusal's message, are kept, at most 8,192 of them; a plan is kept
// without its order, which the order memo holds (and bounds) and a hit takes from there, so a
// kept plan is its stages' module names only (about 10 KB at 128 stages).
PipelinePlan plan_pipeline(const PipelineConfig& c, int pp, int64_t n_layers, int64_t local_batch_size) {
  if (!c.schedule_csv.empty()) return make_plan(c, pp, n_layers, local_batch_size);
  struct Answer {
    std::shared_ptr<const PipelinePlan> plan;  // without its order; or
    std::string refusal;
  };
  static Memo<std::string, Answer> memo(8192);
  const std::string key = plan_key(c, pp, n_layers, local_batch_size);
  std::optional<Answer> answer = memo.find(key);
  if (!answer) {
    answer.emplace();
    try {
      PipelinePlan plan = make_plan(c, pp, n_layers, local_batch_size);
      plan.order.reset();
      answer->plan = std::make_shared<const PipelinePlan>(std::move(plan));
    } catch (const std::invalid_argument& e) {
      answer->refusal = e.what();
    }
    memo.keep(key, *answer, 1);
  }
  if (!answer->plan) throw std::invalid_argument(answer->refusal);
  PipelinePlan plan = *answer->plan;
  plan.order = generated_order(plan.kind, pp, plan.num_stages() / pp, plan.microbatches).order;
  return plan;
}

}  // namespace titan::parallel::pipeline
