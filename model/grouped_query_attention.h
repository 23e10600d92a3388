// model/grouped_query_attention.h — grouped-query attention (Llama 3's, Qwen3's): wq, wk, wv,
// wo, with n_kv_heads <= n_heads key/value heads shared by groups of query heads, optionally an
// RMSNorm on each head of q and k before RoPE (Qwen3's qk_norm), RoPE over interleaved pairs or
// over halves (rope_rotate_half); optionally without RoPE or within fixed chunks (Llama 4's iRoPE).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/attention_module.h"
#include "model/family.h"

namespace titan::model {

class GroupedQueryAttention final : public AttentionModule {
 public:
  GroupedQueryAttention(const std::string& prefix, const ModelArgs& args);
  at::Tensor forward(const at::Tensor& x, const RotaryTable& rope, const at::Tensor& documents) const override;
  void visit_params(const ParamVisitor& visit) override;
  std::vector<Linear*> linears() override;  // wq, wk, wv, wo
  // torchtitan's Llama plan: the input gathered once for wq/wk/wv (column-sharded: whole heads
  // per rank), wo row-sharded; the qk-norms are replicated weights over the local heads.
  std::vector<TpRule> tp_plan() const override;

  // From the arguments alone (no tensor): the parameters of one such attention (projections and
  // qk-norms), and its score and value products' training FLOPs per token when every query
  // meets seq_len keys (torchtitan's 12 * n_heads * head_dim * seq_len per layer).
  static int64_t param_count(const ModelArgs& args);
  static double score_flops_per_token(const ModelArgs& args, int64_t seq_len);
  // The sizes a TP degree must divide: the query and key/value heads.
  static std::vector<ShardedSize> tp_sharded_sizes(const ModelArgs& args);
  // What it keeps for its backward (Note [Attention activations] in model/family.h).
  static AttentionActivations activations(const ModelArgs& args, const AttentionActivationsQuery& where);

  int64_t n_heads, n_kv_heads, head_dim;
  Linear wq, wk, wv, wo;  // wq [H*hd, D], wk/wv [KV*hd, D], wo [D, H*hd]
  std::optional<RMSNorm> q_norm, k_norm;  // [head_dim] each, "<prefix>.q_norm.weight" (qk_norm)
  bool rope_rotate_half = false;           // ModelArgs::rope_rotate_half
  // Llama 4's iRoPE (set by its family per layer): a layer without RoPE (NoPE), and a layer whose
  // attention stays within chunks of the row (Family::attention_chunk; 0: none).
  bool use_rope = true;
  int64_t attention_chunk = 0;
  bool block_causal = false;               // ModelArgs::block_causal: attention within documents
};

}  // namespace titan::model
