// float8/float8_linear.h — the float8 LinearCompute: the three GEMMs of a linear in float8.
//
// Forward   output      = x @ W^T   (x per row, W^T per column = W per row)
// Backward  grad_input  = G @ W     (G per row, W per column)
//           grad_weight = G^T @ x   (G^T per row = G per column, x per column)
// (docs/float8.md, "Recipes"; the granularity of each operand comes from the recipe.) One
// autograd function does all three, saving the HIGH-precision x and W and re-casting them in
// backward, as torchao does: float8 copies cast for the forward would be laid out and
// scaled for the wrong contraction dimension in backward anyway.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "float8/gemm.h"
#include "float8/recipe.h"
#include "float8/scaling.h"
#include "model/linear.h"

namespace titan::float8 {

// Note [Delayed scaling]:
// With a delayed recipe every operand (input, weight, grad_output) of a linear casts with the
// scale derived from the max of its amax HISTORY instead of its current amax. Each cast records
// max|x| into `amax` (max over every call since the last sync, so gradient accumulation sees
// the step's true amax). Once per step, after backward, sync_amax_history() reduces all those
// amaxes across ranks in ONE collective, pushes them into the histories (newest at index 0)
// and recomputes the scales. The first use of an operand (no history yet) scales dynamically
// from its current amax and seeds history[0] with it, so step 1 never casts with a blind scale.
struct AmaxHistory {
  at::Tensor amax;      // [] float32: max|x| since the last sync
  at::Tensor history;   // [amax_history_len] float32: newest first
  at::Tensor scale;     // [] float32: scale_from_amax(max(history)), used until the next sync
  bool initialized = false;
  bool synced = false;  // a sync (or a loaded checkpoint) has pushed into the history
};

// Note [Scales under TP]: an operand sharded over the TP group (a column- or row-parallel
// weight, a row-parallel linear's input, a column-parallel linear's output gradient) takes its
// amax over the whole group whenever the amax reduces over the sharded dimension: always for
// tensorwise (one scalar all_reduce(MAX) per cast, as torchao's DTensor path does), and for
// axiswise scales whose reduction runs along that dimension (a vector all_reduce). So a TP
// run casts exactly what one process casts. Sharded dimension of the 2-D operand: 0 = rows
// (the first), 1 = columns (the last); -1 = not sharded.
struct TpSharding {
  std::function<void(at::Tensor&)> amax_max;  // all_reduce(MAX) over the TP group; empty: no TP
  int input_dim = -1, weight_dim = -1, grad_output_dim = -1;
};

// Note [Float8 operands from the producer] (See Note [Linear operands as data] in
// model/linear.h): with a tensorwise dynamic recipe a linear may be handed
//   - its weight already cast: FSDP all-gathered float8 bytes cast with the global tensorwise
//     scale (float8.enable_fsdp_float8_all_gather). Both the output and the grad_input GEMM use
//     it (one tensorwise cast serves both); the forward saves it for the backward. It is a view
//     of FSDP's gathered buffer, which FSDP frees at reshard and refills with the same bytes
//     when it re-gathers for backward, so saving it holds no memory between the two;
//   - its input already cast: tensor parallel cast the module's sequence shards with the global
//     amax's scale and all-gathered the bytes (float8.tp_input_all_gather; torchtitan's
//     PrepareFloat8ModuleInput). wq/wk/wv (w1/w3) receive the same value and save it (1 byte
//     per element, one tensor for all of them) for the grad_weight GEMM, where a tensorwise
//     recipe casts x with that same scale.
// Casting the gathered high-precision tensor gives the same bytes, so both change traffic and
// memory, not numerics.

// Everything the autograd function needs; shared (by reference count) between the compute
// object and every autograd graph built through it, so a graph outlives a set_compute() swap.
class Float8LinearState : public torch::CustomClassHolder {
 public:
  Float8Recipe recipe;
  bool emulate = false;
  GemmBackend backend = GemmBackend::Auto;
  TpSharding tp;                           // See Note [Scales under TP]
  AmaxHistory input, weight, grad_output;  // used only when recipe.delayed
};

class Float8LinearCompute final : public titan::model::LinearCompute {
 public:
  // `tp`: how this linear is sharded over a tensor-parallel group (See Note [Scales under TP]);
  // tensor parallel builds its float8 linears with it, so it is fixed for the compute's life.
  explicit Float8LinearCompute(Float8Recipe recipe, bool emulate = false,
                               GemmBackend backend = GemmBackend::Auto, TpSharding tp = {});

  // input [..., K] (any rank >= 1), weight [N, K] -> [..., N] in input's dtype. Either operand
  // may arrive already cast (See Note [Float8 operands from the producer]).
  at::Tensor forward(const titan::model::LinearOperand& input,
                     const titan::model::LinearOperand& weight) override;
  std::string describe() const override;  // "float8[rowwise]", "float8[tensorwise,emulated]"

  const Float8Recipe& recipe() const { return state_->recipe; }
  bool emulate() const { return state_->emulate; }
  GemmBackend backend() const { return state_->backend; }
  // Whether a producer may hand this linear its input / weight cast to float8 with one
  // tensorwise dynamic scale of dtype `dtype` (what the plan checks before building one).
  bool accepts_float8_input(at::ScalarType dtype) const;
  // Whether its input may arrive cast per row (scale [..., 1], power-of-2 e4m3: what the axiswise
  // output GEMM casts) together with its high-precision values (float8 token dispatch).
  bool accepts_float8_row_input(at::ScalarType dtype) const;
  bool accepts_float8_weight(at::ScalarType dtype) const;
  // Delayed-scaling buffers (See Note [Delayed scaling]); undefined tensors until first use.
  Float8LinearState& state() { return *state_; }
  const Float8LinearState& state() const { return *state_; }

 private:
  c10::intrusive_ptr<Float8LinearState> state_;
};

// The float8 computes at the bottom of `linears`' compute chains (model::innermost).
std::vector<Float8LinearCompute*> float8_computes(
    const std::vector<titan::model::Linear*>& linears);

// Once per step, after backward: See Note [Delayed scaling]. Stacks the current amax of every
// operand of every delayed compute into one float32 tensor, calls `all_reduce_max` on it ONCE
// (the distributed code passes a MAX all-reduce; empty = single process = identity), then
// pushes each reduced amax into its history, recomputes the scale from the history's max and
// clears the amax. Non-delayed computes are ignored; so are operands never used yet (their
// amax still travels in the collective so every rank stacks the same layout).
void sync_amax_history(const std::vector<Float8LinearCompute*>& computes,
                       const std::function<void(at::Tensor&)>& all_reduce_max = {});

// A skipped step's end (Note [Non-finite steps] in trainer/nonfinite_step.cpp), instead of the
// sync: every delayed operand's amax recorded since the last sync is dropped, and an operand
// first used in the skipped step is unused again (its history was seeded from that step), so the
// next step casts as if the skipped one had not run. No collective: every rank skips alike.
void discard_pending_amax(const std::vector<Float8LinearCompute*>& computes);

}  // namespace titan::float8
