// parallel/pipeline/split.cpp — see split.h.
#include "parallel/pipeline/split.h"
#include "model/param_path.h"

#include <algorithm>
#include <stdexcept>

namespace titan::parallel::pipeline {
namespace {

// The module order of the Llama: what the stages read in order must be.
std::vector<std::string> model_modules(int64_t n_layers) {
  std::vector<std::string> modules = {"tok_embeddings"};
  for (int64_t i = 0; i < n_layers; ++i) modules.push_back(model::layer_path(i));
  modules.push_back("norm");
  modules.push_back("output");
  return modules;
}

// The stages' modules for stage s holding blocks[s] consecutive blocks, in model order.
StageModules stage_modules(const std::vector<int64_t>& blocks) {
  StageModules stages;
  int64_t next_layer = 0;
  const size_t num_stages = blocks.size();
  for (size_t s = 0; s < num_stages; ++s) {
    std::vector<std::string> modules;
    if (s == 0) modules.push_back("tok_embeddings");
    for (int64_t b = 0; b < blocks[s]; ++b) modules.push_back(model::layer_path(next_layer++));
    if (s == num_stages - 1) {
      modules.push_back("norm");
      modules.push_back("output");
    }
    stages.push_back(std::move(modules));
  }
  return stages;
}

// See ModuleFlops::per_block: the blocks per stage. For a bound T, stages in order each take
// their minimum, then further blocks while within their cap and the later stages keep their
// minimums, the last stage the rest. Two caps are tried: the rank's load within T (exact with
// one stage per rank), and the stage's own load within T / (its rank's stage count) (so that a
// rank's first stage leaves room for its later ones); T is bisected, the split of the smallest
// largest rank load kept.
std::vector<int64_t> balanced_by_block_costs(const std::vector<int>& stage_rank, int pp, const std::vector<double>& cost,
                                             const std::vector<int64_t>& min_blocks,
                                             const std::vector<double>& stage_extra) {
  const size_t num_stages = stage_rank.size(), n = cost.size();
  std::vector<double> stages_of_rank(static_cast<size_t>(pp), 0.0);
  for (int r : stage_rank) stages_of_rank[static_cast<size_t>(r)] += 1;
  // Fills `blocks` under bound T; returns the largest rank load.
  auto greedy = [&](double bound, bool per_stage, std::vector<int64_t>& blocks) {
    std::vector<double> load(static_cast<size_t>(pp), 0.0);
    if (!per_stage)
      for (size_t s = 0; s < num_stages; ++s) load[static_cast<size_t>(stage_rank[s])] += stage_extra[s];
    int64_t later_min = 0;
    for (int64_t m : min_blocks) later_min += m;
    size_t next = 0;
    blocks.assign(num_stages, 0);
    std::vector<double> rank_load(static_cast<size_t>(pp), 0.0);
    for (size_t s = 0; s < num_stages; ++s) {
      const size_t r = static_cast<size_t>(stage_rank[s]);
      double stage = stage_extra[s];
      double& l = per_stage ? stage : load[r];
      const double cap = per_stage ? bound / stages_of_rank[r] : bound;
      later_min -= min_blocks[s];
      for (int64_t b = 0; b < min_blocks[s]; ++b) l += cost[next++], ++blocks[s];
      const bool last = s + 1 == num_stages;
      while (next < n && static_cast<int64_t>(n - next) > later_min && (last || l + cost[next] <= cap))
        l += cost[next++], ++blocks[s];
      if (per_stage) rank_load[r] += stage;
    }
    const std::vector<double>& loads = per_stage ? rank_load : load;
    return *std::max_element(loads.begin(), loads.end());
  };
  double lo = 0, hi = 0;
  for (double c : cost) hi += c;
  for (double e : stage_extra) hi += e;
  std::vector<int64_t> blocks, best;
  double best_load = greedy(hi, false, best);  // the whole cost bounds every rank
  for (const bool per_stage : {false, true}) {
    double low = lo, high = hi;
    for (int i = 0; i < 60; ++i) {
      const double mid = (low + high) / 2;
      const double got = greedy(mid, per_stage, blocks);
      if (got <= mid) {
        high = mid;
        if (got < best_load) best_load = got, best = blocks;
      } else {
        low = mid;
      }
    }
  }
  return best;
}

}  // namespace

int pipeline_stage_count(PipelineScheduleKind kind, int pp, int64_t n_layers, int64_t layers_per_stage,
                         int64_t input_weight, int64_t output_weight) {
  if (layers_per_stage <= 0) return pp * default_stages_per_rank(kind);
  const int64_t effective = n_layers + input_weight + output_weight;
  const int64_t stages = (effective + layers_per_stage - 1) / layers_per_stage;
  const std::string context = " (the model's " + std::to_string(n_layers) + " layers + " + std::to_string(input_weight) + " + " +
                              std::to_string(output_weight) + " for the embedding and the output, " + std::to_string(layers_per_stage) +
                              " per stage (parallelism.pipeline_parallel_layers_per_stage): " + std::to_string(stages) +
                              " stages over " + std::to_string(pp) + " pipeline ranks)";
  if (stages % pp != 0)
    throw std::invalid_argument("the number of pipeline stages must be a multiple of pipeline_parallel_degree" +
                                context);
  const int64_t per_rank = stages / pp;
  if (is_single_stage(kind) && per_rank != 1)
    throw std::invalid_argument(std::string(pipeline_schedule_name(kind)) +
                                " runs exactly 1 stage per rank, but the split gives " + std::to_string(per_rank) + context);
  if (!is_single_stage(kind) && per_rank < 2)
    throw std::invalid_argument(std::string(pipeline_schedule_name(kind)) +
                                " runs at least 2 stages per rank, but the split gives " + std::to_string(per_rank) + context);
  return static_cast<int>(stages);
}

StageModules module_fqns_per_stage(int num_stages, int64_t n_layers, int64_t input_weight, int64_t output_weight) {
  if (num_stages < 1)
    throw std::invalid_argument("the number of pipeline stages must be at least 1, got " + std::to_string(num_stages));
  if (num_stages == 1) return {model_modules(n_layers)};
  const int64_t effective = n_layers + input_weight + output_weight;
  if (num_stages > effective)
    throw std::invalid_argument("the number of pipeline stages (" + std::to_string(num_stages) +
                                ") cannot be greater than the effective layers (" + std::to_string(effective) + " = " + std::to_string(n_layers) +
                                " layers + " + std::to_string(input_weight) + " + " + std::to_string(output_weight) +
                                " for the embedding and the output)");
  const int64_t per_stage = effective / num_stages, extra = effective % num_stages;
  if (input_weight > per_stage)
    throw std::invalid_argument("pipeline_parallel_first_stage_less_layers (" + std::to_string(input_weight) +
                                ") exceeds the layers per stage (" + std::to_string(per_stage) + ")");
  if (output_weight > per_stage)
    throw std::invalid_argument("pipeline_parallel_last_stage_less_layers (" + std::to_string(output_weight) +
                                ") exceeds the layers per stage (" + std::to_string(per_stage) + ")");
  StageModules stages;
  int64_t next_layer = 0;
  for (int s = 0; s < num_stages; ++s) {
    const bool first = s == 0, last = s == num_stages - 1;
    int64_t layers = per_stage + (s < extra ? 1 : 0) - (first ? input_weight : last ? output_weight : 0);
    std::vector<std::string> modules;
    if (first) modules.push_back("tok_embeddings");
    for (; layers > 0 && next_layer < n_layers; --layers) modules.push_back(model::layer_path(next_layer++));
    if (last) {
      modules.push_back("norm");
      modules.push_back("output");
    }
    stages.push_back(std::move(modules));
  }
  return stages;
}

void check_balanced_stage_count(int64_t num_stages, int64_t n_layers) {
  if (num_stages < 1) throw std::invalid_argument("the number of pipeline stages must be at least 1");
  if (num_stages - 2 > n_layers)
    throw std::invalid_argument("the FLOP-balanced split needs a block on every stage between the first and the last: " +
                                std::to_string(num_stages) + " stages for " + std::to_string(n_layers) + " layers");
}

StageModules module_fqns_balanced(const std::vector<int>& stage_rank, int64_t n_layers, const ModuleFlops& costs) {
  const int64_t num_stages = static_cast<int64_t>(stage_rank.size());
  check_balanced_stage_count(num_stages, n_layers);
  // The first stage holds the embedding and the last norm + output, so they may hold no block;
  // every stage between needs one.
  std::vector<int64_t> min_blocks(static_cast<size_t>(num_stages), 1);
  min_blocks.front() = min_blocks.back() = 0;
  int64_t min_total = 0;
  for (const int64_t m : min_blocks) min_total += m;
  const int pp = *std::max_element(stage_rank.begin(), stage_rank.end()) + 1;
  // What a stage costs besides its blocks, and the stages of each rank.
  std::vector<double> stage_extra(static_cast<size_t>(num_stages), 0.0);
  stage_extra.front() += costs.embedding;
  stage_extra.back() += costs.output;
  std::vector<std::vector<int64_t>> rank_stages(static_cast<size_t>(pp));
  for (int64_t s = 0; s < num_stages; ++s)
    rank_stages[static_cast<size_t>(stage_rank[static_cast<size_t>(s)])].push_back(s);
  if (!costs.per_block.empty()) {
    if (static_cast<int64_t>(costs.per_block.size()) != n_layers)
      throw std::invalid_argument("the FLOP-balanced split has " + std::to_string(costs.per_block.size()) +
                                  " block costs for " + std::to_string(n_layers) + " layers");
    return stage_modules(balanced_by_block_costs(stage_rank, pp, costs.per_block, min_blocks, stage_extra));
  }
  // Water-filling: from the minimum, each further block goes to the cheapest candidate (the first
  // of equals), which gives the smallest possible largest load.
  auto fill = [&](const std::vector<double>& extra, int64_t blocks, std::vector<int64_t>& count) {
    for (int64_t b = 0; b < blocks; ++b) {
      size_t best = 0;
      for (size_t i = 1; i < count.size(); ++i)
        if (extra[i] + costs.block * count[i] < extra[best] + costs.block * count[best]) best = i;
      ++count[best];
    }
  };
  std::vector<double> rank_extra(static_cast<size_t>(pp), 0.0);
  std::vector<int64_t> rank_blocks(static_cast<size_t>(pp), 0);
  for (size_t r = 0; r < rank_stages.size(); ++r)
    for (const int64_t s : rank_stages[r]) {
      rank_extra[r] += stage_extra[static_cast<size_t>(s)];
      rank_blocks[r] += min_blocks[static_cast<size_t>(s)];
    }
  fill(rank_extra, n_layers - min_total, rank_blocks);
  std::vector<int64_t> stage_blocks(min_blocks);
  for (size_t r = 0; r < rank_stages.size(); ++r) {
    std::vector<double> extra;
    std::vector<int64_t> count;
    int64_t placed = 0;
    for (const int64_t s : rank_stages[r]) {
      extra.push_back(stage_extra[static_cast<size_t>(s)]);
      count.push_back(min_blocks[static_cast<size_t>(s)]);
      placed += count.back();
    }
    fill(extra, rank_blocks[r] - placed, count);
    for (size_t i = 0; i < count.size(); ++i) stage_blocks[static_cast<size_t>(rank_stages[r][i])] = count[i];
  }
  return stage_modules(stage_blocks);
}

StageModules module_fqns_from_split_points(const std::vector<std::string>& split_points, int64_t n_layers) {
  StageModules stages(1, std::vector<std::string>{"tok_embeddings"});
  int64_t previous = 0;
  for (const std::string& point : split_points) {
    const std::optional<model::LayerPath> block = model::parse_layer_path(point);
    const int64_t layer = block && block->rest.empty() ? block->layer : -1;
    if (layer < 0 || layer >= n_layers)
      throw std::invalid_argument("pipeline_parallel_split_points: '" + point +
                                  "' is not a layer of the model (layers.0 .. layers." + std::to_string(n_layers - 1) + ")");
    if (layer <= previous)
      throw std::invalid_argument("pipeline_parallel_split_points: '" + point +
                                  "' does not come after the previous split point: each starts a new stage, in order");
    for (int64_t i = previous; i < layer; ++i) stages.back().push_back(model::layer_path(i));
    stages.emplace_back();
    previous = layer;
  }
  for (int64_t i = previous; i < n_layers; ++i) stages.back().push_back(model::layer_path(i));
  stages.back().push_back("norm");
  stages.back().push_back("output");
  return stages;
}

void check_stage_modules(const StageModules& stages, int64_t n_layers) {
  const std::vector<std::string> expected = model_modules(n_layers);
  size_t next = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    if (stages[s].empty())
      throw std::invalid_argument("pipeline stage " + std::to_string(static_cast<int64_t>(s)) + " holds no module");
    for (const std::string& module : stages[s]) {
      if (next >= expected.size() || module != expected[next])
        throw std::invalid_argument("pipeline stage " + std::to_string(static_cast<int64_t>(s)) + ": '" + module + "' where '" +
                                    (next < expected.size() ? expected[next] : std::string("nothing more")) +
                                    "' comes next: the stages, read in order, must hold tok_embeddings, "
                                    "layers.0 .. layers." +
                                    std::to_string(n_layers - 1) + ", norm, output, each once");
      ++next;
    }
  }
  if (next != expected.size())
    throw std::invalid_argument("the pipeline stages leave out '" + expected[next] +
                                "' and what follows it: every module must lie on a stage");
}

}  // namespace titan::parallel::pipeline
