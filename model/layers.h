// model/layers.h — the building blocks every family's blocks share: RMSNorm, the rotary
// tables, the dense SwiGLU feed-forward, and the hooks through which parallel/ changes how a
// module runs without the module knowing (a module's input gathered, its attention computed over
// context-parallel ranks).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/args.h"
#include "model/linear.h"
#include "model/sharding_plan.h"

namespace titan::model {

// A parameter on the meta device (shape only, float32): what every module starts with.
at::Tensor meta_tensor(at::IntArrayRef shape);
// linear.weight = a meta [out, in] tensor.
void make_linear_meta(Linear& linear);

using ParamVisitor = std::function<void(const std::string& fqn, at::Tensor& param)>;

struct RMSNorm {
  RMSNorm(std::string fqn, int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) const;  // [..., dim] -> [..., dim]
  void visit_params(const ParamVisitor& visit);

  std::string fqn;
  double eps;         // < 0: the input dtype's epsilon (torch.finfo(dtype).eps)
  at::Tensor weight;  // [dim]
};

// Rotary position embedding tables, computed once for max_seq_len positions.
struct RotaryTable {
  at::Tensor cos;  // [max_seq_len, head_dim / 2] float32
  at::Tensor sin;  // [max_seq_len, head_dim / 2] float32
};
// `scaling` (Llama 3.1's, see model/args.h) rescales the frequencies; the default is none.
RotaryTable make_rotary_table(int64_t head_dim, int64_t max_seq_len, double theta,
                              c10::Device device, const RopeScaling& scaling = {});
// The table of the given frequencies (one per rotated pair), angles in float64 stored as float32.
RotaryTable make_rotary_table(const std::vector<double>& frequencies, int64_t max_seq_len, c10::Device device);
// x: [B, S, H, head_dim]; rotates the pairs (x[2i], x[2i+1]) by position, as Meta's complex form.
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& table);
// The same rotations over the pairs (x[i], x[i + head_dim/2]) (HF's rotate_half; Qwen3).
at::Tensor apply_rotary_half(const at::Tensor& x, const RotaryTable& table);

// Transforms a module's input before its first linear (torchtitan's PrepareModuleInput):
// sequence parallel all-gathers the sequence shards here once for wq/wk/wv (or w1/w3), possibly
// already cast to float8 (See Note [Linear operands as data] in model/linear.h).
using ModuleInputHook = std::function<LinearOperand(const at::Tensor& x)>;

// Causal attention of the positions this rank holds: q [B, H, S, qk_hd], k [B, KV, S, qk_hd],
// v [B, KV, S, v_hd] -> [B, H, S, v_hd]; `documents` (defined under block-causal attention) holds
// the document of every position of the whole rows [B, S_row], also where this rank holds a share
// of them; `scale` of q . k, unset 1 / sqrt(qk_hd) (See Note [Attention head sizes and scale] in
// model/kernels/attention.h); `window` the keys a query sees, itself included (0: every earlier
// one), and `sinks` [H] a sink logit per head (undefined: none; Note [Attention sinks] in
// model/sink_attention.h). Context parallelism installs one that exchanges keys and values with
// the other ranks of its group (parallel/context_parallel/context_parallel.h); empty: the
// module's own attention over the local sequence.
using AttentionCompute =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& documents,
                             std::optional<double> scale, int64_t window, const at::Tensor& sinks)>;

// The dense SwiGLU feed-forward (torchtitan's FeedForward), "<prefix>.w1/w2/w3".
struct FeedForward {
  FeedForward(const std::string& prefix, int64_t dim, int64_t hidden_dim);
  at::Tensor forward(const at::Tensor& x) const;  // w2(silu(w1 x) * w3 x)
  void visit_params(const ParamVisitor& visit);
  std::vector<Linear*> linears();  // w1, w2, w3
  // torchtitan's plan: the input gathered once for w1/w3 (column-sharded), w2 row-sharded.
  std::vector<TpRule> tp_plan() const;
  // The parameters of a FeedForward of this shape (no tensor).
  static int64_t param_count(int64_t dim, int64_t hidden_dim) { return 3 * dim * hidden_dim; }

  std::string prefix;
  Linear w1, w2, w3;  // w1/w3 [hidden, D], w2 [D, hidden]
  ModuleInputHook prepare_input;  // empty: identity
};

}  // namespace titan::model
