// planner/layout.h — one candidate of the layout planner: the parallel degrees and the choices
// that go with them, as the config keys that run it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config/job_config.h"

namespace titan::planner {

struct Layout {
  int64_t dp_replicate = 1, dp_shard = 1, tp = 1, cp = 1, pp = 1, ep = 1;
  std::string schedule;            // pipeline_parallel_schedule when pp > 1
  int64_t microbatch_size = 1;     // pipeline_parallel_microbatch_size when pp > 1
  std::string split = "layers";    // pipeline_parallel_stage_balance when pp > 1: layers or flops
  std::string cp_method;           // context_parallel_rotate_method when cp > 1
  bool async_tp = false;           // enable_async_tensor_parallel when tp > 1
  int64_t local_batch = 1;         // training.local_batch_size (gradient accumulation makes the rest)
  std::string ac = "none";         // none, selective (per-op), full
  std::string precision = "bf16";  // bf16, tensorwise, rowwise (float8 recipes)

  int64_t world() const { return dp_replicate * dp_shard * tp * cp * pp; }
  int64_t dp() const { return dp_replicate * dp_shard; }
  // The family: the five degrees (and ep), what the planner's rejections are grouped by.
  std::string family() const;
  // "dp_shard=8,tp=1,...": every field; what the table prints and plan.explain takes.
  std::string name() const;
  // The command-line overrides that run it (on top of the user's config); a model with experts
  // (`has_experts`) at precision rowwise trains them in float8 rowwise too (and, under EP,
  // dispatches their rows in float8).
  std::vector<std::string> overrides(bool has_experts = false) const;
};

// `base` with the layout's keys set; training.global_batch_size = `global_batch`.
trainer::config::JobConfig apply_layout(const trainer::config::JobConfig& base, const Layout& layout,
                                        int64_t global_batch);
// The same into `c`, a copy of `base` that may hold another layout's keys (the planner applies
// millions of candidates: a config copy each was a tenth of its search).
void apply_layout_into(trainer::config::JobConfig& c, const trainer::config::JobConfig& base, const Layout& layout,
                       int64_t global_batch);

// The inverse of Layout::name(); fields left out keep their defaults. Throws ConfigError naming
// the field and the valid ones.
Layout parse_layout(const std::string& text);

}  // namespace titan::planner
