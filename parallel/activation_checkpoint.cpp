#include "parallel/activation_checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>

#include "model/activation_checkpoint_ops.h"
#include "model/moe/moe.h"
#include "model/scope.h"

namespace titan::parallel {

// Note [Op save list]:
// The ONLY ops whose outputs per-op selective AC keeps (torchtitan's _save_list for Llama:
// mm, sdpa and the collectives). Everything else a block computes (pointwise, norms, RoPE, casts,
// abs, float8 scaling) is recomputed. `abs` in particular must never be here: with float8
// rowwise it is abs(W) of an unsharded weight, ~11 GiB on Llama3-8B, a memory regression
// torchtitan once shipped. tests/test_activation_checkpoint checks that a block keeps exactly
// the 1st/3rd/5th/7th mm and sdpa, and no abs.
const model::SaveList& selective_ac_save_list() {
  static const model::SaveList list = {
      {"mm", /*every_second=*/true, "matrix products: the FLOPs; every second one is recomputed"},
      {"sdpa", false, "attention: quadratic in seq_len, the costliest op to recompute"},
      {"reduce_scatter", false, "TP reduce-scatter: recomputing it would repeat communication"},
      {"cp_all_to_all", false, "context parallel head re-shards (titan_ulysses): recomputing would repeat them"},
      {"ep_all_to_all", false, "expert parallel dispatch and combine (and their counts): recomputing would repeat them"},
      {"amax", false, "float8 amax reductions: tiny outputs, and a cross-rank max in FSDP"},
  };
  return list;
}

bool op_on_save_list(const std::string& op) {
  for (const auto& e : selective_ac_save_list())
    if (op == e.op) return true;
  return false;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward needs besides the input: the block's forward and, for per-op AC, the
// outputs kept in the first forward. Travels in the autograd context as a capsule.
struct BlockCheckpointState : public torch::CustomClassHolder {
  model::ForwardFn run;
  bool per_op = false;
  int64_t layer_id = 0;
  model::OpCheckpointStore store{selective_ac_save_list()};
};

struct CheckpointBlockFunction : public torch::autograd::Function<CheckpointBlockFunction> {
  // Runs with grad disabled (custom Function forward): no activation inside the block is saved.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<BlockCheckpointState> state) {
    at::Tensor out;
    if (state->per_op) {
      model::OpCheckpointScope record(&state->store, model::OpCheckpointPhase::kRecord);
      out = state->run(x);
    } else {
      out = state->run(x);
    }
    ctx->save_for_backward({x});
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return out;  // [B, S, D]
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = ctx->saved_data.at("state").toCapsule();
    auto* state = static_cast<BlockCheckpointState*>(holder.get());
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);  // [B, S, D]
    at::Tensor out;
    {
      model::NamedScope scope("recompute layers." + std::to_string(state->layer_id),
                              model::MemoryCategory::kActivations);
      at::AutoGradMode enable_grad(true);
      model::moe::UncountedForward uncounted;  // the first forward counted (Note [Counted tokens])
      if (state->per_op) {
        model::OpCheckpointScope replay(&state->store, model::OpCheckpointPhase::kReplay);
        out = state->run(x);
      } else {
        out = state->run(x);
      }
    }
    {
      // The recomputed graph's backward: parameter grads accumulate as without AC; x.grad is
      // this block's input grad. Ops running in it (float8 re-casts) must not see the store.
      model::OpCheckpointPause pause;
      torch::autograd::backward({out}, {grads[0]});
    }
    state->store.clear();
    return {x.grad(), at::Tensor()};
  }
};

bool parse_positive_int(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *out = std::stoll(s);
  return *out >= 1;
}

}  // namespace

AcOptions parse_ac_options(const std::string& mode, const std::string& option) {
  AcOptions o;
  if (mode == "none") return o;
  if (mode == "full") {
    o.mode = AcMode::kFull;
    return o;
  }
  if (mode != "selective")
    throw std::invalid_argument("activation_checkpoint.mode '" + mode +
                                "' is not one of none, full, selective");
  if (option == "op") {
    o.mode = AcMode::kSelectiveOp;
    return o;
  }
  if (!parse_positive_int(option, &o.every_n))
    throw std::invalid_argument("activation_checkpoint.selective_ac_option '" + option +
                                "' must be \"op\" (per-op selective AC) or an integer N >= 1 "
                                "(checkpoint every N-th block)");
  o.mode = AcMode::kSelectiveLayer;
  return o;
}

std::string describe_ac(const AcOptions& o) {
  switch (o.mode) {
    case AcMode::kNone: return "none";
    case AcMode::kFull: return "full";
    case AcMode::kSelectiveOp: return "per-op selective";
    case AcMode::kSelectiveLayer:
      return o.every_n == 1 ? "every block" : "every " + std::to_string(o.every_n) + " blocks";
  }
  return "?";
}

bool block_is_checkpointed(const AcOptions& o, int64_t layer_id) {
  switch (o.mode) {
    case AcMode::kNone: return false;
    case AcMode::kFull:
    case AcMode::kSelectiveOp: return true;
    case AcMode::kSelectiveLayer: return (layer_id + 1) % o.every_n == 0;  // torchtitan counts from 1
  }
  return false;
}

at::Tensor checkpoint_block(const at::Tensor& x, const model::ForwardFn& run, bool per_op, int64_t layer_id) {
  // Without grad there is no backward to recompute for: run plainly.
  if (!at::GradMode::is_enabled()) return run(x);
  auto state = c10::make_intrusive<BlockCheckpointState>();
  state->run = run;
  state->per_op = per_op;
  state->layer_id = layer_id;
  return CheckpointBlockFunction::apply(x, std::move(state));
}

void apply_ac(model::Transformer& model, const AcOptions& options) {
  const bool per_op = options.mode == AcMode::kSelectiveOp;
  for (model::TransformerBlock* block : model.blocks()) {
    if (!block_is_checkpointed(options, block->layer_id)) continue;
    const int64_t layer_id = block->layer_id;
    // The inner forward is copied into the checkpoint state: the recompute in backward calls it.
    model.wrap_block(layer_id, {per_op ? "ac(op)" : "ac(full)",
                                [per_op, layer_id](const at::Tensor& x, const model::ForwardFn& inner) {
                                  return checkpoint_block(x, inner, per_op, layer_id);
                                }});
  }
}

}  // namespace titan::parallel
