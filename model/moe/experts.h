// model/moe/experts.h — the routed experts of an MoE layer: their stacked parameters and the
// arithmetic over rows sorted by expert, which a family declares (Family::make_experts). The
// MoE layer (moe.h), expert parallelism and tensor parallelism see only this interface, so a
// family whose experts compute differently (gpt-oss's biased, clamped SwiGLU over an interleaved
// projection) adds its own class in its folder and nothing outside it changes.
//
// Note [Stacked expert parameters]: every parameter of the routed experts is one tensor [E, ...],
// expert e's slice first: expert parallelism shards each along dim 0 (this rank's experts), FSDP
// as any parameter, tensor parallelism along the dims their tp_plan() names (the hidden dim: the
// layer's output is then a partial sum over the TP ranks, reduced by the layer).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/layers.h"
#include "model/linear.h"
#include "model/sharding_plan.h"

namespace titan::model::moe {

struct ExpertComputes;  // moe.h

class RoutedExperts {
 public:
  explicit RoutedExperts(std::string prefix) : prefix(std::move(prefix)) {}
  virtual ~RoutedExperts() = default;
  RoutedExperts(const RoutedExperts&) = delete;
  RoutedExperts& operator=(const RoutedExperts&) = delete;

  // Every stacked parameter ("<prefix>.w1", ...) in torchtitan's order.
  virtual void visit_params(const ParamVisitor& visit) = 0;
  // Their names, in that order (what visit_params visits).
  std::vector<std::string> param_names() const;
  // The rules that shard them on their hidden dimension (kShardTensor; See Note [Stacked expert
  // parameters]).
  virtual std::vector<TpRule> tp_plan() const = 0;
  // rows [T, D] sorted by expert, counts[e] rows for this rank's expert e (every expert without
  // expert parallelism) -> [T, D]. Differentiable in the rows and the parameters. `computes`:
  // the low-precision products (Note [Low-precision experts] in moe.h; undefined: high
  // precision); `x_cast`: the rows already cast per row (float8 dispatch), for the projections
  // that read them.
  virtual at::Tensor forward(const at::Tensor& rows, const std::vector<int64_t>& counts,
                             const ExpertComputes& computes, const QuantizedOperand& x_cast) const = 0;
  // The experts this rank holds: the leading dim of its (possibly expert-sharded) tensors.
  virtual int64_t local_experts() const = 0;

  std::string prefix;  // "layers.<i>.moe.experts"
  // Under tensor parallelism with the hidden dim sharded, the layer's output is summed over this
  // many ranks: a term each rank adds whole (an output bias) is divided by it, so the sum holds it
  // once; its gradient is then 1/n on each rank, and the TP-replicated weights' gradient sum over
  // the group restores it (torchtitan's ScaleBiasForward: the same result).
  int64_t output_summed_over = 1;
};

// The SwiGLU experts every family but gpt-oss has (torchtitan's GroupedExperts): "<prefix>.w1",
// "w2", "w3" — [E, H, D], [E, D, H], [E, H, D]; expert e: w2[e] (silu(w1[e] x) * w3[e] x)
// (grouped_experts in moe.h).
class SwiGluExperts final : public RoutedExperts {
 public:
  SwiGluExperts(const std::string& prefix, int64_t num_experts, int64_t dim, int64_t hidden_dim);
  void visit_params(const ParamVisitor& visit) override;
  std::vector<TpRule> tp_plan() const override;
  at::Tensor forward(const at::Tensor& rows, const std::vector<int64_t>& counts, const ExpertComputes& computes,
                     const QuantizedOperand& x_cast) const override;
  int64_t local_experts() const override { return w1.size(0); }

  at::Tensor w1, w2, w3;
};

}  // namespace titan::model::moe
