// The start-up dry run (apps/dry_run.h): the trainer's model path up to the first step, for one
// rank of a layout, timed phase by phase.
#include "apps/dry_run.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/flavors.h"
#include "model/transformer.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/comm/mesh.h"
#include "parallel/parallelize.h"
#include "parallel/comm/process_group.h"
#include "trainer/observe/memory.h"
#include "trainer/config/parallel_options.h"
#include "trainer/train.h"

namespace titan::apps {
namespace {

using Clock = std::chrono::steady_clock;

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / double(1ll << 30));
  return buf;
}

struct PhaseRow {
  std::string phase;
  double seconds;
  int64_t rss, peak_rss;
};

}  // namespace

void run_dry_run(const trainer::config::JobConfig& cfg, const DryRunRequest& request, std::ostream& out) {
  using trainer::config::ConfigError;
  if (request.world < 1)
    throw ConfigError("--dry-run-world " + std::to_string(request.world) +
                      ": the number of ranks of the layout must be >= 1");
  if (request.rank < 0 || request.rank >= request.world)
    throw ConfigError("--dry-run-rank " + std::to_string(request.rank) + ": must be in [0, " +
                      std::to_string(request.world) + ") for --dry-run-world " +
                      std::to_string(request.world));
  const auto& t = cfg.training;
  parallel::comm::ParallelDims dims;
  try {
    dims = trainer::config::parallel_dims(cfg, request.world);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("dry run: ") + e.what());
  }
  c10::Device device = c10::kCPU;
  if (t.device == "cuda") {
#ifndef TITAN_WITH_CUDA
    throw ConfigError("training.device = cuda, but this titan was built without CUDA");
#else
    device = c10::Device(c10::kCUDA, 0);
#endif
  }
  if (t.num_threads > 0) at::set_num_threads(static_cast<int>(t.num_threads));

  std::vector<PhaseRow> rows;
  Clock::time_point start = Clock::now();
  auto phase_done = [&](const std::string& name) {
    const Clock::time_point now = Clock::now();
    rows.push_back({name, std::chrono::duration<double>(now - start).count(),
                    trainer::observe::process_rss_bytes(), trainer::observe::process_peak_rss_bytes()});
    start = now;
  };

  model::ModelArgs args = model::model_flavor(cfg.model.name, cfg.model.flavor);
  std::string vocab_note;
  try {
    args = model::trained_model_args(cfg.model.name, cfg.model.flavor,
                                     data::make_tokenizer(cfg.model.tokenizer_path)->vocab_size());
  } catch (const std::exception& e) {
    // As the memory estimate: answer before the assets are in place.
    vocab_note = " (tokenizer not readable: the flavor's vocabulary)";
  }
  args.max_seq_len = t.seq_len;
  args.mtp_layers = cfg.model.mtp_layers;  // its blocks are this rank's to shard too
  model::Transformer model(args);  // meta device
  phase_done("model on meta (+ tokenizer)");

  // One rank's view of the layout: groups with ranks and sizes, no transport.
  parallel::comm::CommOptions none;
  none.backend = "none";
  auto world = std::make_unique<parallel::comm::Comm>(c10::intrusive_ptr<c10d::Store>(), request.rank, request.world, "world", none);
  parallel::comm::DeviceMesh mesh(std::move(world), dims);
  phase_done("mesh (no transport)");

  // The Trainer's options, without converters (they change computes, not masters).
  const parallel::ParallelOptions popt = trainer::config::parallel_options(cfg, args, dims, device, /*float8=*/false);
  auto pm = parallel::parallelize_model(model, mesh, popt);
  phase_done("shard plan + allocate this rank's masters");
  pm->init_weights(static_cast<uint64_t>(t.seed));
  phase_done("init this rank's share (counter-based)");

  int64_t local = 0, bytes = 0;
  for (const auto& m : pm->master_params()) {
    local += m.numel();
    bytes += m.nbytes();
  }
  const int64_t total = model::count_params(args).total;
  out << "dry run: " << cfg.model.name << " " << cfg.model.flavor << " (" << total << " parameters, vocab "
      << args.vocab_size << vocab_note << "), rank " << request.rank << " of "
      << dims.describe() << ", device " << device.str() << ", " << at::get_num_threads()
      << " threads\n";
  char line[160];
  std::snprintf(line, sizeof line, "this rank: %lld elements (%.4f%% of the model, padding included), masters %s\n",
                static_cast<long long>(local), 100.0 * static_cast<double>(local) / static_cast<double>(total),
                gib(bytes).c_str());
  out << line;
  if (popt.pipeline) {  // which stages this rank materialized
    const int pp_rank = mesh.local_rank(parallel::comm::MeshDim::kPp);
    for (const std::string& plan_line : popt.pipeline->describe())
      if (plan_line.find("pp rank " + std::to_string(pp_rank) + ":") != std::string::npos)
        out << "this rank's stages (" << popt.pipeline->schedule_name << "):" << plan_line.substr(plan_line.find(':') + 1)
            << "\n";
  }
  if (dims.cp > 1) {  // the positions this rank computes (See Note [Sequence split])
    const int cp_rank = mesh.local_rank(parallel::comm::MeshDim::kCp);
    const std::vector<int64_t> pos = parallel::context_parallel::cp_positions(t.seq_len, dims.cp, cp_rank);
    const size_t half = pos.size() / 2;
    out << "this rank's share of each sequence (cp rank " << cp_rank << " of " << dims.cp << ", attention "
        << parallel::context_parallel::cp_rotate_method_name(popt.cp_rotate_method) << "): positions " << pos.front() << "-"
        << pos[half - 1] << " and " << pos[half] << "-" << pos.back() << " of " << t.seq_len << "\n";
  }
  if (dims.ep > 1 && args.moe) {  // the experts this rank holds (See Note [Expert mesh])
    const int ep_rank = mesh.local_rank(parallel::comm::MeshDim::kEp);
    const int64_t local_experts = args.moe->num_experts / dims.ep;
    out << "this rank's experts (ep rank " << ep_rank << " of " << dims.ep << "): [" << ep_rank * local_experts << ", "
        << (ep_rank + 1) * local_experts << ") of " << args.moe->num_experts << " in every MoE layer"
        << (dims.efsdp() > 1 ? ", FSDP-sharded over efsdp " + std::to_string(dims.efsdp()) + " (efsdp rank " +
                                   std::to_string(mesh.local_rank(parallel::comm::MeshDim::kEfsdp)) + ")"
                             : std::string())
        << "\n";
  }
  std::snprintf(line, sizeof line, "| %-42s | %9s | %10s | %10s |\n", "phase", "seconds", "RSS", "peak RSS");
  out << line << "|" << std::string(44, '-') << "|" << std::string(11, '-') << "|"
      << std::string(12, '-') << "|" << std::string(12, '-') << "|\n";
  double sum = 0;
  for (const PhaseRow& r : rows) {
    sum += r.seconds;
    std::snprintf(line, sizeof line, "| %-42s | %9.3f | %10s | %10s |\n", r.phase.c_str(), r.seconds,
                  gib(r.rss).c_str(), gib(r.peak_rss).c_str());
    out << line;
  }
  std::snprintf(line, sizeof line, "| %-42s | %9.3f | %10s | %10s |\n", "total", sum,
                gib(rows.back().rss).c_str(), gib(rows.back().peak_rss).c_str());
  out << line << std::flush;
}

}  // namespace titan::apps
