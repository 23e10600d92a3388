// model/moe/moe.h — the mixture-of-experts feed-forward layer, with torchtitan 0.2.2's semantics
// (torchtitan/models/moe/moe.py): a token-choice top-k router, the tokens reordered by expert,
// SwiGLU experts over their token groups, optional shared experts, and auxiliary-loss-free load
// balancing by a per-expert bias. Shared by the MoE model families (Qwen3-MoE first).
//
// Note [MoE forward]: for x [B, S, D] flattened to N tokens,
//   1. router: scores = gate(x) [N, E] (a Linear; bias only with gate_bias), in float32
//      sigmoid or softmax over the experts;
//   2. choice: top_k experts of scores + expert_bias (the bias only chooses, it never weighs),
//      after group-limited routing when num_expert_groups is set (each group scored by the sum of
//      its two best experts; all but the best num_limited_groups groups masked to -inf);
//      debug force-load-balance replaces the choice by round robin (token * top_k + j) % E;
//   3. weights: the UNBIASED scores of the chosen experts, divided by their sum (+1e-20) with
//      route_norm, times route_scale;
//   4. counts: a histogram of the choices, added to tokens_per_expert (the load balancing input);
//   5. reorder: the N * top_k (token, choice) pairs sorted by expert, stably; the rows gathered;
//      with score_before_experts the rows are multiplied by their weight in float32 first;
//   6. experts: the family's routed experts (model/moe/experts.h) over each expert's contiguous
//      rows: w2[e] (silu(w1[e] x) * w3[e] x) for the SwiGLU experts;
//   7. combine: rows scattered back to [N, top_k, D]; a sum over the choices (weights already
//      applied) or a float32 weighted sum (score after experts); plus the shared experts, one
//      SwiGLU of hidden * num_shared_experts, when there are any.
//
// Note [Aux-loss-free load balancing]: once per optimizer step, after every micro-batch, each
// MoE layer's tokens_per_expert (summed over the ranks that see different tokens) moves its
// bias: delta = coeff * sign(mean(counts) - counts); delta -= mean(delta); expert_bias += delta;
// counts zeroed. An under-loaded expert's bias rises, so the top-k choice drifts toward it.
// coeff is model.load_balance_coeff (default 1e-3); at 0 the bias stays zero and the counts are
// still summed for the metrics. expert_bias is saved in checkpoints; tokens_per_expert is not.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/layers.h"
#include "model/linear.h"
#include "model/moe/experts.h"
#include "model/moe/moe_args.h"

namespace titan::model::moe {

// Throws std::invalid_argument naming the field, the value and what is allowed (top_k > experts,
// groups that do not divide the experts, a limit without groups, an unknown score_func, ...).
void check_moe_args(const MoEArgs& args);

// The router's decision for N tokens (steps 1-4 of Note [MoE forward]).
struct Routing {
  at::Tensor top_scores;         // [N, top_k] float32: each choice's weight
  at::Tensor selected_experts;   // [N, top_k] int64
  at::Tensor tokens_per_expert;  // [E] float32: the histogram of selected_experts
};
// scores_logits [N, E] (the gate's output, any float dtype); expert_bias [E] float32 or undefined.
Routing route(const at::Tensor& scores_logits, const at::Tensor& expert_bias, const MoEArgs& args);

// Note [Low-precision experts]: the experts' three projections may each multiply through a
// LinearCompute (float8 rowwise, blockwise, MXFP8: float8/grouped_experts.h installs them by
// quantize.grouped_mm.*), applied to every expert's token group with that expert's weight as a
// dense linear of its own: x_e [rows_e, D] against w1[e] [H, D], w3[e], and w2[e] [D, H]. So
// every scale of a group is computed from that group alone: per row for the activations, per
// expert for the weights, and, in the weight gradient G_e^T x_e, per column over the group's own
// tokens (torchao's per-group colwise scales; an MX or blockwise tile of tokens starts at the
// group's first row). That is what torchtitan's token-group alignment (set_token_group_alignment_
// size_m: every group padded with zero rows to a multiple of 16 for float8, 32 for MX) gives
// torchao's grouped GEMMs: zero rows change no amax, so no scale or block spans two experts.
// titan pads a group only where its compute needs whole blocks of tokens (MX's weight gradient
// contracts over the tokens in blocks of 32: `group_alignment`), with zero rows as torchtitan does;
// otherwise a group of any size, an empty one included (skipped, its weight gradient zero), is
// quantized as itself. Undefined computes: the high-precision experts.
struct ExpertComputes {
  std::shared_ptr<LinearCompute> w1, w2, w3;  // gate, down, up; all set or none
  int64_t group_alignment = 1;  // each group's rows padded with zero rows to a multiple of this
  // Expert parallelism sends the routed rows cast to float8 per row, which w1 and w3 read as their
  // input cast (Note [Float8 dispatch] in parallel/expert_parallel/expert_parallel.h).
  bool float8_dispatch = false;
  bool defined() const { return w1 != nullptr; }
  std::string describe() const;  // "float8[rowwise]", "mxfp8_cublas_rceil"; "hp" when undefined
};

// One projection of every expert over its group: x [T, K] sorted by expert with counts[e] rows for
// expert e, w [E, N, K] -> [T, N], each group times its expert's w[e]^T through `compute` (a dense
// linear's; Note [Low-precision experts]), a group padded with zero rows to a multiple of
// `alignment` for the product and cut back after it. Empty groups are skipped (their w[e]
// gradient is zero).
// `x_cast` (may be undefined): x already cast to float8 per row (data [T, K], scale [T, 1]), handed
// to each group's product as its input cast (alignment 1 only).
at::Tensor grouped_linear(const at::Tensor& x, const at::Tensor& w, const std::vector<int64_t>& counts,
                          LinearCompute& compute, int64_t alignment = 1, const QuantizedOperand& x_cast = {});

// One projection of every expert in high precision: x [T, K] sorted by expert (counts[e] rows for
// expert e), w [E, N, K] -> [T, N], each group times its expert's w[e]^T. CUDA in bfloat16:
// LibTorch's grouped GEMM, one kernel (Note [Grouped GEMM] in moe.cpp); else one matmul per
// non-empty group. Differentiable in x and w (an empty group's w[e] gradient is zero).
at::Tensor grouped_projection(const at::Tensor& x, const at::Tensor& w, const std::vector<int64_t>& counts);

// The experts over rows sorted by expert (step 6): x [T, D] whose first counts[0] rows go to
// expert 0, the next counts[1] to expert 1, ...; w1, w3 [E, H, D], w2 [E, D, H] -> [T, D].
// Differentiable in x and the weights. With `computes` defined, each expert's projections through
// them (Note [Low-precision experts]). Otherwise CUDA in bfloat16: LibTorch's grouped GEMM, one
// kernel per projection (Note [Grouped GEMM] in moe.cpp); else one matmul chain per expert.
// `x_cast`: x cast per row, for the gate and up projections (float8 dispatch; computes defined).
at::Tensor grouped_experts(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3,
                           const std::vector<int64_t>& counts, const ExpertComputes& computes = {},
                           const QuantizedOperand& x_cast = {});

// Note [Counted tokens]: tokens_per_expert is the load-balancing input of the training step, so
// only a training forward counts. A forward under UncountedForward adds nothing: validation (its
// tokens are not the step's) and activation checkpointing's recompute in backward (which would
// count a block's tokens twice; torchtitan halves the counts of fully checkpointed blocks
// instead, which per-op AC and partial AC leave wrong). Thread-local and nestable.
class UncountedForward {
 public:
  UncountedForward();
  ~UncountedForward();
  UncountedForward(const UncountedForward&) = delete;
  UncountedForward& operator=(const UncountedForward&) = delete;
  static bool active();
};

// Note [Aux-loss-free load balancing]'s update of one layer, in place: expert_bias [E] float32,
// tokens_per_expert [E] (already summed over the ranks).
void update_expert_bias(at::Tensor& expert_bias, const at::Tensor& tokens_per_expert, double coeff);

// The experts of one layer over rows sorted by expert: expert parallelism installs one that sends
// the rows to the ranks holding their experts and runs `experts` (this rank's) there
// (parallel/expert_parallel/expert_parallel.h); empty: `experts` on this rank.
// `while_combining` is the layer's work that does not need the routed rows (the shared experts):
// it must be called exactly once, and an implementation that sends the rows back asynchronously
// calls it while they travel.
using ExpertsCompute = std::function<at::Tensor(const at::Tensor& rows, const std::vector<int64_t>& counts,
                                                const RoutedExperts& experts, const ExpertComputes& computes,
                                                const std::function<void()>& while_combining)>;

// One MoE layer. Parameters ("<prefix>.router.gate.weight", the experts' "<prefix>.experts.w1", ...,
// "<prefix>.shared_experts.w1.weight", ...) and the buffer "<prefix>.expert_bias" are torchtitan's
// names; tensors start on the meta device as the model's do.
struct MoE {
  // `routed`: the family's experts under "<prefix>.experts" (null: SwiGLU experts of hidden_dim).
  MoE(const std::string& prefix, const MoEArgs& args, int64_t dim, int64_t hidden_dim,
      std::unique_ptr<RoutedExperts> routed = nullptr);
  // x [B, S, D] -> [B, S, D] (See Note [MoE forward]); adds this forward's counts to
  // tokens_per_expert (no gradient).
  at::Tensor forward(const at::Tensor& x_in);
  // Every parameter with its fully-qualified name (the experts' stacked weights as parameters).
  void visit_params(const std::function<void(const std::string& fqn, at::Tensor& param)>& visit);
  // The router's gate and the shared experts' linears (the routed experts are stacked tensors).
  std::vector<Linear*> linears();
  // Its tensor-parallel rules with the experts sharded on their hidden dimension (every rule's
  // experts_sharded set: a layout running EP over the TP ranks skips them).
  std::vector<TpRule> tp_plan() const;
  // The routed experts' stacked parameters ("<prefix>.experts.w1", ...): what expert
  // parallelism shards along their first (expert) dimension.
  std::vector<std::string> expert_params() const;

  std::string prefix;
  MoEArgs args;
  int64_t dim, hidden_dim;
  Linear gate;                        // [E, D] (+ gate_bias: [E])
  at::Tensor gate_bias;               // [E] or undefined
  std::unique_ptr<RoutedExperts> experts;  // "<prefix>.experts.*" (See Note [Stacked expert parameters])
  std::optional<Linear> shared_w1, shared_w2, shared_w3;  // shared experts: hidden * num_shared
  at::Tensor expert_bias;             // [E] float32 (load balancing on), else undefined
  at::Tensor tokens_per_expert;       // [E] float32, summed over forwards until the bias update
  ExpertsCompute experts_compute;     // empty: experts->forward (which then holds every expert)
  ExpertComputes expert_computes;     // the experts' low-precision products; undefined: high precision
  // Tensor parallelism installs these when the layer runs on the whole sequence: the input's
  // sequence shards gathered before the router, the partial output reduce-scattered back
  // (torchtitan's PrepareModuleInputOutput on "moe"). Empty: identity.
  std::function<at::Tensor(const at::Tensor&)> gather_input, reduce_output;
};

}  // namespace titan::model::moe
