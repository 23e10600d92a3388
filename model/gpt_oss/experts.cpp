// model/gpt_oss/experts.cpp — see experts.h.
#include "model/gpt_oss/experts.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>

#include "model/moe/moe.h"

namespace titan::model::gpt_oss {

at::Tensor clamped_swiglu(const at::Tensor& h, double limit, double alpha) {
  const int64_t width = h.size(-1);
  TORCH_CHECK(width % 2 == 0, "clamped swiglu: ", width, " columns cannot hold gate/linear pairs");
  const at::Tensor glu = h.slice(-1, 0, width, 2).clamp_max(limit);
  const at::Tensor linear = h.slice(-1, 1, width, 2).clamp(-limit, limit);
  return glu * (glu * alpha).sigmoid() * (linear + 1);
}

GptOssExperts::GptOssExperts(const std::string& prefix_, int64_t E, int64_t dim, int64_t hidden, double limit)
    : RoutedExperts(prefix_),
      swiglu_limit(limit),
      mlp1_weight(meta_tensor({E, 2 * hidden, dim})),
      mlp1_bias(meta_tensor({E, 2 * hidden})),
      mlp2_weight(meta_tensor({E, dim, hidden})),
      mlp2_bias(meta_tensor({E, dim})) {}

void GptOssExperts::visit_params(const ParamVisitor& visit) {
  visit(prefix + ".mlp1_weight", mlp1_weight);
  visit(prefix + ".mlp1_bias", mlp1_bias);
  visit(prefix + ".mlp2_weight", mlp2_weight);
  visit(prefix + ".mlp2_bias", mlp2_bias);
}

std::vector<TpRule> GptOssExperts::tp_plan() const {
  return {{prefix + ".mlp1_weight", TpStyle::kShardTensor, {}, 1},
          {prefix + ".mlp1_bias", TpStyle::kShardTensor, {}, 1},
          {prefix + ".mlp2_weight", TpStyle::kShardTensor, {}, 2}};
}

at::Tensor GptOssExperts::forward(const at::Tensor& rows, const std::vector<int64_t>& counts,
                                  const moe::ExpertComputes& computes, const QuantizedOperand& x_cast) const {
  TORCH_CHECK(static_cast<int64_t>(counts.size()) == local_experts(), "gpt-oss experts ", prefix, ": ", counts.size(),
              " group sizes for ", local_experts(), " experts");
  // Each row's expert, to add that expert's biases.
  const at::Tensor expert_of_row = at::repeat_interleave(
      at::arange(local_experts(), rows.options().dtype(at::kLong)), at::tensor(counts, at::kLong).to(rows.device()));
  const auto dt = rows.scalar_type();
  const at::Tensor b1 = mlp1_bias.to(dt).index_select(0, expert_of_row);
  at::Tensor b2 = mlp2_bias.to(dt).index_select(0, expert_of_row);
  if (output_summed_over > 1) b2 = b2 / static_cast<double>(output_summed_over);  // See RoutedExperts
  if (computes.defined()) {  // See Note [Low-precision experts] in model/moe/moe.h
    const int64_t a = computes.group_alignment;
    const at::Tensor h = moe::grouped_linear(rows, mlp1_weight, counts, *computes.w1, a, x_cast) + b1;
    return moe::grouped_linear(clamped_swiglu(h, swiglu_limit), mlp2_weight, counts, *computes.w2, a) + b2;
  }
  const at::Tensor h = moe::grouped_projection(rows, mlp1_weight, counts) + b1;  // [T, 2H]
  return moe::grouped_projection(clamped_swiglu(h, swiglu_limit), mlp2_weight, counts) + b2;  // [T, D]
}

}  // namespace titan::model::gpt_oss
