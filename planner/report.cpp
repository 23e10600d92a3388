// planner/report.cpp — titan-plan's output: the table of the fastest layouts that fit, the
// reasons for the rest, the command that runs the winner, and plan.explain's breakdown.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "model/flavors.h"
#include "planner/planner.h"
#include "trainer/config/parallel_options.h"

namespace titan::planner {
namespace {

void print_command(const trainer::config::JobConfig& cfg, const Cluster& cluster, const Layout& l, std::ostream& out) {
  std::string args;
  const bool has_experts = model::model_flavor(cfg.model.name, cfg.model.flavor).moe.has_value();
  for (const std::string& o : l.overrides(has_experts)) args += " " + o;
  const std::string config = cfg.job.config_file.empty() ? "" : " --job.config_file " + cfg.job.config_file;
  out << "\nto run it:\n";
  if (cluster.nodes == 1) {
    out << "  NGPU=" << cluster.gpus_per_node << (cfg.job.config_file.empty() ? "" : " CONFIG_FILE=" + cfg.job.config_file)
        << " ./run_train.sh --training.global_batch_size " << planned_global_batch(cfg, cluster.world()) << args << "\n";
  } else {
    out << "  on node i of " << cluster.nodes << ": titan-run --nnodes " << cluster.nodes << " --nproc-per-node "
        << cluster.gpus_per_node << " --node-rank i --master-addr NODE0 -- titan-train" << config
        << " --training.global_batch_size " << planned_global_batch(cfg, cluster.world()) << args << "\n";
  }
}

void print_explain(const trainer::config::JobConfig& user_cfg, const Cluster& cluster, std::ostream& out) {
  const trainer::config::JobConfig cfg = planning_config(user_cfg);
  const Layout l = parse_layout(cfg.plan.explain);
  const int64_t world = cluster.world();
  if (l.world() != world)
    throw trainer::config::ConfigError("plan.explain '" + cfg.plan.explain + "': its degrees multiply to " +
                                       std::to_string(l.world()) + " ranks, the cluster has " + std::to_string(world));
  const int64_t global = planned_global_batch(cfg, world);
  const trainer::config::JobConfig c = apply_layout(cfg, l, global);
  const trainer::config::CheckedLayout checked = trainer::config::check_layout(c, static_cast<int>(world));
  const int64_t vocab = vocab_of(cfg);
  const model::ModelArgs args = model::trained_model_args(cfg.model.name, cfg.model.flavor, vocab);
  Prediction p = predict(c, checked, args, l, cluster);
  p.memory_bytes = estimated_memory_bytes(c, world, vocab);
  for (const std::string& line : cluster.describe()) out << line << "\n";
  out << "layout " << l.name() << "\nglobal batch " << global << " x seq_len " << cfg.training.seq_len << "; "
      << p.notes.front() << "\n\n";
  for (const auto& [what, seconds] : p.terms)
    out << "  " << std::left << std::setw(42) << what << std::right << std::setw(10) << fixed(seconds * 1e3, 2)
        << " ms  " << std::setw(5) << fixed(100.0 * seconds / p.step_seconds, 1) << "%\n";
  out << "  " << std::left << std::setw(42) << "step" << std::right << std::setw(10) << fixed(p.step_seconds * 1e3, 2)
      << " ms\n\n";
  for (size_t i = 1; i < p.notes.size(); ++i) out << p.notes[i] << "\n";
  out
      << "tokens/s per GPU " << fixed(p.tokens_per_second_per_gpu, 0) << ", MFU " << fixed(100 * p.mfu, 1)
      << "%, memory " << gib(p.memory_bytes) << " of " << gib(cluster.device.memory_bytes) << " GiB (the memory "
      << "estimate, busiest pipeline rank)" << (p.memory_bytes > cluster.device.memory_bytes ? ": does NOT fit" : "")
      << "\n";
  print_command(user_cfg, cluster, l, out);
}

}  // namespace

int run_planner(const trainer::config::JobConfig& cfg, std::ostream& out, std::ostream& err) {
  const Cluster cluster = cluster_from_config(planning_config(cfg));
  if (!cfg.plan.explain.empty()) {
    print_explain(cfg, cluster, out);
    return 0;
  }
  // Progress: one line redrawn on a terminal; elsewhere (a log, a pipe) a line at each quarter.
  const bool terminal = &err == &std::cerr && isatty(STDERR_FILENO);
  int64_t last_quarter = 0;
  const PlanResult r = plan_layouts(cfg, cluster, [&](int64_t done, int64_t total) {
    if (terminal) {
      err << "\rplanning: " << done << " / " << total << " layout families" << (done == total ? "\n" : "") << std::flush;
    } else if (total > 0 && 4 * done / total > last_quarter) {
      last_quarter = 4 * done / total;
      err << "planning: " << done << " / " << total << " layout families\n" << std::flush;
    }
  });
  out << "titan layout planner: " << cfg.model.name << " " << cfg.model.flavor << ", seq_len " << cfg.training.seq_len
      << ", global batch " << r.global_batch << " rows\n";
  for (const std::string& line : cluster.describe()) out << line << "\n";
  out << r.considered << " layouts considered: " << r.fits.size() << " fit, " << r.rejected_by_rules
      << " refused by the trainer's checks, " << r.rejected_by_memory << " over memory";
  if (r.same_split > 0)
    out << ", " << r.same_split << " the same as their split=layers twin (split=flops places every module alike)";
  if (!cfg.plan.exhaustive)
    out << ", " << r.dominated << " dominated (not examined: a larger local batch or a lighter AC mode of the "
        << "same layout fits, or async TP off; --plan.exhaustive true examines them)";
  out << "\n\n";
  if (r.fits.empty()) {
    out << "nothing fits.\n";
  } else {
    out << "  #   step ms  tok/s/GPU   MFU %  mem GiB  comm %  idle %  layout\n";
    const size_t rows = std::min<size_t>(r.fits.size(), static_cast<size_t>(cfg.plan.top));
    for (size_t i = 0; i < rows; ++i) {
      const Prediction& p = r.fits[i].prediction;
      char line[160];
      std::snprintf(line, sizeof line, "%3zu %9.1f %10.0f %7.1f %8s %7.1f %7.1f  ", i + 1, p.step_seconds * 1e3,
                    p.tokens_per_second_per_gpu, 100 * p.mfu, gib(p.memory_bytes).c_str(),
                    100 * p.exposed_comm_seconds / p.step_seconds, 100 * p.pipeline_idle);
      out << line << r.fits[i].layout.name() << "\n";
    }
  }
  if (!r.reasons.empty()) {
    out << "\nrejected (candidates, one family each reason hit):\n";
    std::vector<std::pair<std::string, std::pair<int64_t, std::string>>> sorted(r.reasons.begin(), r.reasons.end());
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    for (const auto& [why, hit] : sorted) out << "  " << std::setw(7) << hit.first << "  " << why << "  (e.g. " << hit.second << ")\n";
  }
  if (!r.fits.empty()) {
    print_command(cfg, cluster, r.fits.front().layout, out);
    out << "(--plan.explain '" << r.fits.front().layout.name() << "' breaks its prediction down)\n";
  }
  return r.fits.empty() ? 1 : 0;
}

}  // namespace titan::planner
