// float8/float8_linear.h — the float8 LinearCompute: the three GEMMs of a linear in float8.
//
// Forward   output      = x @ W^T   (x per row, W^T per column = W per row)
// Backward  grad_input  = G @ W     (G per row, W per column)
//           grad_weight = G^T @ x   (G^T per row = G per column, x per column)
// (FLOAT8.md "The three GEMMs"; the granularity of each operand comes from the recipe.) One
// autograd function does all three, saving the HIGH-precision x and W and re-casting them in
// backward, as the reference does: float8 copies cast for the forward would be laid out and
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
};

// Note [Float8 input from a TP all-gather]: under tensor parallel with a tensorwise dynamic
// recipe, attention's and feed_forward's sequence-sharded input is cast to float8 with the scale
// of its global amax (one MAX all-reduce over TP) and gathered as bytes (parallel/
// tensor_parallel.h make_float8_sequence_gather; torchtitan's PrepareFloat8ModuleInput). The
// gather gives the module a storage-less proxy of the gathered input for autograd; the linears
// reading it (wq, wk, wv; w1, w3) find the float8 input here, use it for the output GEMM, and save
// it (1 byte per element, one tensor for all of them) for the grad_weight GEMM, where a
// tensorwise recipe casts x with the same global scale. Casting the gathered high-precision input
// gives the same bytes, so this changes traffic and memory, not numerics.
struct Float8InputHandoff {
  CastConfig cast;                  // the readers' input cast (tensorwise), set by use_input_from
  bool round_scales_to_power_of_2 = false;
  at::Tensor proxy;      // [B, S, K]: what the module's linears receive; no storage
  Float8Tensor input;    // [B, S, K] float8, scale []
  int consumers = 0;     // linears registered with use_input_from
  int remaining = 0;     // reads left before the handoff lets go of this gather
};

// Everything the autograd function needs; shared (by reference count) between the compute
// object and every autograd graph built through it, so a graph outlives a set_compute() swap.
class Float8LinearState : public torch::CustomClassHolder {
 public:
  Float8Recipe recipe;
  bool emulate = false;
  GemmBackend backend = GemmBackend::Auto;
  AmaxHistory input, weight, grad_output;  // used only when recipe.delayed
  // Note [Float8 weight from FSDP]: with float8.enable_fsdp_float8_all_gather the weight
  // arrives already cast (FSDP gathers float8 bytes with a global tensorwise scale; Note [FSDP
  // float8 all-gather] in parallel/fsdp.h). Both the output and the grad_input GEMM use it; the
  // high-precision weight argument is then only autograd's handle for grad_weight. FSDP
  // re-publishes it when it re-gathers for backward and clears it when it reshards.
  bool weight_from_fsdp = false;
  Float8Tensor fsdp_weight;  // [N, K] e4m3 + scale [] while FSDP holds the group unsharded
  std::shared_ptr<Float8InputHandoff> input_handoff;  // See Note [Float8 input from a TP all-gather]
  // Note [Scales under TP]: an operand sharded over the TP group (a column- or row-parallel
  // weight, a row-parallel linear's input, a column-parallel linear's output gradient) takes its
  // amax over the whole group whenever the amax reduces over the sharded dimension: always for
  // tensorwise (one scalar all_reduce(MAX) per cast, as torchao's DTensor path does), and for
  // axiswise scales whose reduction runs along that dimension (a vector all_reduce). So a TP
  // run casts exactly what one process casts. Sharded dimension of the 2-D operand: 0 = rows
  // (the first), 1 = columns (the last); -1 = not sharded.
  std::function<void(at::Tensor&)> tp_amax_max;  // empty: not under TP
  int tp_sharded_dim_input = -1, tp_sharded_dim_weight = -1, tp_sharded_dim_grad_output = -1;
};

class Float8LinearCompute final : public titan::model::LinearCompute {
 public:
  explicit Float8LinearCompute(Float8Recipe recipe, bool emulate = false,
                               GemmBackend backend = GemmBackend::Auto);

  // input [..., K] (any rank >= 1), weight [N, K] -> [..., N] in input's dtype.
  at::Tensor forward(const at::Tensor& input, const at::Tensor& weight) override;
  std::string describe() const override;  // "float8[rowwise]", "float8[tensorwise,emulated]"

  // See Note [Float8 weight from FSDP]. Tensorwise dynamic recipes only (validated earlier).
  void use_weight_from_fsdp();
  // Undefined tensors clear it (FSDP resharded).
  void set_fsdp_weight(const at::Tensor& data, const at::Tensor& scale);
  // See Note [Scales under TP]: `amax_max` all-reduces (MAX) over the TP group; the dims say
  // along which dimension (0 first, 1 last, -1 none) this linear holds only a TP shard of each
  // operand.
  void set_tp_sharding(std::function<void(at::Tensor&)> amax_max, int input_dim, int weight_dim,
                       int grad_output_dim);
  // See Note [Float8 input from a TP all-gather]. Tensorwise dynamic recipes only.
  void use_input_from(std::shared_ptr<Float8InputHandoff> handoff);

  const Float8Recipe& recipe() const { return state_->recipe; }
  bool emulate() const { return state_->emulate; }
  // Delayed-scaling buffers (See Note [Delayed scaling]); undefined tensors until first use.
  Float8LinearState& state() { return *state_; }
  const Float8LinearState& state() const { return *state_; }

 private:
  c10::intrusive_ptr<Float8LinearState> state_;
};

// The float8 computes among `linears` (those convert_to_float8_training installed).
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

}  // namespace titan::float8
