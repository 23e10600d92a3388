// The layout planner (planner/, docs/planner.md): its search covers every layout the trainer's
// own checks accept, lists only those, reports the memory estimate's own figure, and its pipeline
// simulation reproduces the schedules' known bubbles.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/flavors.h"
#include "parallel/pipeline/plan.h"
#include "planner/cluster.h"
#include "planner/layout.h"
#include "planner/pipeline_sim.h"
#include "planner/planner.h"
#include "trainer/config/job_config.h"
#include "trainer/config/parallel_options.h"
#include "trainer/observe/memory_estimate.h"

namespace tc = titan::trainer::config;
namespace tp = titan::planner;
using Catch::Matchers::Contains;

namespace {

// The debug model on 4 CPU ranks with memory to spare: everything the trainer accepts fits.
tc::JobConfig debug_job(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--model.flavor", "debugmodel", "--training.seq_len", "256",
                                   "--training.global_batch_size", "8", "--plan.device", "h100",
                                   "--plan.gpus_per_node", "4", "--plan.memory_gib", "100000"};
  args.insert(args.end(), extra.begin(), extra.end());
  return tc::parse_job_config(args);
}

// Each layout that fits, by name: its predicted step seconds on `cluster`.
std::map<std::string, double> step_seconds_by_layout(const tc::JobConfig& cfg, const tp::Cluster& cluster) {
  std::map<std::string, double> by_name;
  for (const tp::PlannedLayout& p : tp::plan_layouts(cfg, cluster).fits) by_name[p.layout.name()] = p.prediction.step_seconds;
  return by_name;
}

// Each layout that fits, by name: one term of its prediction (plan.explain's rows), seconds.
std::map<std::string, double> term_by_layout(const tc::JobConfig& cfg, const tp::Cluster& cluster,
                                             const std::string& term) {
  std::map<std::string, double> by_name;
  for (const tp::PlannedLayout& p : tp::plan_layouts(cfg, cluster).fits)
    for (const auto& [name, seconds] : p.prediction.terms)
      if (name == term) by_name[p.layout.name()] = seconds;
  return by_name;
}

// From `before` to `after` (seconds by layout name): exactly the layouts `moves` picks take longer,
// the others are unchanged; and both kinds exist.
void check_only_these_slower(const std::map<std::string, double>& before, const std::map<std::string, double>& after,
                             const std::function<bool(const tp::Layout&)>& moves) {
  REQUIRE(before.size() == after.size());
  int slower = 0, same = 0;
  for (const auto& [name, seconds] : before) {
    INFO(name);
    if (moves(tp::parse_layout(name))) {
      CHECK(after.at(name) > seconds);
      ++slower;
    } else {
      CHECK(after.at(name) == seconds);
      ++same;
    }
  }
  CHECK(slower > 0);
  CHECK(same > 0);
}

std::string check_error(const tc::JobConfig& cfg, int world) {
  try {
    tc::check_layout(cfg, world);
  } catch (const tc::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the planner lists exactly the layouts the trainer's checks accept, none it refuses", "[planner]") {
  const tc::JobConfig cfg = debug_job({"--plan.exhaustive", "true"});
  const tp::PlanResult r = tp::plan_layouts(cfg, tp::cluster_from_config(tp::planning_config(cfg)));
  REQUIRE(r.global_batch == 8);
  std::set<std::string> listed;
  for (const tp::PlannedLayout& p : r.fits) listed.insert(p.layout.name());
  REQUIRE(listed.size() == r.fits.size());
  // Every listed layout passes the trainer's checks; every candidate that passes is listed, but
  // a split=flops one whose stages hold what its split=layers twin's do (the same run: the twin
  // is listed in its place).
  const tc::JobConfig planning = tp::planning_config(cfg);
  int64_t accepted = 0, same_split = 0;
  auto stage_modules = [&](const tp::Layout& l) { return tc::check_layout(tp::apply_layout(planning, l, 8), 4).pipeline->stage_modules; };  // compared by what they point at
  for (const tp::Layout& l : tp::enumerate_layouts(planning, 4, 8)) {
    const bool ok = check_error(tp::apply_layout(planning, l, 8), 4).empty();
    INFO(l.name());
    tp::Layout twin = l;
    twin.split = "layers";
    if (ok && l.pp > 1 && l.split == "flops" && check_error(tp::apply_layout(planning, twin, 8), 4).empty() &&
        *stage_modules(l) == *stage_modules(twin)) {
      ++same_split;
      CHECK(listed.count(l.name()) == 0);
      CHECK(listed.count(twin.name()) == 1);
      continue;
    }
    accepted += ok;
    CHECK(ok == (listed.count(l.name()) == 1));
  }
  CHECK(same_split > 0);  // 1F1B over 2 ranks of 6 blocks: 3 + 3 either way
  CHECK(same_split == r.same_split);
  CHECK(accepted == static_cast<int64_t>(r.fits.size()));
  CHECK(r.rejected_by_rules + r.rejected_by_memory + r.same_split + accepted == r.considered);
  CHECK(r.rejected_by_memory == 0);
}

TEST_CASE("a pipeline family whose representative the rules refuse is searched, not estimated", "[planner]") {
  // Global batch 2 on 4 ranks: pp 2 x dp 2 gets one row per rank, fewer micro-batches than
  // stages for every schedule; the search counts those candidates refused and goes on (it once
  // estimated the refused representative's memory under the other split and threw).
  const tc::JobConfig cfg = debug_job({"--training.global_batch_size", "2"});
  tp::PlanResult r;
  REQUIRE_NOTHROW(r = tp::plan_layouts(cfg, tp::cluster_from_config(tp::planning_config(cfg))));
  CHECK(r.rejected_by_rules > 0);
  CHECK_FALSE(r.fits.empty());
}

TEST_CASE("a CP method the rules refuse takes only its own candidates out of a family", "[planner]") {
  // Llama 3 8B (32 heads) at TP 8 x CP 8 on 64 GPUs: titan_ulysses needs each TP rank's 4 heads
  // split over 8 cp ranks and is refused; allgather and alltoall are not. The family's check
  // once ran on one representative (the last CP method's) and dropped the whole family.
  const tc::JobConfig cfg = tc::parse_job_config({"--model.flavor", "8B", "--training.seq_len", "8192",
                                                  "--training.global_batch_size", "64", "--plan.device", "h100",
                                                  "--plan.nodes", "8"});
  const tp::PlanResult r = tp::plan_layouts(cfg, tp::cluster_from_config(tp::planning_config(cfg)));
  std::set<std::string> methods;
  for (const tp::PlannedLayout& p : r.fits)
    if (p.layout.tp == 8 && p.layout.cp == 8) methods.insert(p.layout.cp_method);
  CHECK(methods.count("allgather") == 1);
  CHECK(methods.count("titan_ulysses") == 0);
  bool ulysses_refused = false;
  for (const auto& [why, hit] : r.reasons) ulysses_refused |= why.find("titan_ulysses") != std::string::npos;
  CHECK(ulysses_refused);
}

TEST_CASE("the planner's search covers every layout the trainer accepts on 4 ranks", "[planner]") {
  // Brute force over the keys the planner varies, independently of its enumeration: each
  // combination the trainer's checks accept must be one of the planner's candidates.
  const tc::JobConfig base = tp::planning_config(debug_job());
  std::set<std::string> candidates;
  for (const tp::Layout& l : tp::enumerate_layouts(base, 4, 8)) candidates.insert(l.name());
  int64_t accepted = 0;
  const std::vector<int64_t> degrees = {1, 2, 4};
  for (int64_t r : degrees)
    for (int64_t s : degrees)
      for (int64_t t : degrees)
        for (int64_t c : degrees)
          for (int64_t pp : degrees) {
            if (r * s * t * c * pp != 4) continue;
            for (int64_t local : {1, 2, 4, 8})
              for (const char* schedule : {"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                           "ZBVZeroBubble"})
                for (int64_t mb : {1, 2, 4, 8})
                  for (const char* split : {"layers", "flops"})
                  for (const char* method : {"allgather", "alltoall", "titan_ulysses"}) {
                    if ((pp == 1 && (std::string(schedule) != "GPipe" || mb != 1 || std::string(split) != "layers")) ||
                        (c == 1 && std::string(method) != "allgather"))
                      continue;
                    tp::Layout l;
                    l.dp_replicate = r, l.dp_shard = s, l.tp = t, l.cp = c, l.pp = pp, l.local_batch = local;
                    if (pp > 1) l.schedule = schedule, l.microbatch_size = mb, l.split = split;
                    if (c > 1) l.cp_method = method;
                    if (!check_error(tp::apply_layout(base, l, 8), 4).empty()) continue;
                    ++accepted;
                    INFO(l.name());
                    CHECK(candidates.count(l.name()) == 1);
                  }
          }
  CHECK(accepted > 20);  // FSDP, TP, CP, PP and their products on 4 ranks
}

TEST_CASE("the planner's memory figure is the memory estimate's, busiest pipeline rank", "[planner]") {
  const tc::JobConfig cfg = debug_job({"--plan.precisions", "bf16", "--plan.ac_modes", "none", "--plan.exhaustive", "true"});
  const tp::PlanResult r = tp::plan_layouts(cfg, tp::cluster_from_config(tp::planning_config(cfg)));
  REQUIRE_FALSE(r.fits.empty());
  int checked_pp = 0;
  for (const tp::PlannedLayout& p : r.fits) {
    const tc::JobConfig c = tp::apply_layout(tp::planning_config(cfg), p.layout, r.global_batch);
    // What titan-train --estimate-memory prints for this layout on 4 ranks.
    setenv("WORLD_SIZE", "4", 1);
    titan::trainer::observe::EstimateInputs in = titan::trainer::observe::estimate_inputs_from_config(c);
    unsetenv("WORLD_SIZE");
    int64_t most = 0;
    for (in.pp_rank = 0; in.pp_rank < std::max<int>(1, static_cast<int>(p.layout.pp)); ++in.pp_rank)
      most = std::max(most, titan::trainer::observe::estimate_memory(in).total);
    INFO(p.layout.name());
    CHECK(p.prediction.memory_bytes == static_cast<double>(most));  // the memo's terms are the same numbers
    checked_pp += p.layout.pp > 1;
  }
  CHECK(checked_pp > 0);
  // A memo holds one model's block terms: another model's inputs are refused, not served stale.
  setenv("WORLD_SIZE", "1", 1);
  titan::trainer::observe::EstimateInputs debug = titan::trainer::observe::estimate_inputs_from_config(tp::planning_config(cfg));
  unsetenv("WORLD_SIZE");
  titan::trainer::observe::EstimateInputs other = debug;
  other.args.n_layers += 1;
  titan::trainer::observe::BlockTermsMemo memo;
  CHECK(titan::trainer::observe::estimate_memory(debug, &memo).total == titan::trainer::observe::estimate_memory(debug).total);
  CHECK_THROWS_WITH(titan::trainer::observe::estimate_memory(other, &memo), Catch::Contains("serves one model"));
}

TEST_CASE("the pruned search keeps the exhaustive search's first choice and predictions", "[planner]") {
  // See Note [Dominated layouts]: with memory tight enough that the AC mode and the local batch
  // decide what fits (8B on 32 H100s, 80 GB), the default search examines fewer candidates;
  // its first choice is the exhaustive search's, and each layout it lists is listed by the
  // exhaustive search with the same prediction and memory figure.
  auto job = [](const char* exhaustive) {
    return tc::parse_job_config({"--model.flavor", "8B", "--training.seq_len", "8192", "--training.global_batch_size",
                                 "64", "--plan.device", "h100", "--plan.nodes", "4", "--plan.precisions",
                                 "bf16,tensorwise", "--plan.exhaustive", exhaustive});
  };
  const tc::JobConfig all_cfg = job("true"), pruned_cfg = job("false");
  const tp::PlanResult all = tp::plan_layouts(all_cfg, tp::cluster_from_config(tp::planning_config(all_cfg)));
  const tp::PlanResult pruned = tp::plan_layouts(pruned_cfg, tp::cluster_from_config(tp::planning_config(pruned_cfg)));
  REQUIRE_FALSE(pruned.fits.empty());
  CHECK(all.dominated == 0);
  CHECK(pruned.dominated > 0);
  CHECK(pruned.fits.size() < all.fits.size());
  CHECK(pruned.considered == all.considered);
  CHECK(pruned.fits.front().layout.name() == all.fits.front().layout.name());
  std::map<std::string, const tp::Prediction*> exhaustive;
  for (const tp::PlannedLayout& p : all.fits) exhaustive[p.layout.name()] = &p.prediction;
  for (const tp::PlannedLayout& p : pruned.fits) {
    INFO(p.layout.name());
    REQUIRE(exhaustive.count(p.layout.name()) == 1);
    CHECK(p.prediction.step_seconds == exhaustive[p.layout.name()]->step_seconds);
    CHECK(p.prediction.memory_bytes == exhaustive[p.layout.name()]->memory_bytes);
  }
  // Nothing the exhaustive search lists beats the pruned search's best of the same layout
  // family, schedule, micro-batch, CP method and precision (what dominance keeps constant).
  std::map<std::string, double> best_kept;
  auto group = [](tp::Layout l) {
    l.local_batch = 0, l.ac = "", l.async_tp = false;
    return l.name();
  };
  for (const tp::PlannedLayout& p : pruned.fits) {
    auto [it, fresh] = best_kept.emplace(group(p.layout), p.prediction.step_seconds);
    if (!fresh) it->second = std::min(it->second, p.prediction.step_seconds);
  }
  for (const tp::PlannedLayout& p : all.fits) {
    const auto kept = best_kept.find(group(p.layout));
    INFO(p.layout.name());
    REQUIRE(kept != best_kept.end());
    CHECK(kept->second <= p.prediction.step_seconds);
  }
}

TEST_CASE("the pipeline simulation gives 1F1B's and GPipe's bubble (p - 1) / (m + p - 1) for equal stages",
          "[planner]") {
  // Equal stages, F = 1 and B = 2, no transfer time: both schedules' step is (m + p - 1) x 3,
  // each rank busy m x 3, so the idle fraction is the textbook bubble.
  for (const char* schedule : {"1F1B", "GPipe"}) {
    for (int p : {2, 4}) {
      for (int64_t m : {4, 8}) {
        titan::parallel::pipeline::PipelineConfig pc;
        pc.schedule = schedule;
        pc.first_stage_less_layers = pc.last_stage_less_layers = 0;
        const auto plan = titan::parallel::pipeline::plan_pipeline(pc, p, 8, m);
        std::vector<tp::StageCosts> costs(static_cast<size_t>(plan.num_stages()), {1.0, 2.0, 1.0, 1.0});
        const tp::PipelineTiming t = tp::simulate_pipeline(plan, costs, 0.0);
        INFO(schedule << " p " << p << " m " << m);
        CHECK(t.step_seconds == Approx(3.0 * static_cast<double>(m + p - 1)));
        CHECK(t.idle_fraction() == Approx(static_cast<double>(p - 1) / static_cast<double>(m + p - 1)));
      }
    }
  }
}

TEST_CASE("the compiled device simulation: uneven stages agree with the event simulation; a stuck order is named",
          "[planner]") {
  // Note [Device simulation compiled]: the steps are compiled once per order and kept; each
  // layout's costs then go through one pass. Uneven stage costs and a transfer, every schedule,
  // asked twice (the second from the kept steps): the by-events simulation, whose sharing never
  // speeds anyone up, computes the same longest path (1e-9: the two add the same costs in other
  // groupings only through the re-timing's subtraction).
  for (const char* schedule : {"1F1B", "GPipe", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"}) {
    titan::parallel::pipeline::PipelineConfig pc;
    pc.schedule = schedule;
    pc.first_stage_less_layers = pc.last_stage_less_layers = 0;
    const auto plan = titan::parallel::pipeline::plan_pipeline(pc, 4, 16, 8);
    std::vector<tp::StageCosts> costs;
    for (int s = 0; s < plan.num_stages(); ++s) {
      const double f = 1.0 + 0.37 * s;
      costs.push_back({f, 2.1 * f, 1.2 * f, 0.9 * f});
    }
    const tp::PipelineTiming events = tp::simulate_pipeline(plan, costs, 0.3, 1.0 + 1e-12);
    for (int ask = 0; ask < 2; ++ask) {
      const tp::PipelineTiming devices = tp::simulate_pipeline(plan, costs, 0.3);
      INFO(schedule << " ask " << ask);
      CHECK(devices.step_seconds == Approx(events.step_seconds).epsilon(1e-9));
      REQUIRE(devices.busy_seconds.size() == events.busy_seconds.size());
      for (size_t r = 0; r < devices.busy_seconds.size(); ++r)
        CHECK(devices.busy_seconds[r] == Approx(events.busy_seconds[r]).epsilon(1e-9));
    }
  }
  // Rank 0's order reversed: its first action is a backward whose forward comes after it.
  titan::parallel::pipeline::PipelineConfig pc;
  pc.schedule = "1F1B";
  pc.first_stage_less_layers = pc.last_stage_less_layers = 0;
  auto stuck = titan::parallel::pipeline::plan_pipeline(pc, 2, 4, 4);
  auto order = *stuck.order;
  std::reverse(order[0].begin(), order[0].end());
  stuck.order = std::make_shared<const titan::parallel::pipeline::PipelineOrder>(order);
  const std::vector<tp::StageCosts> costs(static_cast<size_t>(stuck.num_stages()), {1.0, 2.0, 1.0, 1.0});
  CHECK_THROWS_WITH(tp::simulate_pipeline(stuck, costs, 0.0), Catch::Contains("cannot finish: pp rank 0 waits at 0B"));
}

TEST_CASE("ranks sharing cores: a waiting rank's share goes to the ranks that compute", "[planner]") {
  // p ranks on one core's worth of compute (max_speedup p): whenever any rank computes, the core
  // is busy, and with no transfer time some rank can always compute. So no order has a bubble:
  // the step is the work, m x (F + B) per stage spread over the p ranks, whatever the schedule.
  for (const char* schedule : {"1F1B", "GPipe", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"}) {
    for (int p : {2, 4}) {
      const int64_t m = 8;
      titan::parallel::pipeline::PipelineConfig pc;
      pc.schedule = schedule;
      pc.first_stage_less_layers = pc.last_stage_less_layers = 0;
      const auto plan = titan::parallel::pipeline::plan_pipeline(pc, p, 16, m);
      std::vector<tp::StageCosts> costs(static_cast<size_t>(plan.num_stages()), {1.0, 2.0, 1.0, 1.0});
      const double work = 3.0 * static_cast<double>(m) * plan.num_stages() / p;
      INFO(schedule << " p " << p);
      CHECK(tp::simulate_pipeline(plan, costs, 0.0, p).step_seconds == Approx(work));
      // Sharing that never speeds anyone up takes the by-events simulation to a device per
      // rank's answer (the two algorithms of Note [Pipeline simulation by events]), transfers
      // included.
      for (double transfer : {0.0, 0.25}) {
        const tp::PipelineTiming events = tp::simulate_pipeline(plan, costs, transfer, 1.0 + 1e-12);
        const tp::PipelineTiming devices = tp::simulate_pipeline(plan, costs, transfer);
        CHECK(events.step_seconds == Approx(devices.step_seconds).epsilon(1e-9));
        CHECK(events.idle_fraction() == Approx(devices.idle_fraction()).epsilon(1e-9));
      }
      if (p < 4) continue;
      // Half that sharing (4 ranks on 2 cores): between the bubble of a device per rank and none.
      const double half = tp::simulate_pipeline(plan, costs, 0.0, p / 2.0).step_seconds;
      CHECK(half > work);
      CHECK(half < tp::simulate_pipeline(plan, costs, 0.0).step_seconds);
    }
  }
}

TEST_CASE("a collective group smaller than the world pays the figures measured for its size", "[planner]") {
  // device cpu measures groups smaller than the world while the other ranks compute
  // (DeviceSpec::group_links); here a slow figure for groups of 2 on 4 ranks. Every layout with a
  // group of 2 (TP, CP, FSDP or HSDP of 2, or a pipeline's point-to-point transfers) slows down;
  // the rest use the world's figures and do not move.
  const tc::JobConfig cfg = debug_job({"--plan.exhaustive", "true", "--plan.ac_modes", "none", "--plan.precisions", "bf16"});
  const tp::Cluster plain = tp::cluster_from_config(tp::planning_config(cfg));
  tp::Cluster loaded = plain;
  loaded.device.group_links[2] = {1e-3, 1e8, {}, 0, {}};  // no large-message figure: 1e8 for all sizes
  // Unchanged: FSDP 4, TP 4, CP 4, HSDP 4.
  check_only_these_slower(step_seconds_by_layout(cfg, plain), step_seconds_by_layout(cfg, loaded), [](const tp::Layout& l) {
    return l.pp > 1 || l.tp == 2 || l.cp == 2 || l.dp_shard * l.cp == 2 || l.dp_replicate == 2;
  });
}

TEST_CASE("where transfers share the compute's cores, a pipeline transfer's bytes occupy both ranks", "[planner]") {
  // device cpu: Gloo copies an activation through the sender's and the receiver's own cores, so
  // a pipeline transfer's bytes / bandwidth is work on both ranks (each F and B pays it once per
  // remote neighbour), not a delay in flight beside their compute. A slow link makes the copies
  // large: every pipeline-only layout takes longer once they occupy the cores.
  const tc::JobConfig cfg = debug_job({"--plan.exhaustive", "true", "--plan.ac_modes", "none", "--plan.precisions",
                                       "bf16", "--plan.intra_node_gbps", "0.1"});
  const tp::Cluster in_flight = tp::cluster_from_config(tp::planning_config(cfg));
  tp::Cluster on_cores = in_flight;
  on_cores.device.comm_shares_compute = true;
  const auto before = step_seconds_by_layout(cfg, in_flight), after = step_seconds_by_layout(cfg, on_cores);
  int pipelines = 0;
  for (const auto& [name, seconds] : before) {
    const tp::Layout l = tp::parse_layout(name);
    if (l.pp != 4) continue;
    INFO(name);
    CHECK(after.at(name) > seconds);
    ++pipelines;
  }
  CHECK(pipelines > 0);
}

TEST_CASE("full AC recomputes the block's collectives, per-op AC its TP all-gathers", "[planner]") {
  // Recompute re-issues what the recomputed ops issue: under full AC the whole block, TP, CP and
  // EP traffic included; per-op AC keeps the TP reduce-scatters and CP's exchanges (its save
  // list), so it gathers the TP activations again and nothing else. A slower link therefore
  // raises the recompute term of every full-AC layout with TP or CP and every per-op-AC layout
  // with TP, and of nothing else.
  const std::vector<std::string> keys = {"--plan.exhaustive", "true", "--plan.ac_modes", "full,selective",
                                         "--plan.precisions", "bf16"};
  auto slow_keys = keys;
  slow_keys.insert(slow_keys.end(), {"--plan.intra_node_gbps", "1"});
  const tc::JobConfig fast_cfg = debug_job(keys), slow_cfg = debug_job(slow_keys);
  const auto fast = term_by_layout(fast_cfg, tp::cluster_from_config(tp::planning_config(fast_cfg)), "AC recompute");
  const auto slow = term_by_layout(slow_cfg, tp::cluster_from_config(tp::planning_config(slow_cfg)), "AC recompute");
  for (const auto& [name, seconds] : fast) {
    INFO(name);
    CHECK(seconds > 0);
  }
  check_only_these_slower(fast, slow, [](const tp::Layout& l) { return l.ac == "full" ? l.tp > 1 || l.cp > 1 : l.tp > 1; });
}

TEST_CASE("replicas all-reduce their gradients by bucket: one ring's 2 (r - 1) messages each", "[planner]") {
  // ParallelModel::reduce_grads sums the gradients in buckets of parallel::kReduceBucketBytes
  // (Note [Gradient buckets]), so the HSDP term pays a ring's 2 (r - 1) fixed message costs per
  // bucket, whatever the layer count: the debug model's gradients (21 MB) fill one.
  const tc::JobConfig cfg = debug_job({"--plan.exhaustive", "true", "--plan.ac_modes", "none", "--plan.precisions", "bf16"});
  const tp::Cluster plain = tp::cluster_from_config(tp::planning_config(cfg));
  tp::Cluster slow = plain;
  slow.device.message_latency_s += 1e-3;
  const auto before = term_by_layout(cfg, plain, "HSDP all-reduce"), after = term_by_layout(cfg, slow, "HSDP all-reduce");
  int replicated = 0;
  for (const auto& [name, seconds] : before) {
    const tp::Layout l = tp::parse_layout(name);
    INFO(name);
    CHECK(after.at(name) - seconds == Approx(2.0 * (l.dp_replicate - 1) * 1e-3).epsilon(1e-9));
    replicated += l.dp_replicate > 1;
  }
  CHECK(replicated > 0);
}

TEST_CASE("each collective at its own bus bandwidth: Gloo's reduce-scatter and all-reduce differ", "[planner]") {
  // DeviceSpec::BusRatios: the reduce-scatter's and the all-reduce's bus bandwidth against the
  // all-gather's (1 on GPUs; device cpu measures Gloo's, whose reduce-scatter is an all-reduce
  // underneath). An all-reduce twice as fast halves the HSDP term's bytes, not its messages; a
  // reduce-scatter half as fast slows every layout that reduce-scatters (FSDP, TP, CP by
  // all-gather), and nothing else moves.
  const tc::JobConfig cfg = debug_job({"--plan.exhaustive", "true", "--plan.ac_modes", "none", "--plan.precisions", "bf16"});
  tp::Cluster plain = tp::cluster_from_config(tp::planning_config(cfg));
  plain.device.comm_shares_compute = true;  // nothing hidden behind compute: every byte shows
  tp::Cluster fast_all_reduce = plain, faster_all_reduce = plain, slow_reduce_scatter = plain;
  fast_all_reduce.device.bus_ratios.all_reduce = 2.0;
  faster_all_reduce.device.bus_ratios.all_reduce = 4.0;
  slow_reduce_scatter.device.bus_ratios.reduce_scatter = 0.5;
  const auto hsdp = term_by_layout(cfg, plain, "HSDP all-reduce");
  const auto hsdp_fast = term_by_layout(cfg, fast_all_reduce, "HSDP all-reduce");
  const auto hsdp_faster = term_by_layout(cfg, faster_all_reduce, "HSDP all-reduce");
  int replicated = 0;
  for (const auto& [name, seconds] : hsdp) {
    const tp::Layout l = tp::parse_layout(name);
    if (l.dp_replicate == 1) continue;
    INFO(name);
    // bytes / rate + messages + copies: doubling the rate twice saves half, then a quarter, of
    // the bytes' time; the messages and the bucket copies stay.
    const double bytes_time = 2.0 * (seconds - hsdp_fast.at(name));
    CHECK(bytes_time > 0);
    CHECK(hsdp_fast.at(name) - hsdp_faster.at(name) == Approx(bytes_time / 4.0).epsilon(1e-9));
    ++replicated;
  }
  CHECK(replicated > 0);
  check_only_these_slower(step_seconds_by_layout(cfg, plain), step_seconds_by_layout(cfg, slow_reduce_scatter),
                          [](const tp::Layout& l) {
                            return l.dp_shard * l.cp > 1 || l.tp > 1 || (l.cp > 1 && l.cp_method == "allgather");
                          });
}

TEST_CASE("FSDP moves every parameter: the blocks, the embedding and norm + output", "[planner]") {
  // Per step without pp (default reshard): every group gathered forward; backward gathers every
  // block again but the last, and the (untied) embedding, while norm + output stay gathered;
  // every gradient reduce-scattered once in float32. With nothing hidden behind compute and no
  // message cost, the FSDP term is those bytes' (g - 1) / g over the link, exactly.
  const tc::JobConfig cfg = debug_job({"--plan.exhaustive", "true", "--plan.ac_modes", "none", "--plan.precisions", "bf16"});
  tp::Cluster cluster = tp::cluster_from_config(tp::planning_config(cfg));
  cluster.device.comm_shares_compute = true;
  cluster.device.message_latency_s = 0;
  const titan::model::ModelArgs args = titan::model::trained_model_args(
      cfg.model.name, cfg.model.flavor, titan::data::make_tokenizer(cfg.model.tokenizer_path)->vocab_size());
  REQUIRE_FALSE(args.tie_embeddings);
  const titan::model::ParamCount count = titan::model::count_params(args);
  const double block = static_cast<double>(count.per_layer), embedding = static_cast<double>(count.embedding);
  const double head = static_cast<double>(args.dim) * (1.0 + static_cast<double>(args.vocab_size));  // norm + output
  const double n = static_cast<double>(args.n_layers), g = 4;
  const double bf16_bytes = 2.0 * (2.0 * embedding + (2.0 * n - 1.0) * block + head);
  const double float32_grads = 4.0 * (embedding + n * block + head);
  const double link = cluster.device.intra_node_bytes_per_s * cluster.device.link_efficiency;
  const auto fsdp = term_by_layout(cfg, cluster, "FSDP exposed");
  const std::string layout = "dp_replicate=1,dp_shard=4,tp=1,cp=1,pp=1,local_batch=2,ac=none,precision=bf16";
  REQUIRE(fsdp.count(layout) == 1);
  CHECK(fsdp.at(layout) == Approx((g - 1) / g * (bf16_bytes + float32_grads) / link).epsilon(1e-9));
}

TEST_CASE("device cpu: a collective's bandwidth by its message size, between the two probed sizes", "[planner]") {
  // Gloo's bandwidth falls once a message leaves the caches: the probe measures 4 MiB and 64 MiB
  // messages, and a size between gets the rate interpolated on log(size) (16 MiB: the geometric
  // mean); each kind at its own ratio; without a large figure, one rate for every size.
  tp::DeviceSpec::GroupLink g;
  g.bytes_per_s = 4e8;
  g.ratios.reduce_scatter = 0.5;
  CHECK(g.bus_bytes_per_s(tp::Collective::kAllGather, 64 << 20) == 4e8);
  g.large_bytes_per_s = 1e8;
  g.large_ratios.reduce_scatter = 0.5;
  CHECK(g.bus_bytes_per_s(tp::Collective::kAllGather, 1 << 20) == 4e8);
  CHECK(g.bus_bytes_per_s(tp::Collective::kAllGather, tp::kProbeMessageBytes) == 4e8);
  CHECK(g.bus_bytes_per_s(tp::Collective::kAllGather, 16 << 20) == Approx(2e8).epsilon(1e-12));
  CHECK(g.bus_bytes_per_s(tp::Collective::kReduceScatter, 16 << 20) == Approx(1e8).epsilon(1e-12));
  CHECK(g.bus_bytes_per_s(tp::Collective::kAllGather, tp::kProbeLargeMessageBytes) == Approx(1e8).epsilon(1e-12));
  CHECK(g.bus_bytes_per_s(tp::Collective::kAllGather, 1 << 30) == 1e8);
  CHECK(g.bus_bytes_per_s(tp::Collective::kAllReduce, 1 << 30) == 1e8);  // ratio 1 by default
}

TEST_CASE("attention runs at the device's attention efficiency; device cpu measures it", "[planner]") {
  // Attention's forward FLOPs (torchtitan's count, 4 x heads x head_dim x seq_len per token) at
  // the GEMM rate x attention_efficiency, its backward attention_backward_ratio times that: at
  // one half, the compute term of a layout without pipeline, TP or CP grows by exactly the
  // forward's FLOPs x (1 + the ratio) at the GEMM rate.
  const tc::JobConfig cfg = debug_job({"--plan.exhaustive", "true", "--plan.ac_modes", "none", "--plan.precisions", "bf16"});
  const tp::Cluster plain = tp::cluster_from_config(tp::planning_config(cfg));
  tp::Cluster half = plain;
  half.device.attention_efficiency = 0.5;
  const auto before = term_by_layout(cfg, plain, "compute (GEMMs, attention)");
  const auto after = term_by_layout(cfg, half, "compute (GEMMs, attention)");
  const double rate = plain.device.peak_bf16 * plain.device.gemm_efficiency;
  int checked = 0;
  for (const auto& [name, seconds] : before) {
    const tp::Layout l = tp::parse_layout(name);
    if (l.pp > 1 || l.tp > 1 || l.cp > 1) continue;
    INFO(name);
    // heads x head_dim 256, seq_len 256, 6 layers; a rank's rows per step: its share of the 8
    // (gradient accumulation runs the passes that make it up).
    const double rows = 8.0 / static_cast<double>(l.dp_replicate * l.dp_shard);
    const double attention =
        (1.0 + plain.device.attention_backward_ratio) * 4.0 * 256.0 * 256.0 * 256.0 * rows * 6 / rate;
    CHECK(after.at(name) - seconds == Approx(attention).epsilon(1e-9));
    ++checked;
  }
  CHECK(checked > 0);
  // device cpu: the model's attention against a GEMM, both on one thread. A measured ratio of two
  // timings, so only its sense is checked: a positive, finite number. (An upper bound is a timed
  // assertion: with another job on the cores the two probes see different machines; 2.98 was
  // seen beside a CI run.)
  const tc::JobConfig cpu = debug_job({"--plan.device", "cpu", "--plan.gpus_per_node", "1"});
  const tp::Cluster measured = tp::cluster_from_config(tp::planning_config(cpu));
  CHECK(measured.device.attention_efficiency > 0);
  CHECK(std::isfinite(measured.device.attention_efficiency));
  CHECK(measured.device.attention_backward_ratio > 0);
  CHECK(std::isfinite(measured.device.attention_backward_ratio));
  // By the kernel's query length (seq_len / cp): between measured lengths in log length, beyond
  // them the nearest one's.
  tp::DeviceSpec table;
  table.attention_efficiency_by_length = {{512, 0.2}, {2048, 0.6}};
  CHECK(table.attention_efficiency_at(256) == Approx(0.2));
  CHECK(table.attention_efficiency_at(1024) == Approx(0.4));
  CHECK(table.attention_efficiency_at(8192) == Approx(0.6));
  tp::DeviceSpec gpu;
  gpu.attention_efficiency = 0.9;
  CHECK(gpu.attention_efficiency_at(131072) == Approx(0.9));
  std::string lines;
  for (const std::string& line : measured.describe()) lines += line + "\n";
  CHECK_THAT(lines, Contains("attention at"));
}

TEST_CASE("rowwise experts under EP dispatch their rows in float8: the command says so, the EP term shrinks",
          "[planner]") {
  // Qwen3-MoE's small flavor (dim 256) on 4 GPUs: at precision rowwise each routed row goes out
  // as 256 e4m3 bytes + a float32 scale instead of 512 bf16 bytes; the combine and both
  // adjoints stay bf16, so the EP term is (3 + 260 / 512) / 4 = 0.877 of bf16's or a little
  // more (a smaller message never moves at a higher bus bandwidth), and less than bf16's.
  const tc::JobConfig cfg = debug_job({"--model.name", "qwen3", "--model.flavor", "debugmodel_moe_small",
                                       "--plan.exhaustive", "true", "--plan.precisions", "bf16,rowwise",
                                       "--plan.ac_modes", "none"});
  const auto ep_term = term_by_layout(cfg, tp::cluster_from_config(tp::planning_config(cfg)), "EP exposed");
  int compared = 0;
  for (const auto& [name, seconds] : ep_term) {
    tp::Layout l = tp::parse_layout(name);
    if (l.ep == 1 || l.precision != "rowwise") continue;
    INFO(name);
    const std::vector<std::string> o = l.overrides(/*has_experts=*/true);
    CHECK(std::count(o.begin(), o.end(), "--quantize.grouped_mm.float8.float8_dispatch") == 1);
    // The command runs: the trainer's checks accept the dispatch with this layout.
    std::vector<std::string> args = {"--model.name", "qwen3", "--model.flavor", "debugmodel_moe_small"};
    args.insert(args.end(), o.begin(), o.end());
    CHECK(check_error(tc::parse_job_config(args), l.world()).empty());
    l.precision = "bf16";
    REQUIRE(ep_term.count(l.name()) == 1);
    const double bf16 = ep_term.at(l.name());
    CHECK(seconds < bf16);
    CHECK(seconds >= 0.877 * bf16);
    ++compared;
  }
  CHECK(compared > 0);
  // Without EP there is no dispatch to quantize.
  tp::Layout dense;
  dense.precision = "rowwise";
  const std::vector<std::string> o = dense.overrides(true);
  CHECK(std::count(o.begin(), o.end(), "--quantize.grouped_mm.float8.float8_dispatch") == 0);
}

TEST_CASE("plan.explain reads back the table's layout names and refuses what it cannot read", "[planner]") {
  tp::Layout l;
  l.dp_shard = 2, l.tp = 2, l.pp = 2, l.schedule = "Interleaved1F1B", l.microbatch_size = 2, l.local_batch = 4;
  l.split = "flops";
  l.async_tp = true, l.ac = "selective", l.precision = "rowwise";
  CHECK(tp::parse_layout(l.name()).name() == l.name());
  CHECK_THROWS_WITH(tp::parse_layout("dp_shard=2,tensor=2"), Contains("unknown field 'tensor'"));
  CHECK_THROWS_WITH(tp::parse_layout("dp_shard=two"), Contains("'dp_shard=two' needs a positive integer"));
  CHECK_THROWS_WITH(tc::parse_job_config({"--plan.device", "tpu"}), Contains("h100") && Contains("cpu"));
  // A float8 recipe on a GPU without float8 tensor cores is refused, naming the device.
  CHECK_THROWS_WITH(tp::cluster_from_config(tc::parse_job_config({"--plan.device", "a100", "--plan.precisions",
                                                                  "tensorwise"})),
                    Contains("A100") && Contains("float8"));
}
