// planner/layout.cpp — see layout.h.
#include "planner/layout.h"

#include <cstdlib>
#include <sstream>

namespace titan::planner {
namespace {

std::string yes_no(bool v) { return v ? "1" : "0"; }

}  // namespace

std::string Layout::family() const {
  std::ostringstream os;
  os << "dp_replicate " << dp_replicate << " x dp_shard " << dp_shard << " x tp " << tp << " x cp " << cp << " x pp "
     << pp;
  if (ep > 1) os << " (ep " << ep << ")";
  return os.str();
}

std::string Layout::name() const {
  // Appends rather than a stream: the planner names every candidate it looks at (millions for a
  // 405B model on 16k GPUs), and a stream costs several times this.
  using std::to_string;
  std::string s;
  s.reserve(160);
  s += "dp_replicate=" + to_string(dp_replicate) + ",dp_shard=" + to_string(dp_shard) + ",tp=" + to_string(tp) +
       ",cp=" + to_string(cp) + ",pp=" + to_string(pp);
  if (ep > 1) s += ",ep=" + to_string(ep);
  if (pp > 1) s += ",schedule=" + schedule + ",microbatch=" + to_string(microbatch_size) + ",split=" + split;
  if (cp > 1) s += ",cp_method=" + cp_method;
  if (tp > 1) s += ",async_tp=" + yes_no(async_tp);
  s += ",local_batch=" + to_string(local_batch) + ",ac=" + ac + ",precision=" + precision;
  return s;
}

std::vector<std::string> Layout::overrides(bool has_experts) const {
  std::vector<std::string> o = {
      "--parallelism.data_parallel_replicate_degree", std::to_string(dp_replicate),
      "--parallelism.data_parallel_shard_degree",     std::to_string(dp_shard),
      "--parallelism.tensor_parallel_degree",         std::to_string(tp),
      "--parallelism.context_parallel_degree",        std::to_string(cp),
      "--parallelism.pipeline_parallel_degree",       std::to_string(pp),
      "--training.local_batch_size",                  std::to_string(local_batch),
      "--activation_checkpoint.mode",                 ac,
  };
  if (ac == "selective") o.insert(o.end(), {"--activation_checkpoint.selective_ac_option", "op"});
  if (ep > 1) o.insert(o.end(), {"--parallelism.expert_parallel_degree", std::to_string(ep)});
  if (pp > 1)
    o.insert(o.end(), {"--parallelism.pipeline_parallel_schedule", schedule,
                       "--parallelism.pipeline_parallel_microbatch_size", std::to_string(microbatch_size),
                       "--parallelism.pipeline_parallel_stage_balance", split});
  if (cp > 1) o.insert(o.end(), {"--parallelism.context_parallel_rotate_method", cp_method});
  if (tp > 1 && async_tp) o.push_back("--parallelism.enable_async_tensor_parallel");
  if (precision != "bf16") o.insert(o.end(), {"--float8.enable_float8_linear", "--float8.recipe_name", precision});
  // The MoE experts' own float8 recipe is rowwise (torchao's); the time model counts them in
  // float8 only then (predict.cpp). Under EP their rows travel in float8 too (D + 4 bytes a row
  // instead of 2 D; the experts' input cast, bit for bit the one at the destination).
  if (precision == "rowwise" && has_experts) {
    o.insert(o.end(), {"--model.converters", "quantize.grouped_mm.float8", "--quantize.grouped_mm.float8.fqns", "experts"});
    if (ep > 1) o.push_back("--quantize.grouped_mm.float8.float8_dispatch");
  }
  return o;
}

void apply_layout_into(trainer::config::JobConfig& c, const trainer::config::JobConfig& base, const Layout& l,
                       int64_t global_batch) {
  auto& p = c.parallelism;
  const auto& b = base.parallelism;
  p.data_parallel_replicate_degree = l.dp_replicate;
  p.data_parallel_shard_degree = l.dp_shard;
  p.tensor_parallel_degree = l.tp;
  p.context_parallel_degree = l.cp;
  p.pipeline_parallel_degree = l.pp;
  p.expert_parallel_degree = l.ep;
  // Every key the layout can set is set, from the layout or else from `base`: `c` may hold an
  // earlier layout's.
  p.pipeline_parallel_schedule = l.pp > 1 ? l.schedule : b.pipeline_parallel_schedule;
  p.pipeline_parallel_microbatch_size = l.pp > 1 ? l.microbatch_size : b.pipeline_parallel_microbatch_size;
  p.pipeline_parallel_stage_balance = l.pp > 1 ? l.split : b.pipeline_parallel_stage_balance;
  p.context_parallel_rotate_method = l.cp > 1 ? l.cp_method : b.context_parallel_rotate_method;
  p.enable_async_tensor_parallel = l.tp > 1 && l.async_tp;
  c.training.local_batch_size = l.local_batch;
  c.training.global_batch_size = global_batch;
  c.activation_checkpoint.mode = l.ac;
  c.activation_checkpoint.selective_ac_option =
      l.ac == "selective" ? "op" : base.activation_checkpoint.selective_ac_option;
  c.float8.enable_float8_linear = l.precision != "bf16";
  c.float8.recipe_name = l.precision != "bf16" ? l.precision : base.float8.recipe_name;
}

trainer::config::JobConfig apply_layout(const trainer::config::JobConfig& base, const Layout& l, int64_t global_batch) {
  trainer::config::JobConfig c = base;
  apply_layout_into(c, base, l, global_batch);
  return c;
}

Layout parse_layout(const std::string& text) {
  Layout l;
  std::istringstream in(text);
  auto fail = [&](const std::string& why) -> void {
    throw trainer::config::ConfigError(
        "plan.explain '" + text + "': " + why +
        " (a layout as the planner's table prints it: dp_replicate=, dp_shard=, tp=, cp=, pp=, ep=, schedule=, "
        "microbatch=, split=, cp_method=, async_tp=, local_batch=, ac=, precision=)");
  };
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) fail("'" + item + "' is not field=value");
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    auto number = [&]() -> int64_t {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1) fail("'" + item + "' needs a positive integer");
      return n;
    };
    if (k == "dp_replicate") l.dp_replicate = number();
    else if (k == "dp_shard") l.dp_shard = number();
    else if (k == "tp") l.tp = number();
    else if (k == "cp") l.cp = number();
    else if (k == "pp") l.pp = number();
    else if (k == "ep") l.ep = number();
    else if (k == "schedule") l.schedule = v;
    else if (k == "microbatch") l.microbatch_size = number();
    else if (k == "split") l.split = v;
    else if (k == "cp_method") l.cp_method = v;
    else if (k == "async_tp") l.async_tp = v == "1" || v == "true";
    else if (k == "local_batch") l.local_batch = number();
    else if (k == "ac") l.ac = v;
    else if (k == "precision") l.precision = v;
    else fail("unknown field '" + k + "'");
  }
  if (l.pp > 1 && l.schedule.empty()) l.schedule = "1F1B";
  if (l.cp > 1 && l.cp_method.empty()) l.cp_method = "allgather";
  return l;
}

}  // namespace titan::planner
