// model/deepseek_v3/latent_attention.h — multi-head latent attention (DeepSeek-V2/V3; torchtitan
// 0.2.2's deepseek_v3 Attention):
//   q = wq x                 or  q = wq_b(q_norm(wq_a x))           (q_lora_rank > 0)
//   [c_kv, k_pe] = wkv_a x,      [k_nope, v] = wkv_b(kv_norm(c_kv)) per head
//   q = [q_nope, rope(q_pe)],    k = [k_nope, rope(k_pe)]  (k_pe: one head, shared by all)
//   out = wo(softmax(q k^T * scale) v)
// with qk heads of qk_nope + qk_rope and v heads of v_head_dim (they differ), RoPE over
// interleaved pairs of the rope part only, and the softmax scale of DeepSeekV3Args.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/attention_module.h"
#include "model/family.h"
#include "model/deepseek_v3/args.h"

namespace titan::model::deepseek_v3 {

class LatentAttention final : public AttentionModule {
 public:
  LatentAttention(const std::string& prefix, const ModelArgs& args);
  at::Tensor forward(const at::Tensor& x, const RotaryTable& rope, const at::Tensor& documents) const override;
  void visit_params(const ParamVisitor& visit) override;
  std::vector<Linear*> linears() override;  // wq | wq_a, wq_b; wkv_a, wkv_b, wo
  // torchtitan's parallelize_deepseekv3: the input gathered once for its readers (wq or wq_a,
  // and wkv_a); wq / wq_b and wkv_b column-sharded (whole heads per rank), wo row-sharded; the
  // low-rank projections wq_a, wkv_a and their norms replicated (their gradients summed over TP).
  std::vector<TpRule> tp_plan() const override;

  // From the arguments alone: one such attention's parameters, and its score and value
  // products' training FLOPs per token when every query meets seq_len keys.
  static int64_t param_count(const ModelArgs& args);
  static double score_flops_per_token(const ModelArgs& args, int64_t seq_len);
  // What it keeps for its backward (Note [Attention activations] in model/family.h).
  static AttentionActivations activations(const ModelArgs& args, const AttentionActivationsQuery& where);

  DeepSeekV3Args mla;
  double softmax_scale;
  std::optional<Linear> wq;                // [H * qk_head, D]            (q_lora_rank 0)
  std::optional<Linear> wq_a, wq_b;        // [q_lora, D], [H * qk_head, q_lora]
  std::optional<RMSNorm> q_norm;           // [q_lora]
  Linear wkv_a;                            // [kv_lora + qk_rope, D]
  RMSNorm kv_norm;                         // [kv_lora]
  Linear wkv_b;                            // [H * (qk_nope + v), kv_lora]
  Linear wo;                               // [D, H * v]
};

}  // namespace titan::model::deepseek_v3
