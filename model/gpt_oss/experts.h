// model/gpt_oss/experts.h — gpt-oss's routed experts (torchtitan 0.2.2's GptOssGroupedExperts):
// one biased input projection mlp1 [E, 2H, D] whose even output rows are the gate and odd rows the
// linear half, a clamped SwiGLU between them, and a biased output projection mlp2 [E, D, H]:
//   h = x mlp1[e]^T + b1[e];  g = min(h[0::2], limit);  l = clamp(h[1::2], -limit, limit)
//   y = (g sigmoid(1.702 g) (l + 1)) mlp2[e]^T + b2[e]
// (the +1 on the linear half and alpha 1.702 are gpt-oss's). Low-precision experts: mlp1 through
// the gate projection's compute (it reads the rows, as w1 does), mlp2 through the down projection's.
// Under tensor parallelism the hidden dim is sharded (mlp1's rows and b1 along dim 1 — contiguous
// shards keep each gate/linear pair together — mlp2 along dim 2), and b2, which every rank adds
// whole, is divided by the ranks the output is summed over (RoutedExperts::output_summed_over).
#pragma once

#include <string>
#include <vector>

#include "model/moe/experts.h"

namespace titan::model::gpt_oss {

class GptOssExperts final : public moe::RoutedExperts {
 public:
  GptOssExperts(const std::string& prefix, int64_t num_experts, int64_t dim, int64_t hidden_dim, double swiglu_limit);
  void visit_params(const ParamVisitor& visit) override;
  std::vector<TpRule> tp_plan() const override;
  at::Tensor forward(const at::Tensor& rows, const std::vector<int64_t>& counts, const moe::ExpertComputes& computes,
                     const QuantizedOperand& x_cast) const override;
  int64_t local_experts() const override { return mlp1_weight.size(0); }
  static int64_t expert_param_count(int64_t dim, int64_t hidden_dim) { return 3 * dim * hidden_dim + 2 * hidden_dim + dim; }

  double swiglu_limit;
  at::Tensor mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias;  // [E, 2H, D], [E, 2H], [E, D, H], [E, D]
};

// The clamped SwiGLU over h [..., 2H] (gate and linear interleaved) -> [..., H], torchtitan's swiglu.
at::Tensor clamped_swiglu(const at::Tensor& h, double limit, double alpha = 1.702);

}  // namespace titan::model::gpt_oss
