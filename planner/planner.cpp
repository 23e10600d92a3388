// planner/planner.cpp — see planner.h.
#include "planner/planner.h"

#include <algorithm>
#include <thread>
#include <mutex>
#include <iterator>
#include <limits>
#include <exception>
#include <atomic>
#include <iomanip>
#include <map>
#include <string_view>
#include <tuple>
#include <optional>
#include <ostream>
#include <sstream>

#include "data/tokenizer.h"
#include "model/flavors.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/pipeline/orders.h"
#include "trainer/config/parallel_options.h"
#include "trainer/observe/memory_estimate.h"

namespace titan::planner {
namespace {

// Pipeline passes of more than 16 x pp micro-batches are not searched: the bubble of one is
// already below (p - 1) / (17 p - 1) < 6%, and more micro-batches only shrink each GEMM (the
// 405B search on 16k GPUs would otherwise simulate passes of 2048).
constexpr int64_t kMaxMicrobatchesPerStage = 16;

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      out.push_back(i);
      if (i != n / i) out.push_back(n / i);
    }
  std::sort(out.begin(), out.end());
  return out;
}

// Note [Dominated layouts]: in the step-time model (planner/predict.cpp) a layout is never
// faster with a smaller local batch when nothing else changes (the same tokens in more
// gradient-accumulation passes, each paying its FSDP gathers and, under pp, its own fill and
// drain), nor with a heavier AC mode (recompute only adds), nor with async TP off (it only
// hides TP traffic); and the memory estimate only grows with the local batch and falls with
// heavier AC. So of one layout's (AC mode, local batch) candidates only the largest local batch
// that fits under each AC mode can rank first, and only if a lighter AC mode fits no local
// batch as large: the search scans the AC modes lightest first and the local batches largest
// first, examines (checks, estimates, predicts) until one fits, and counts the rest as
// dominated without examining them. plan.exhaustive examines every candidate instead (the
// tests compare the two: the same first choice, the same predictions).
int ac_cost(const std::string& ac) { return ac == "none" ? 0 : ac == "selective" ? 1 : 2; }

// The first clause of a trainer error, so that one rule groups all the candidates it refuses.
std::string reason_of(const std::string& what) {
  std::string r = what.substr(0, what.find(';'));
  for (char& c : r)
    if (c >= '0' && c <= '9') c = 'N';  // "degree 3 does not divide 32" -> one reason for every degree
  return r.size() > 150 ? r.substr(0, 150) + "..." : r;
}

}  // namespace

int64_t vocab_of(const trainer::config::JobConfig& cfg) {
  try {
    return model::trained_model_args(cfg.model.name, cfg.model.flavor,
                                     data::make_tokenizer(cfg.model.tokenizer_path)->vocab_size())
        .vocab_size;
  } catch (const std::exception&) {
    return model::model_flavor(cfg.model.name, cfg.model.flavor).vocab_size;  // the flavor's
  }
}

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

std::string gib(double bytes) { return fixed(bytes / kGiB, 1); }

trainer::config::JobConfig planning_config(const trainer::config::JobConfig& cfg) {
  trainer::config::JobConfig c = cfg;
  if (cfg.plan.device != "cpu") {
    c.training.device = "cuda";
    c.training.mixed_precision_param = "bfloat16";
  }
  return c;
}

int64_t planned_global_batch(const trainer::config::JobConfig& cfg, int64_t world) {
  return cfg.training.global_batch_size > 0 ? cfg.training.global_batch_size : cfg.training.local_batch_size * world;
}

std::vector<Layout> layout_families(const trainer::config::JobConfig& cfg, int64_t world) {
  const model::ModelArgs args = model::model_flavor(cfg.model.name, cfg.model.flavor);
  std::vector<Layout> out;
  for (int64_t pp : divisors(world))
    for (int64_t r : divisors(world / pp))
      for (int64_t t : divisors(world / pp / r))
        for (int64_t c : divisors(world / pp / r / t)) {
          const int64_t s = world / pp / r / t / c;
          std::vector<int64_t> eps = {1};
          if (args.moe)
            for (int64_t e : divisors(s * c))
              if (e > 1) eps.push_back(e);
          for (int64_t e : eps) {
            Layout l;
            l.dp_replicate = r, l.dp_shard = s, l.tp = t, l.cp = c, l.pp = pp, l.ep = e;
            out.push_back(l);
          }
        }
  return out;
}

std::vector<Layout> family_structures(const trainer::config::JobConfig& cfg, const Layout& family, int64_t global_batch) {
  std::vector<Layout> out;
  const int64_t dp = family.dp();
  std::vector<int64_t> locals = {std::max<int64_t>(1, global_batch / dp)};  // not a whole share: refused
  if (global_batch % dp == 0) locals = divisors(global_batch / dp);
  const auto& schedules = parallel::pipeline::pipeline_schedule_kinds();
  const auto& methods = parallel::context_parallel::cp_rotate_method_names();
  for (int64_t local : locals)
    for (size_t si = 0; si < (family.pp > 1 ? schedules.size() : 1); ++si)
      for (int64_t mb : family.pp > 1 ? divisors(local) : std::vector<int64_t>{1})
        if (family.pp > 1 && local / mb > kMaxMicrobatchesPerStage * family.pp) continue; else
        for (const char* split : family.pp > 1 ? std::vector<const char*>{"layers", "flops"}
                                               : std::vector<const char*>{"layers"})
        for (size_t mi = 0; mi < (family.cp > 1 ? methods.size() : 1); ++mi) {
          Layout l = family;
          if (family.pp > 1) {
            l.schedule = parallel::pipeline::pipeline_schedule_name(schedules[si]);
            l.microbatch_size = mb;
            l.split = split;
          }
          if (family.cp > 1) l.cp_method = methods[mi];
          l.async_tp = false;
          l.local_batch = local;
          out.push_back(std::move(l));
        }
  return out;
}

void add_structure_candidates(const trainer::config::JobConfig& cfg, const Layout& structure, std::vector<Layout>& out) {
  for (bool async : structure.tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})
    for (const std::string& ac : cfg.plan.ac_modes)
      for (const std::string& precision : cfg.plan.precisions) {
        Layout l = structure;
        l.async_tp = async;
        l.ac = ac;
        l.precision = precision;
        out.push_back(std::move(l));
      }
}

std::vector<Layout> family_layouts(const trainer::config::JobConfig& cfg, const Layout& family, int64_t global_batch) {
  std::vector<Layout> out;
  for (const Layout& structure : family_structures(cfg, family, global_batch))
    add_structure_candidates(cfg, structure, out);
  return out;
}

std::vector<Layout> enumerate_layouts(const trainer::config::JobConfig& cfg, int64_t world, int64_t global_batch) {
  std::vector<Layout> out;
  for (const Layout& family : layout_families(cfg, world)) {
    std::vector<Layout> more = family_layouts(cfg, family, global_batch);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

double estimated_memory_bytes(const trainer::config::JobConfig& cfg, int64_t world, int64_t vocab_size,
                              const parallel::pipeline::PipelinePlan* pipeline, trainer::observe::BlockTermsMemo* memo) {
  trainer::observe::EstimateInputs in = trainer::observe::estimate_inputs_from_config(cfg, world, vocab_size, pipeline);
  const int pp = static_cast<int>(cfg.parallelism.pipeline_parallel_degree);
  int64_t most = 0;
  // The busiest pp rank is an end one: the first holds the embedding and the most micro-batches in
  // flight (under V placement the output too), the last the output and its logits; the middle
  // ranks hold fewer of both. Their neighbours too, for the uneven splits.
  for (int r = 0; r < std::max(1, pp); ++r) {
    if (r > 1 && r < pp - 2) continue;
    in.pp_rank = r;
    most = std::max(most, trainer::observe::estimate_memory(in, memo).total);
  }
  return static_cast<double>(most);
}

namespace {

// Parameters, optimizer state and the float32 gradient shards (all alive at the optimizer step)
// of the busiest pipeline rank: what no batch shape or AC mode lowers.
double state_bytes(const trainer::config::JobConfig& cfg, int64_t world, int64_t vocab_size,
                   trainer::observe::BlockTermsMemo& memo) {
  trainer::observe::EstimateInputs in = trainer::observe::estimate_inputs_from_config(cfg, world, vocab_size);
  int64_t most = 0;
  const int pp = std::max<int>(1, static_cast<int>(cfg.parallelism.pipeline_parallel_degree));
  for (int r = 0; r < pp; ++r) {
    if (r > 1 && r < pp - 2) continue;  // as estimated_memory_bytes
    in.pp_rank = r;
    const trainer::observe::MemoryEstimate e = trainer::observe::estimate_memory(in, &memo);
    most = std::max(most, e.parameters + e.optimizer_state + e.optimizer_state / 2);  // grads: 4 of AdamW's 8 bytes
  }
  return static_cast<double>(most);
}

}  // namespace

PlanResult plan_layouts(const trainer::config::JobConfig& user_cfg, const Cluster& cluster,
                        const std::function<void(int64_t, int64_t)>& progress) {
  const trainer::config::JobConfig cfg = planning_config(user_cfg);
  PlanResult result;
  result.cluster = cluster;
  const int64_t world = cluster.world();
  result.global_batch = planned_global_batch(cfg, world);
  const int64_t vocab = vocab_of(cfg);
  const model::ModelArgs args = model::trained_model_args(cfg.model.name, cfg.model.flavor, vocab);
  const std::vector<Layout> families = layout_families(cfg, world);
  // The trainer's checks: what they made of `c` into *checked, or their error.
  auto check = [&](const trainer::config::JobConfig& c, trainer::config::CheckedLayout* checked) -> std::string {
    try {
      trainer::config::CheckedLayout made = trainer::config::check_layout(c, static_cast<int>(world));
      if (checked) *checked = std::move(made);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  // Note [Pipeline refusals shared]: check_layout reads the family's degrees (which the family's
  // representative passed), then plans the pipeline from the pipeline keys, pp, the model and
  // the local batch alone, and throws that plan's refusal first. So a structure whose (pp, local
  // batch, schedule, micro-batch, split) the pipeline refused in any family gets the same error
  // in every family, without running the checks again (the 405B search on 16k GPUs refused 618k
  // structures so, of 1.3M checks; each refusal an exception).
  using PipelineKey = std::tuple<int64_t, int64_t, std::string, int64_t, std::string>;
  std::map<PipelineKey, std::string> pipeline_refusals;
  std::mutex pipeline_refusals_mu;
  // One family into its own result (families run on several threads, merged in order below).
  auto run_family = [&](size_t f, PlanResult& result) {
    auto reject = [&result](const std::string& why, const Layout& l, int64_t n_candidates) {
      auto& [n, family] = result.reasons[why];
      if (n == 0) family = l.family();
      n += n_candidates;
    };
    const std::vector<Layout> structures = family_structures(cfg, families[f], result.global_batch);
    trainer::observe::BlockTermsMemo memo;  // the family's estimates share the blocks' terms
    std::vector<Layout> candidates;
    // Each structure's candidates (add_structure_candidates): async TP x AC modes x precisions.
    const auto per_structure = static_cast<int64_t>((families[f].tp > 1 ? 2 : 1) * cfg.plan.ac_modes.size() *
                                                    cfg.plan.precisions.size());
    const auto n = static_cast<int64_t>(structures.size()) * per_structure;
    result.considered += n;
    // The whole family at once where it can be decided at once, for each CP method: a refusal
    // that is not about the pipeline's micro-batches (degrees, splits, the global batch, the CP
    // method: no candidate of the family with that method passes), and parameters + optimizer
    // state that alone exceed the GPU (no batch shape helps). The representative: the largest
    // local batch in micro-batches of one row, so that a pipeline has the most micro-batches
    // any candidate of the family can give it.
    std::vector<std::string> refused_methods;  // CP methods no candidate of the family passes with
    int64_t undecided = n;
    double light_state = 0;
    std::optional<Layout> lightest;  // the first representative the checks accept
    const std::vector<std::string> methods =
        families[f].cp > 1 ? parallel::context_parallel::cp_rotate_method_names() : std::vector<std::string>{""};
    for (const std::string& method : methods) {
      Layout representative = structures.back();
      representative.cp_method = method;
      representative.ac = "full";
      representative.precision = cfg.plan.precisions.back();
      representative.async_tp = representative.tp > 1;
      if (representative.pp > 1) representative.schedule = "1F1B", representative.microbatch_size = 1;
      const trainer::config::JobConfig light_cfg = apply_layout(cfg, representative, result.global_batch);
      const std::string family_error = check(light_cfg, nullptr);
      if (!family_error.empty() && family_error.rfind("pipeline parallel:", 0) != 0) {
        int64_t with_method = 0;
        for (const Layout& st : structures) with_method += st.cp_method == method ? per_structure : 0;
        result.rejected_by_rules += with_method;
        reject("rules: " + reason_of(family_error), representative, with_method);
        undecided -= with_method;
        refused_methods.push_back(method);
        continue;
      }
      if (!family_error.empty() || lightest) continue;
      // The state under either split (the CP method does not change it): the family is out only
      // if neither fits.
      lightest = representative;
      light_state = state_bytes(light_cfg, world, vocab, memo);
      if (representative.pp > 1) {
        Layout other = representative;
        other.split = representative.split == "flops" ? "layers" : "flops";
        const trainer::config::JobConfig other_cfg = apply_layout(cfg, other, result.global_batch);
        if (check(other_cfg, nullptr).empty()) light_state = std::min(light_state, state_bytes(other_cfg, world, vocab, memo));
      }
    }
    if (undecided == 0) return;
    if (lightest && light_state > cluster.device.memory_bytes) {
      result.rejected_by_memory += undecided;
      reject("memory: parameters, optimizer state and gradient shards alone exceed the " + gib(cluster.device.memory_bytes) +
                 " GiB of one GPU",
             *lightest, undecided);
      return;
    }
    // The family's caches are indexed by structure (its position in `structures`) and by a
    // candidate's place in its structure's block (async TP, AC mode, precision, in
    // add_structure_candidates' order): keys of the candidates' fields were a tenth of the
    // 16,384-GPU search in string comparisons.
    const size_t n_structures = structures.size();
    const size_t n_ac = cfg.plan.ac_modes.size(), n_precision = cfg.plan.precisions.size();
    // A structure's group: its schedule, micro-batch, split and CP method (everything but the
    // local batch); and a FLOP split's twin, the same structure under split=layers.
    std::vector<size_t> group_of(n_structures), twin_of(n_structures, n_structures);
    {
      std::map<std::tuple<std::string_view, int64_t, std::string_view, std::string_view>, size_t> groups;
      std::map<std::tuple<int64_t, std::string_view, int64_t, std::string_view>, size_t> layer_splits;
      for (size_t i = 0; i < n_structures; ++i) {
        const Layout& st = structures[i];
        group_of[i] = groups.emplace(std::make_tuple(std::string_view(st.schedule), st.microbatch_size,
                                                     std::string_view(st.split), std::string_view(st.cp_method)),
                                     groups.size())
                          .first->second;
        if (st.split == "layers")
          layer_splits.emplace(std::make_tuple(st.local_batch, std::string_view(st.schedule), st.microbatch_size,
                                               std::string_view(st.cp_method)),
                               i);
      }
      for (size_t i = 0; i < n_structures; ++i) {
        const Layout& st = structures[i];
        if (st.pp <= 1 || st.split != "flops") continue;
        const auto twin = layer_splits.find(std::make_tuple(st.local_batch, std::string_view(st.schedule),
                                                            st.microbatch_size, std::string_view(st.cp_method)));
        if (twin != layer_splits.end()) twin_of[i] = twin->second;
      }
    }
    const size_t n_groups = n_structures == 0 ? 0 : *std::max_element(group_of.begin(), group_of.end()) + 1;
    // Memory grows with the local batch when nothing else changes (more rows, or more
    // micro-batches of the same rows in flight): past the smallest local batch over memory, the
    // larger ones are counted over memory without estimating them. By (group, async TP, AC mode,
    // precision): the smallest local batch found over memory.
    std::vector<int64_t> over_memory_from(n_groups * 2 * n_ac * n_precision, std::numeric_limits<int64_t>::max());
    // The trainer's verdict on a structure: its error ("" = accepted: then what the checks made
    // is in `accepted`), and once it has refused a candidate, that reason's counter in
    // result.reasons (a 405B search on 16k GPUs refuses millions).
    struct Verdict {
      bool known = false;
      std::string error;
      std::pair<int64_t, std::string>* reason = nullptr;
    };
    std::vector<Verdict> verdicts(n_structures);
    std::vector<std::optional<trainer::config::CheckedLayout>> accepted(n_structures);
    std::vector<double> memory(n_structures * n_ac * n_precision, -1.0);  // bytes, -1: not estimated
    std::vector<signed char> same_as_layers(n_structures, -1);  // split=flops: stages as split=layers
    trainer::config::JobConfig work = cfg;  // the candidate at hand's config (apply_layout_into)
    // The verdict on structure `s`, checked once (check_layout reads neither the AC mode, nor the
    // precision, nor async TP).
    auto verdict_of = [&](size_t s) -> Verdict& {
      Verdict& verdict = verdicts[s];
      if (verdict.known) return verdict;
      verdict.known = true;
      const Layout& candidate = structures[s];
      const PipelineKey pipeline{candidate.pp, candidate.local_batch, candidate.schedule, candidate.microbatch_size,
                                 candidate.split};
      if (candidate.pp > 1) {  // See Note [Pipeline refusals shared]
        std::lock_guard<std::mutex> lock(pipeline_refusals_mu);
        const auto known = pipeline_refusals.find(pipeline);
        if (known != pipeline_refusals.end()) verdict.error = known->second;
      }
      if (verdict.error.empty()) {
        trainer::config::CheckedLayout made;
        apply_layout_into(work, cfg, candidate, result.global_batch);
        verdict.error = check(work, &made);
        if (verdict.error.empty()) {
          accepted[s] = std::move(made);
        } else if (candidate.pp > 1 && verdict.error.rfind("pipeline parallel:", 0) == 0) {
          std::lock_guard<std::mutex> lock(pipeline_refusals_mu);
          pipeline_refusals.emplace(pipeline, verdict.error);
        }
      }
      return verdict;
    };
    auto count_refused = [&](Verdict& verdict, const Layout& l, int64_t how_many) {
      result.rejected_by_rules += how_many;
      if (!verdict.reason) verdict.reason = &result.reasons["rules: " + reason_of(verdict.error)];
      if (verdict.reason->first == 0) verdict.reason->second = l.family();
      verdict.reason->first += how_many;
    };
    // The over-memory reason's counter, looked up once (the 16k search counts 1.4M candidates so).
    std::pair<int64_t, std::string>* over_memory = nullptr;
    auto count_over_memory = [&](const Layout& l) {
      ++result.rejected_by_memory;
      if (!over_memory)
        over_memory = &result.reasons["memory: the estimate exceeds the " + gib(cluster.device.memory_bytes) + " GiB of one GPU"];
      if (over_memory->first++ == 0) over_memory->second = l.family();
    };
    // The candidates of the accepted structures, a whole block of per_structure each: a
    // candidate's place in its block is c % per_structure, its structure recorded per candidate.
    std::vector<size_t> structure_of_candidate;
    for (size_t s = 0; s < n_structures; ++s) {
      const Layout& st = structures[s];
      if (std::find(refused_methods.begin(), refused_methods.end(), st.cp_method) != refused_methods.end()) continue;
      // A structure the checks refuse takes all its candidates with it, unexamined one by one.
      if (Verdict& verdict = verdict_of(s); !verdict.error.empty()) {
        count_refused(verdict, st, per_structure);
        continue;
      }
      add_structure_candidates(cfg, st, candidates);
      structure_of_candidate.insert(structure_of_candidate.end(), static_cast<size_t>(per_structure), s);
    }
    // A candidate's AC mode and precision indices from its place (async outermost, then AC, then precision).
    const auto block = static_cast<size_t>(per_structure);
    auto ac_index = [&](size_t c) { return (c % block / n_precision) % n_ac; };
    auto precision_index = [&](size_t c) { return c % block % n_precision; };
    auto over_memory_key = [&](size_t c) {
      const Layout& l = candidates[c];
      return ((group_of[structure_of_candidate[c]] * 2 + (l.async_tp ? 1 : 0)) * n_ac + ac_index(c)) * n_precision +
             precision_index(c);
    };
    // One candidate through the memory estimate (its structure is accepted): its memory when it
    // fits (counted as over memory, or the same as its layer-split twin, when not). Its config is
    // applied again to list it: a copy each was 5% of the search.
    struct Admitted {
      const trainer::config::CheckedLayout* checked;
      double memory_bytes;
    };
    auto admit = [&](size_t c) -> std::optional<Admitted> {
      const Layout& l = candidates[c];
      const size_t s = structure_of_candidate[c];
      if (l.local_batch > over_memory_from[over_memory_key(c)]) {
        count_over_memory(l);
        return std::nullopt;
      }
      const trainer::config::CheckedLayout& checked = *accepted[s];
      // A FLOP split that puts every module where the layer split does is the same run: the
      // layer split's candidate stands for both.
      if (l.pp > 1 && l.split == "flops") {
        if (same_as_layers[s] < 0) {
          const size_t twin = twin_of[s];
          same_as_layers[s] = twin < n_structures && verdict_of(twin).error.empty() &&
                              *accepted[twin]->pipeline->stage_modules == *checked.pipeline->stage_modules;
        }
        if (same_as_layers[s] > 0) {
          ++result.same_split;
          return std::nullopt;
        }
      }
      double& bytes = memory[(s * n_ac + ac_index(c)) * n_precision + precision_index(c)];
      if (bytes < 0) {
        apply_layout_into(work, cfg, l, result.global_batch);
        bytes = estimated_memory_bytes(work, world, vocab, checked.pipeline ? &*checked.pipeline : nullptr, &memo);
      }
      if (bytes > cluster.device.memory_bytes) {
        int64_t& from = over_memory_from[over_memory_key(c)];
        from = std::min(from, l.local_batch);
        count_over_memory(l);
        return std::nullopt;
      }
      return Admitted{&checked, bytes};
    };
    auto list = [&](const Layout& l, const Admitted& a) {
      apply_layout_into(work, cfg, l, result.global_batch);
      PlannedLayout planned{l, predict(work, *a.checked, args, l, cluster)};
      planned.prediction.memory_bytes = a.memory_bytes;
      result.fits.push_back(std::move(planned));
    };
    if (cfg.plan.exhaustive) {
      for (size_t c = 0; c < candidates.size(); ++c)
        if (const auto a = admit(c)) list(candidates[c], *a);
      return;
    }
    // See Note [Dominated layouts]. Groups: everything but the local batch and the AC mode (the
    // structure's group, async TP, the precision), in the order of their names (the listing's
    // order among equal step times).
    std::vector<std::vector<size_t>> members_of(n_groups * 2 * n_precision);
    for (size_t c = 0; c < candidates.size(); ++c) {
      const Layout& l = candidates[c];
      if (l.tp > 1 && !l.async_tp) {
        ++result.dominated;  // its async twin is a candidate too
        continue;
      }
      members_of[(group_of[structure_of_candidate[c]] * 2 + (l.async_tp ? 1 : 0)) * n_precision + precision_index(c)]
          .push_back(c);
    }
    std::vector<std::pair<std::string, std::vector<size_t>*>> groups;
    for (std::vector<size_t>& members : members_of) {
      if (members.empty()) continue;
      Layout g = candidates[members.front()];
      g.local_batch = 0, g.ac = "";
      groups.emplace_back(g.name(), &members);
    }
    std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [name, group] : groups) {
      std::vector<size_t>& members = *group;
      // Lightest AC first, then the smallest local batch first (past the first over memory, the
      // larger ones are counted over memory without an estimate).
      std::sort(members.begin(), members.end(), [&](size_t a, size_t b) {
        const Layout &x = candidates[a], &y = candidates[b];
        return ac_cost(x.ac) != ac_cost(y.ac) ? ac_cost(x.ac) < ac_cost(y.ac) : x.local_batch < y.local_batch;
      });
      int64_t fits_lighter = 0;  // the largest local batch that fits with a lighter AC mode
      for (size_t first = 0; first < members.size();) {
        size_t end = first;
        while (end < members.size() && candidates[members[end]].ac == candidates[members[first]].ac) ++end;
        size_t best = candidates.size();
        std::optional<Admitted> best_admitted;
        for (size_t i = first; i < end; ++i) {
          const Layout& l = candidates[members[i]];
          if (l.local_batch <= fits_lighter) {
            ++result.dominated;
            continue;
          }
          if (auto a = admit(members[i])) {
            if (best < candidates.size()) ++result.dominated;  // a larger local batch of this AC mode fits
            best = members[i], best_admitted = std::move(a);
          }
        }
        if (best < candidates.size()) {
          list(candidates[best], *best_admitted);
          fits_lighter = std::max(fits_lighter, candidates[best].local_batch);
        }
        first = end;
      }
    }
  };
  std::vector<PlanResult> parts(families.size());
  for (PlanResult& part : parts) part.global_batch = result.global_batch;  // what run_family reads
  std::atomic<size_t> next{0};
  std::mutex progress_mu;
  int64_t families_done = 0;
  std::exception_ptr failure;
  auto worker = [&] {
    for (size_t f; (f = next++) < families.size();) {
      try {
        run_family(f, parts[f]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(progress_mu);
        if (!failure) failure = std::current_exception();
        next = families.size();
        return;
      }
      std::lock_guard<std::mutex> lock(progress_mu);
      ++families_done;
      if (progress) progress(families_done, static_cast<int64_t>(families.size()));
    }
  };
  if (progress) progress(0, static_cast<int64_t>(families.size()));
  const size_t threads = std::max<size_t>(1, std::min<size_t>(std::thread::hardware_concurrency(), families.size()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  for (PlanResult& part : parts) {
    result.considered += part.considered;
    result.rejected_by_rules += part.rejected_by_rules;
    result.rejected_by_memory += part.rejected_by_memory;
    result.dominated += part.dominated;
    result.same_split += part.same_split;
    for (auto& [why, hit] : part.reasons) {
      auto& [n, family] = result.reasons[why];
      if (n == 0) family = hit.second;
      n += hit.first;
    }
    std::move(part.fits.begin(), part.fits.end(), std::back_inserter(result.fits));
  }
  std::stable_sort(result.fits.begin(), result.fits.end(), [](const PlannedLayout& a, const PlannedLayout& b) {
    return a.prediction.step_seconds < b.prediction.step_seconds;
  });
  return result;
}

}  // namespace titan::planner
