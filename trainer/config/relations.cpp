// trainer/config/relations.cpp — checks that involve more than one key or the machine, run on
// the merged config after every key passed its own check (trainer/config/job_config.cpp).
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/flavors.h"
#include "trainer/config/key_table.h"
#include "trainer/optim/lr_schedule.h"

namespace titan::trainer::config::detail {

namespace {

// Relations between keys that torchtitan resolves by clamping, with a warning (its
// build_lr_schedulers): the run goes on with the clamped schedule, and the log says so.
void warn_about_clamped_lr_phases(JobConfig& cfg) {
  const int64_t steps = cfg.training.steps;
  const auto& lr = cfg.lr_scheduler;
  const optim::LrPhases phases = optim::lr_phases(steps, lr.warmup_steps, lr.decay_ratio);
  if (phases.warmup_clamped) {
    cfg.warnings.push_back("lr_scheduler.warmup_steps (" + std::to_string(lr.warmup_steps) +
                           ") exceeds training.steps (" + std::to_string(steps) +
                           "): warmup clamped to " + std::to_string(phases.warmup) +
                           " steps, so the LR reaches optimizer.lr only on the last step");
  }
  if (phases.decay_clamped) {
    cfg.warnings.push_back("lr_scheduler.warmup_steps (" + std::to_string(phases.warmup) +
                           ") + decay steps (" + std::to_string(phases.requested_decay) +
                           " = training.steps x lr_scheduler.decay_ratio) exceed training.steps (" +
                           std::to_string(steps) + "): decay clamped to " +
                           std::to_string(phases.decay) + " steps");
  }
}

// Profiling and memory snapshots fire every profiling.profile_freq steps; a run shorter than
// that writes none, which a user who switched them on should hear at start-up, not find out.
void warn_about_unreached_profiling(JobConfig& cfg) {
  const ProfilingSection& p = cfg.profiling;
  if (p.profile_freq <= cfg.training.steps) return;
  struct Feature {
    bool on;
    const char* key;
    const char* output;
  };
  for (const Feature& f : {Feature{p.enable_profiling, "profiling.enable_profiling", "no trace"},
                           Feature{p.enable_memory_snapshot, "profiling.enable_memory_snapshot",
                                   "no memory snapshot (except on out-of-memory)"}}) {
    if (!f.on) continue;
    cfg.warnings.push_back(std::string(f.key) + " is on, but profiling.profile_freq (" +
                           std::to_string(p.profile_freq) + ") > training.steps (" +
                           std::to_string(cfg.training.steps) + "): this run writes " + f.output +
                           "; set profiling.profile_freq to at most " +
                           std::to_string(cfg.training.steps));
  }
}

// Whether model.name and model.flavor name a flavor (otherwise their own error is reported).
bool flavor_known(const JobConfig& cfg) {
  const std::vector<std::string> families = model::model_names();
  if (std::find(families.begin(), families.end(), cfg.model.name) == families.end()) return false;
  const std::vector<std::string> flavors = model::flavor_names(cfg.model.name);
  return std::find(flavors.begin(), flavors.end(), cfg.model.flavor) != flavors.end();
}

// torchtitan's expert parallelism has "no effect for non-MoE models": the same here, said once.
void warn_about_expert_parallel_without_experts(JobConfig& cfg) {
  if (cfg.parallelism.expert_parallel_degree <= 1) return;
  if (!flavor_known(cfg)) return;  // an error already
  if (model::model_flavor(cfg.model.name, cfg.model.flavor).moe) return;
  cfg.warnings.push_back("parallelism.expert_parallel_degree = " + std::to_string(cfg.parallelism.expert_parallel_degree) +
                         " has no effect: model " + cfg.model.name + " / " + cfg.model.flavor + " has no experts");
}

}  // namespace

// Products of keys that the trainer and loader compute in int64 (rows x tokens per step), and
// limits that depend on the machine. Each problem names the keys and the allowed range.
std::vector<std::pair<std::string, std::string>> check_key_relations(
    const JobConfig& cfg, const std::map<std::string, std::string>& origins, const MachineFacts& machine) {
  std::vector<std::pair<std::string, std::string>> problems;
  const TrainingSection& t = cfg.training;
  auto where = [&](const char* key) {
    auto it = origins.find(key);
    return it == origins.end() ? std::string("default") : it->second;
  };
  if (machine.hardware_threads > 0 && t.num_threads > machine.hardware_threads) {
    problems.emplace_back(where("training.num_threads"),
                          "training.num_threads = " + std::to_string(t.num_threads) +
                        " is more than this machine's " + std::to_string(machine.hardware_threads) +
                        " hardware threads: must be in [0, " +
                        std::to_string(machine.hardware_threads) + "] (0 = all of them)");
  }
  // Multi-token prediction runs after the last block on the tokens of the whole row: torchtitan
  // refuses it with pipeline and context parallelism, as titan does (model/mtp.h).
  if (cfg.model.mtp_layers > 0) {
    const struct {
      const char* key;
      int64_t degree;
      const char* why;
    } refused[] = {
        {"pipeline_parallel_degree", cfg.parallelism.pipeline_parallel_degree,
         "multi-token prediction needs the embedding and the last block on one stage"},
        {"context_parallel_degree", cfg.parallelism.context_parallel_degree,
         "multi-token prediction shifts tokens across the whole row, which a context-parallel rank does not hold"},
    };
    for (const auto& r : refused)
      if (r.degree > 1)
        problems.emplace_back(where("model.mtp_layers"),
                              "model.mtp_layers = " + std::to_string(cfg.model.mtp_layers) + " with parallelism." +
                                  r.key + " = " + std::to_string(r.degree) + ": " + r.why + "; set " + r.key +
                                  " to 1 or mtp_layers to 0");
  }
  // The experts' low-precision converters (float8/grouped_experts.h): model.converters turns one
  // on, as in torchtitan, and its fqns choose the layers; titan refuses what would do nothing.
  {
    const auto& converters = cfg.model.converters;
    const struct {
      const char* converter;
      const std::vector<std::string>* fqns;
    } grouped[] = {{"quantize.grouped_mm.float8", &cfg.grouped_float8.fqns}, {"quantize.grouped_mm.mx", &cfg.grouped_mx.fqns}};
    int listed = 0;
    for (const auto& g : grouped) {
      const std::string fqns_key = std::string(g.converter) + ".fqns";
      const bool on = std::find(converters.begin(), converters.end(), g.converter) != converters.end();
      listed += on ? 1 : 0;
      if (on && g.fqns->empty())
        problems.emplace_back(where("model.converters"),
                              std::string("model.converters lists ") + g.converter + " but " + fqns_key +
                                  " is empty: name the MoE modules whose experts it converts (\"experts\" names every one)");
      if (!on && !g.fqns->empty())
        problems.emplace_back(where(fqns_key.c_str()),
                              fqns_key + " is set but model.converters does not list " + g.converter +
                                  ", so it would convert nothing: add " + g.converter + " to model.converters");
      if (on && flavor_known(cfg) && !model::model_flavor(cfg.model.name, cfg.model.flavor).moe)
        problems.emplace_back(where("model.converters"),
                              std::string("model.converters lists ") + g.converter + ", but model " + cfg.model.name +
                                  " / " + cfg.model.flavor + " has no experts (no mixture-of-experts layer)");
    }
    if (cfg.grouped_float8.float8_dispatch) {
      const bool rowwise = std::find(converters.begin(), converters.end(), "quantize.grouped_mm.float8") !=
                               converters.end() &&
                           cfg.grouped_float8.recipe_name == "rowwise";
      if (!rowwise)
        problems.emplace_back(where("quantize.grouped_mm.float8.float8_dispatch"),
                              "quantize.grouped_mm.float8.float8_dispatch needs the rowwise expert recipe (model.converters "
                              "listing quantize.grouped_mm.float8 with recipe_name rowwise): the rows travel in its input cast");
      else if (cfg.parallelism.expert_parallel_degree <= 1)
        problems.emplace_back(where("quantize.grouped_mm.float8.float8_dispatch"),
                              "quantize.grouped_mm.float8.float8_dispatch has no effect without expert parallelism "
                              "(parallelism.expert_parallel_degree = 1 dispatches nothing): set the degree above 1 or the key to false");
    }
    if (listed == 2)
      problems.emplace_back(where("model.converters"),
                            "model.converters lists both quantize.grouped_mm.float8 and quantize.grouped_mm.mx: an "
                            "expert trains in one low precision; choose one");
  }
  // Tokens of one optimizer step on one rank: rows (global batch, or local batch when it is
  // derived) x seq_len; the loader and the token counters multiply them in int64, and
  // attention's scores grow with seq_len^2. 2^40 tokens (a trillion) per step is far beyond any
  // real batch and keeps every such product, and x vocab for the logits, inside int64.
  constexpr int64_t kMaxTokensPerStep = int64_t{1} << 40;
  const int64_t rows = std::max(t.global_batch_size, t.local_batch_size);
  int64_t tokens = 0;
  if (__builtin_mul_overflow(rows, t.seq_len, &tokens) || tokens > kMaxTokensPerStep) {
    problems.emplace_back(where("training.seq_len"),
                    "training.seq_len (" + std::to_string(t.seq_len) + ") x " +
                        (t.global_batch_size > 0 ? "training.global_batch_size (" : "training.local_batch_size (") +
                        std::to_string(rows) + ") is more than 2^40 tokens per step: make the "
                        "product at most " + std::to_string(kMaxTokensPerStep));
  }
  // A flavor belongs to its family (the key table accepts every family's flavor names and
  // reports a name that is none of them itself).
  const std::vector<std::string>& families = model::model_names();
  if (std::find(families.begin(), families.end(), cfg.model.name) != families.end()) {
    const std::vector<std::string> flavors = model::flavor_names(cfg.model.name);
    bool known = false;
    for (const auto& family : model::model_names()) {
      const std::vector<std::string> theirs = model::flavor_names(family);
      known = known || std::find(theirs.begin(), theirs.end(), cfg.model.flavor) != theirs.end();
    }
    if (known && std::find(flavors.begin(), flavors.end(), cfg.model.flavor) == flavors.end()) {
      std::string valid;
      for (const auto& f : flavors) valid += (valid.empty() ? "" : ", ") + f;
      problems.emplace_back(where("model.flavor"), "model.flavor = '" + cfg.model.flavor + "' is not a " +
                                                       cfg.model.name + " flavor (model.name); choose from: " + valid);
    }
  }
  // torchtitan's Hugging Face switches: the folder to read, and a last save that can only be
  // the model (an HF folder holds no optimizer or data position).
  const CheckpointSection& ck = cfg.checkpoint;
  if (ck.initial_load_in_hf && ck.initial_load_path.empty() && cfg.model.hf_assets_path.empty())
    problems.emplace_back(where("checkpoint.initial_load_in_hf"),
                          "checkpoint.initial_load_in_hf = true needs the Hugging Face folder to read: set "
                          "checkpoint.initial_load_path or model.hf_assets_path");
  if (ck.last_save_in_hf && !ck.model_weights_only)
    problems.emplace_back(where("checkpoint.last_save_in_hf"),
                          "checkpoint.last_save_in_hf = true needs checkpoint.last_save_model_only "
                          "(titan: checkpoint.model_weights_only) = true: a Hugging Face folder holds only the "
                          "model weights");
  if (ck.last_save_in_hf && !ck.enable_checkpoint)
    problems.emplace_back(where("checkpoint.last_save_in_hf"),
                          "checkpoint.last_save_in_hf = true needs checkpoint.enable_checkpoint (it changes the "
                          "format of the last checkpoint)");
  // torchtitan asserts the first (a Hugging Face folder holds only the model); the second would
  // save step-0 while promising to save nothing.
  if (ck.initial_load_in_hf && !ck.initial_load_model_only)
    problems.emplace_back(where("checkpoint.initial_load_model_only"),
                          "checkpoint.initial_load_model_only = false reads checkpoint.initial_load_path as a full "
                          "titan checkpoint, but checkpoint.initial_load_in_hf = true says it is a Hugging Face "
                          "folder, which holds only the model weights: set one of them back");
  if (ck.load_only && ck.create_seed_checkpoint)
    problems.emplace_back(where("checkpoint.load_only"),
                          "checkpoint.load_only = true saves no checkpoint, but checkpoint.create_seed_checkpoint = "
                          "true asks to write step-0: choose one");
  const CommSection& c = cfg.comm;
  if (c.debug_fail_at_step > t.steps) {
    problems.emplace_back(where("comm.debug_fail_at_step"),
                    "comm.debug_fail_at_step = " + std::to_string(c.debug_fail_at_step) +
                        " is beyond training.steps (" + std::to_string(t.steps) +
                        "): the injected failure would never happen; must be in [0, " +
                        std::to_string(t.steps) + "]");
  }
  return problems;
}

void add_start_up_warnings(JobConfig& cfg) {
  warn_about_clamped_lr_phases(cfg);
  warn_about_unreached_profiling(cfg);
  warn_about_expert_parallel_without_experts(cfg);
}

}  // namespace titan::trainer::config::detail
