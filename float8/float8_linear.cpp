#include "float8/float8_linear.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <stdexcept>

#include "float8/kernels/fused_cast.h"
#include "float8/scaling.h"
#include "model/linear_autograd.h"

namespace titan::float8 {

namespace {

// Delayed cast of one operand (See Note [Delayed scaling]): record max|x|, cast with the
// history's scale (seeding it from the current amax on first use). Returns the Float8Tensor
// whose scale is a private snapshot, so backward re-casts with exactly the forward's scale.
Float8Tensor delayed_cast(AmaxHistory& h, const at::Tensor& x, at::ScalarType dtype,
                          const Float8Recipe& recipe, bool record = true) {
  at::Tensor current = amax(x, ScalingGranularity::Tensorwise, 0);  // [] float32
  // A forward without autograd (validation) reads the scaling state and never writes it, so
  // validating changes no later training step: the history's scale, or before the first
  // training step a dynamic scale from the current amax.
  if (!record)
    return cast_rows_with_scale(
        x, h.initialized ? h.scale.clone() : scale_from_amax(current, dtype, recipe.round_scales_to_power_of_2), dtype);
  if (!h.initialized) {
    auto opts = current.options();
    h.amax = at::zeros({}, opts);
    h.history = at::zeros({recipe.amax_history_len}, opts);
    h.history.select(0, 0).copy_(current);
    h.scale = scale_from_amax(current, dtype, recipe.round_scales_to_power_of_2);
    h.initialized = true;
  }
  h.amax.copy_(at::maximum(h.amax, current));
  return cast_rows_with_scale(x, h.scale.clone(), dtype);
}

// Dynamic cast of an operand; `tp_sharded_dim`: the dimension (0 first, 1 last, -1 none) along
// which this rank holds only a TP shard of it (See Note [Scales under TP]).
Float8Tensor cast_dynamic(const Float8LinearState& s, int tp_sharded_dim, const at::Tensor& x,
                          const CastConfig& config, int64_t axis_dim) {
  const bool pow2 = s.recipe.round_scales_to_power_of_2;
  if (tp_sharded_dim >= 0 && s.tp.amax_max) {
    const int64_t axis = c10::maybe_wrap_dim(axis_dim, x.dim());
    const int reduced_dim = axis == x.dim() - 1 ? 1 : (axis == 0 ? 0 : -1);
    if (config.granularity == ScalingGranularity::Tensorwise || reduced_dim == tp_sharded_dim)
      return to_float8_with_global_amax(x, config, axis, pow2, s.tp.amax_max);
  }
  return to_float8(x, config, axis_dim, pow2);
}

// Dynamic or snapshot cast: `snapshot` is the forward's delayed scale when defined. A snapshot
// cast along dim 0 (the backward's W and x) is laid out column-major on CUDA, as a dynamic
// tensorwise cast is (Note [Fused casts on the hot path]): no float8 transpose copy before the GEMM.
Float8Tensor recast(const Float8LinearState& s, int tp_sharded_dim, const at::Tensor& x,
                    const CastConfig& config, int64_t axis_dim, const at::Tensor& snapshot) {
  if (snapshot.defined())
    return axis_dim == 0 ? cast_to_columns_with_scale(x, snapshot, config.dtype)
                         : cast_rows_with_scale(x, snapshot, config.dtype);
  return cast_dynamic(s, tp_sharded_dim, x, config, axis_dim);
}

// An operand its producer cast (See Note [Float8 operands from the producer]), or undefined.
Float8Tensor handed_operand(const titan::model::LinearOperand& op) {
  if (!op.cast.defined()) return {};
  return Float8Tensor{op.cast.data, op.cast.scale, op.hp.scalar_type()};
}

// Note [Float8 linear autograd]: one call's products through the linears' skeleton (Note [One
// linear skeleton] in model/linear_autograd.h): input [..., K], weight [N, K], either possibly
// handed already cast, and whether this is a training forward (delayed amax histories record).
// The backward flattens input to x [M, K] (scales are computed after flattening, so they are
// (M, 1) / (1, K) by construction) and runs the two backward GEMMs with the operand layouts of
// docs/float8.md. Dynamic recipes run the casts + GEMM of the output as the skeleton's "mm", so
// per-op selective AC keeps the product (skipping casts and GEMM in the recompute) as it keeps a
// high-precision one; the backward re-casts the saved high-precision x and W either way.
// Delayed casts record the amax history and snapshot the scales backward re-casts with, so they
// always run (their product is recomputed).
class Float8Arithmetic final : public titan::model::LinearArithmetic {
 public:
  Float8Arithmetic(c10::intrusive_ptr<Float8LinearState> state, const titan::model::QuantizedOperand& input_cast,
                   const titan::model::QuantizedOperand& weight_cast, const at::Tensor& input, const at::Tensor& weight,
                   bool training)
      : state_(std::move(state)),
        // See Note [Float8 operands from the producer]: either may arrive already cast.
        x_handed_(handed_operand({input, input_cast})),
        w_handed_(handed_operand({weight, weight_cast})),
        training_(training) {}

  bool records_state() const override { return state_->recipe.delayed; }

  at::Tensor output(const at::Tensor& input, const at::Tensor& weight) override {
    Float8LinearState& s = *state_;
    const Float8Recipe& r = s.recipe;
    const GemmBackend backend = resolve_gemm_backend(s.backend, s.emulate, input.device());
    Float8Tensor x8, w8;  // x8: [..., K] scale () or [..., 1]; w8: [N, K] scale () or (N, 1)
    if (x_handed_.data.defined()) {
      x8 = x_handed_;
      w8 = w_handed_.data.defined() ? w_handed_ : cast_dynamic(s, s.tp.weight_dim, weight, r.weight, /*axis_dim=*/-1);
    } else if (r.delayed) {
      x8 = delayed_cast(s.input, input, r.input.dtype, r, training_);
      w8 = delayed_cast(s.weight, weight, r.weight.dtype, r, training_);
      x_scale_ = x8.scale;
      w_scale_ = w8.scale;
    } else {
      x8 = cast_dynamic(s, s.tp.input_dim, input, r.input, /*axis_dim=*/-1);
      w8 = w_handed_.data.defined() ? w_handed_ : cast_dynamic(s, s.tp.weight_dim, weight, r.weight, /*axis_dim=*/-1);
    }
    // See Note [Scale follows data]: (B, S, K) with (B, S, 1) -> (B*S, K) with (B*S, 1).
    return scaled_mm(reshape_to_2d(x8), transpose_2d(w8), input.scalar_type(), r.use_fast_accum_output,
                     backend);  // [M, N]
  }

  Grads backward(const at::Tensor& G, const at::Tensor& input, const at::Tensor& weight, bool need_input,
                 bool need_weight) override {
    Float8LinearState& s = *state_;
    const Float8Recipe& r = s.recipe;
    const int64_t K = weight.size(1);
    const GemmBackend backend = resolve_gemm_backend(s.backend, s.emulate, input.device());
    // A handed tensorwise input's high-precision stand-in has no values: only its float8 copy is
    // read. A handed per-row cast comes with its values (it cannot serve the per-column cast).
    const bool x_tensorwise_handed = x_handed_.data.defined() && x_handed_.is_tensorwise();
    const at::Tensor x = x_tensorwise_handed ? at::Tensor() : input.reshape({-1, K});  // [M, K]

    // G cast per row (axis 1) for grad_input; per column (axis 0) for grad_weight. Tensorwise
    // (and delayed) G has one scale, so one amax serves both; on CUDA the grad_weight copy is cast
    // again with that scale straight into column-major data (one pass over G instead of a float8
    // transpose copy before the GEMM: cast_to_columns_with_scale).
    Float8Tensor g8_rows, g8_cols;
    if (r.delayed) {
      g8_rows = g8_cols = delayed_cast(s.grad_output, G, r.grad_output.dtype, r);
      if (G.is_cuda() && need_weight) g8_cols = cast_to_columns_with_scale(G, g8_rows.scale, r.grad_output.dtype);
    } else {
      g8_rows = cast_dynamic(s, s.tp.grad_output_dim, G, r.grad_output, /*axis_dim=*/-1);
      if (r.grad_output.granularity != ScalingGranularity::Tensorwise)
        g8_cols = cast_dynamic(s, s.tp.grad_output_dim, G, r.grad_output, /*axis_dim=*/0);
      else if (G.is_cuda() && !r.grad_weight_high_precision && need_weight)
        g8_cols = cast_to_columns_with_scale(G, g8_rows.scale, r.grad_output.dtype);
      else
        g8_cols = g8_rows;
    }

    Grads g;
    if (need_input) {
      // grad_input [M, K] = G [M, N] @ W [N, K]; W scaled per column (1, K) or tensorwise.
      // A handed weight is tensorwise: the same cast serves both GEMMs.
      const Float8Tensor w8 = w_handed_.data.defined()
                                  ? w_handed_
                                  : recast(s, s.tp.weight_dim, weight, r.weight_for_grad_input, /*axis_dim=*/0, w_scale_);
      g.input = scaled_mm(g8_rows, w8, input.scalar_type(), /*use_fast_accum=*/false, backend);
    }
    if (need_weight) {
      if (r.grad_weight_high_precision) {
        // rowwise_with_gw_hp: grad_weight [N, K] = G^T @ x in the activations' precision.
        g.weight = at::mm(G.t(), x).to(weight.scalar_type());
      } else {
        // grad_weight [N, K] = G^T [N, M] (scale (N, 1)) @ x [M, K] (scale (1, K)).
        const Float8Tensor x8 =
            x_tensorwise_handed
                ? Float8Tensor{x_handed_.data.reshape({-1, K}), x_handed_.scale, input.scalar_type()}
                : recast(s, s.tp.input_dim, x, r.input, /*axis_dim=*/0, x_scale_);
        g.weight = scaled_mm(transpose_2d(g8_cols), x8, weight.scalar_type(), /*use_fast_accum=*/false, backend);
      }
    }
    return g;
  }

 private:
  c10::intrusive_ptr<Float8LinearState> state_;
  const Float8Tensor x_handed_, w_handed_;  // undefined unless the producer cast them
  const bool training_;
  at::Tensor x_scale_, w_scale_;  // delayed only: the forward's scales, snapshots
};

}  // namespace

Float8LinearCompute::Float8LinearCompute(Float8Recipe recipe, bool emulate, GemmBackend backend, TpSharding tp)
    : state_(c10::make_intrusive<Float8LinearState>()) {
  if (recipe.delayed && recipe_uses_axiswise(recipe)) {
    throw std::invalid_argument("float8 recipe '" + recipe.name +
                                "': delayed scaling is tensorwise only (an amax history per "
                                "row is not defined); use a tensorwise recipe");
  }
  if (recipe.delayed && recipe.amax_history_len < 1) {
    throw std::invalid_argument("float8 recipe '" + recipe.name + "': amax_history_len " +
                                std::to_string(recipe.amax_history_len) + " must be >= 1");
  }
  state_->recipe = std::move(recipe);
  state_->emulate = emulate;
  state_->backend = backend;
  state_->tp = std::move(tp);
}

bool Float8LinearCompute::accepts_float8_input(at::ScalarType dtype) const {
  const Float8Recipe& r = state_->recipe;
  return !r.delayed && r.input.granularity == ScalingGranularity::Tensorwise &&
         !r.grad_weight_high_precision && r.input.dtype == dtype;
}

bool Float8LinearCompute::accepts_float8_row_input(at::ScalarType dtype) const {
  const Float8Recipe& r = state_->recipe;
  return !r.delayed && r.input.granularity == ScalingGranularity::Axiswise && r.round_scales_to_power_of_2 &&
         r.input.dtype == dtype;
}

bool Float8LinearCompute::accepts_float8_weight(at::ScalarType dtype) const {
  const Float8Recipe& r = state_->recipe;
  return !r.delayed && r.weight.granularity == ScalingGranularity::Tensorwise &&
         r.weight_for_grad_input.granularity == ScalingGranularity::Tensorwise &&
         r.weight.dtype == dtype && r.weight_for_grad_input.dtype == dtype;
}

at::Tensor Float8LinearCompute::forward(const titan::model::LinearOperand& input,
                                        const titan::model::LinearOperand& weight) {
  const at::Tensor& x = input.hp;
  const at::Tensor& w = weight.hp;
  titan::model::check_linear_shapes(describe(), x, w);
  const Float8Recipe& r = state_->recipe;
  if (input.chunks)
    throw std::invalid_argument("an input arriving in sequence chunks needs a column-parallel compute");
  // A per-row cast (scale [..., 1]) is what an axiswise recipe's output GEMM casts itself; it
  // arrives with its values in `hp` (float8 token dispatch: Note [Float8 dispatch] in
  // parallel/expert_parallel/expert_parallel.h), which the grad_weight GEMM re-casts per column.
  const bool per_row_cast = input.cast.defined() && input.cast.scale.dim() == x.dim() && input.cast.scale.size(-1) == 1;
  if (per_row_cast && !accepts_float8_row_input(input.cast.data.scalar_type()))
    throw std::invalid_argument("recipe '" + r.name + "' cannot use an input cast to float8 per row (that needs an "
                                "axiswise dynamic input cast with power-of-2 scales of the same dtype: recipe 'rowwise')");
  if (input.cast.defined() && !per_row_cast && (!accepts_float8_input(input.cast.data.scalar_type()) ||
                                                input.cast.data.sizes() != x.sizes()))
    throw std::invalid_argument("recipe '" + r.name + "' cannot use an input already cast to float8 "
                                "(that needs one tensorwise dynamic input cast of the same shape and "
                                "dtype for the output and grad_weight GEMMs: recipe 'tensorwise')");
  if (per_row_cast && input.cast.data.sizes() != x.sizes())
    throw std::invalid_argument("an input cast to float8 per row has shape " + c10::str(input.cast.data.sizes()) +
                                ", its values " + c10::str(x.sizes()));
  if (weight.cast.defined() && (!accepts_float8_weight(weight.cast.data.scalar_type()) ||
                                weight.cast.data.sizes() != w.sizes()))
    throw std::invalid_argument("recipe '" + r.name + "' cannot use a weight already cast to float8 "
                                "(that needs one tensorwise dynamic weight cast of the same shape and "
                                "dtype for both GEMMs: recipe 'tensorwise')");
  // An FSDP float8-gathered weight's autograd handle has no values; casting it would read freed
  // memory.
  if (!weight.cast.defined() && w.numel() > 0 && !w.is_meta() && w.storage().nbytes() == 0)
    throw std::invalid_argument("the weight has no values and no float8 form (is the linear run "
                                "outside its FSDP group's forward?)");
  // An autograd Function's forward always runs without grad mode: whether this is a training
  // forward (amax histories record) or a validation one is decided here, outside it.
  return titan::model::apply_linear(
      x, w, c10::make_intrusive<Float8Arithmetic>(state_, input.cast, weight.cast, x, w, at::GradMode::is_enabled()));
}

std::string Float8LinearCompute::describe() const {
  std::string d = "float8[" + state_->recipe.name;
  if (state_->emulate) d += ",emulated";
  if (state_->backend != GemmBackend::Auto) d += std::string(",") + gemm_backend_name(state_->backend);
  return d + "]";
}

std::vector<Float8LinearCompute*> float8_computes(
    const std::vector<titan::model::Linear*>& linears) {
  std::vector<Float8LinearCompute*> out;
  for (titan::model::Linear* l : linears) {
    if (auto* c = dynamic_cast<Float8LinearCompute*>(titan::model::innermost(l->compute()))) out.push_back(c);
  }
  return out;
}

void sync_amax_history(const std::vector<Float8LinearCompute*>& computes,
                       const std::function<void(at::Tensor&)>& all_reduce_max) {
  struct Operand {
    AmaxHistory* h;
    at::ScalarType dtype;  // the operand's float8 dtype (its scale depends on fp8_max)
    bool round_pow2;
  };
  // Every operand of every delayed compute, in a fixed order (identical on every rank).
  std::vector<Operand> operands;
  for (Float8LinearCompute* c : computes) {
    if (!c || !c->recipe().delayed) continue;
    Float8LinearState& s = c->state();
    const Float8Recipe& r = s.recipe;
    operands.push_back({&s.input, r.input.dtype, r.round_scales_to_power_of_2});
    operands.push_back({&s.weight, r.weight.dtype, r.round_scales_to_power_of_2});
    operands.push_back({&s.grad_output, r.grad_output.dtype, r.round_scales_to_power_of_2});
  }
  at::TensorOptions opts;
  bool any_initialized = false;
  for (const Operand& o : operands) {
    if (o.h->initialized) {
      opts = o.h->amax.options();
      any_initialized = true;
      break;
    }
  }
  if (!any_initialized) return;  // nothing ran yet: nothing to sync
  std::vector<at::Tensor> amaxes;  // unused operands contribute 0 so layouts match across ranks
  amaxes.reserve(operands.size());
  for (const Operand& o : operands) {
    amaxes.push_back(o.h->initialized ? o.h->amax : at::zeros({}, opts));
  }
  at::Tensor stacked = at::stack(amaxes);  // [3 * n_delayed] float32
  if (all_reduce_max) all_reduce_max(stacked);
  for (size_t i = 0; i < operands.size(); ++i) {
    AmaxHistory& h = *operands[i].h;
    if (!h.initialized) continue;
    // Roll newest-first: history = [amax, history[0], ..., history[L-2]].
    const int64_t L = h.history.size(0);
    if (L > 1) h.history.narrow(0, 1, L - 1).copy_(h.history.narrow(0, 0, L - 1).clone());
    h.history.select(0, 0).copy_(stacked[i]);
    h.scale.copy_(scale_from_amax(at::amax(h.history), operands[i].dtype, operands[i].round_pow2));
    h.amax.zero_();
    h.synced = true;
  }
}

void discard_pending_amax(const std::vector<Float8LinearCompute*>& computes) {
  for (Float8LinearCompute* c : computes) {
    if (!c || !c->recipe().delayed) continue;
    Float8LinearState& s = c->state();
    for (AmaxHistory* h : {&s.input, &s.weight, &s.grad_output}) {
      if (!h->initialized) continue;
      if (h->synced)
        h->amax.zero_();
      else
        *h = AmaxHistory{};  // seeded by the skipped step: as before its first use
    }
  }
}

}  // namespace titan::float8
