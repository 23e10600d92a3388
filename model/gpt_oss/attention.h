// model/gpt_oss/attention.h — gpt-oss's attention (torchtitan 0.2.2's gpt_oss Attention):
// grouped-query heads of head_dim with biased q, k, v and output projections, rotate-half RoPE
// with YaRN's frequencies (its concentration mscale on both q's and k's tables, so the softmax
// scale is mscale^2 / sqrt(head_dim)), a learned sink per head, and on the even blocks a sliding
// window (model/sink_attention.h).
#pragma once

#include <string>
#include <vector>

#include "model/attention_module.h"
#include "model/family.h"

namespace titan::model::gpt_oss {

class GptOssAttention final : public AttentionModule {
 public:
  GptOssAttention(const std::string& prefix, const ModelArgs& args, int64_t layer);
  at::Tensor forward(const at::Tensor& x, const RotaryTable& rope, const at::Tensor& documents) const override;
  void visit_params(const ParamVisitor& visit) override;  // wq, wk, wv, wo (weight, bias each), sinks
  std::vector<Linear*> linears() override;                // wq, wk, wv, wo
  // torchtitan's gpt-oss plan: wq/wk/wv column-sharded (whole heads per rank, their biases and the
  // sinks sharded alike), wo row-sharded (its bias replicated, added after the reduce).
  std::vector<TpRule> tp_plan() const override;

  // From the arguments alone: the parameters of one such attention.
  static int64_t param_count(const ModelArgs& args);

  int64_t head_dim;
  int64_t window;  // this block's sliding window (0: none)
  bool block_causal;
  double softmax_scale;
  Linear wq, wk, wv, wo;
  at::Tensor wq_bias, wk_bias, wv_bias, wo_bias;  // "<prefix>.wq.bias", ...
  at::Tensor sinks;                               // [n_heads] "<prefix>.sinks"
};

}  // namespace titan::model::gpt_oss
