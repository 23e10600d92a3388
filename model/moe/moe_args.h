// model/moe/moe_args.h — a mixture-of-experts layer's arguments (torchtitan's MoEArgs), without
// any tensor: ModelArgs carries them (model/args.h), the layer uses them (moe.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace titan::model::moe {

// torchtitan's MoEArgs (its defaults).
struct MoEArgs {
  int64_t num_experts = 8;
  int64_t num_shared_experts = 1;
  std::string score_func = "sigmoid";  // "softmax" | "sigmoid"
  bool route_norm = false;
  double route_scale = 1.0;
  bool gate_bias = false;
  bool score_before_experts = true;
  int64_t top_k = 1;
  std::optional<int64_t> num_expert_groups;   // a divisor of num_experts, >= 2 experts each
  std::optional<int64_t> num_limited_groups;  // required with num_expert_groups
  // none: no expert_bias; 0: an expert_bias that never moves (model.load_balance_coeff = 0, as
  // torchtitan 0.2.2's Qwen3, whose optimizer registers no balancing hook).
  std::optional<double> load_balance_coeff = 1e-3;
  bool force_load_balance = false;  // debug.moe_force_load_balance: round-robin choice
};

}  // namespace titan::model::moe
