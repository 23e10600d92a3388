// model/qwen3/family.cpp — Qwen3's dense flavors as torchtitan 0.2.2 defines them
// (torchtitan/models/qwen3/__init__.py): grouped-query attention with head_dim 128 whatever the
// width, an RMSNorm on each head of q and k before RoPE, RoPE over (i, i + hd/2) pairs with theta
// 1e6, an explicit SwiGLU width, RMSNorm eps 1e-6, and the token embedding reused as the output
// projection in the flavors up to 4B; the MoE flavors (debugmodel_moe, 30B-A3B, 235B-A22B) make
// every block's feed-forward a mixture of experts (model/moe/moe.h). Their Hugging Face classes:
// Qwen3ForCausalLM, and Qwen3MoeForCausalLM for the MoE flavors.
#include <stdexcept>
#include <string>
#include <vector>

#include "model/grouped_query_family.h"
#include "model/hf_format.h"

namespace titan::model::qwen3 {
namespace {

ModelArgs qwen3(int64_t dim, int64_t n_layers, int64_t n_heads, int64_t n_kv_heads, int64_t vocab_size,
                int64_t hidden_dim, bool tie_embeddings) {
  ModelArgs a;
  a.dim = dim;
  a.n_layers = n_layers;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.vocab_size = vocab_size;
  a.explicit_head_dim = 128;
  a.explicit_hidden_dim = hidden_dim;
  a.norm_eps = 1e-6;
  a.rope_theta = 1e6;
  a.rope_scaling.enabled = false;
  a.qk_norm = true;
  a.rope_rotate_half = true;
  a.tie_embeddings = tie_embeddings;
  a.max_seq_len = 4096;
  if (vocab_size == 151936) a.padded_vocab_size = vocab_size;  // the Hub checkpoints' rows
  return a;
}

// Qwen3-MoE: every block's feed-forward an MoE layer, softmax top 8, route_norm, no shared expert,
// weights after the experts, torchtitan's default load balancing (coefficient 1e-3); untied.
ModelArgs qwen3_moe(ModelArgs a, int64_t num_experts, int64_t moe_hidden_dim) {
  moe::MoEArgs m;
  m.num_experts = num_experts;
  m.num_shared_experts = 0;
  m.top_k = 8;
  m.score_func = "softmax";
  m.route_norm = true;
  m.route_scale = 1.0;
  m.score_before_experts = false;
  a.moe = m;
  a.moe_hidden_dim = moe_hidden_dim;
  return a;
}

// debugmodel's tied embedding at small_moe's size (4 layers of width 128, 4 heads of 32), dense.
ModelArgs small_tied() {
  ModelArgs a = qwen3(128, 4, 4, 2, 2048, 384, true);
  a.explicit_head_dim = 32;
  return a;
}

ModelArgs small_moe() {
  ModelArgs a = qwen3_moe(qwen3(128, 4, 4, 2, 2048, 384, false), 8, 64);
  a.explicit_head_dim = 32;
  a.moe->top_k = 2;
  return a;
}

// ~100M active parameters (364M in all): 14 layers of width 512, 8 experts of hidden 2048, top 2.
ModelArgs moe_100m_active() {
  ModelArgs a = qwen3_moe(qwen3(512, 14, 4, 2, 2048, 1536, false), 8, 2048);
  a.moe->top_k = 2;
  return a;
}

ModelArgs with_theta(ModelArgs a, double theta) {
  a.rope_theta = theta;
  return a;
}

const std::vector<NamedFlavor>& qwen3_flavor_table() {
  static const std::vector<NamedFlavor> table = {
      {"debugmodel", qwen3(256, 8, 16, 8, 2048, 3072, true)},
      {"0.6B", qwen3(1024, 28, 16, 8, 151936, 3072, true)},
      {"1.7B", qwen3(2048, 28, 16, 8, 151936, 6144, true)},
      {"4B", qwen3(2560, 36, 32, 8, 151936, 9728, true)},
      {"8B", qwen3(4096, 36, 32, 8, 151936, 12288, false)},
      {"14B", qwen3(5120, 40, 40, 8, 151936, 17408, false)},
      {"32B", qwen3(5120, 64, 64, 8, 151936, 25600, false)},
      {"debugmodel_moe", qwen3_moe(qwen3(256, 8, 16, 8, 2048, 3072, false), 64, 768)},
      {"30B-A3B", qwen3_moe(qwen3(2048, 48, 32, 4, 151936, 6144, false), 128, 768)},
      {"235B-A22B", qwen3_moe(with_theta(qwen3(4096, 94, 64, 4, 151936, 12288, false), 5e6), 128, 1536)},
      // Not a torchtitan flavor: debugmodel_moe's routing at a size a 2-core CI machine steps
      // through in a fraction of a second (debugmodel_moe holds 315M parameters): 4 layers of
      // 8 experts of which each token takes 2, head_dim 32.
      {"debugmodel_moe_small", small_moe()},
      // Not a torchtitan flavor: debugmodel's tied embedding at that size (debugmodel holds 31.5M
      // parameters, 8 layers with q 2048 wide): what the tied-embedding layout and resume tests run.
      {"debugmodel_small", small_tied()},
      // Not a torchtitan flavor either: the MoE benchmark's larger case (scripts/bench_moe.sh), as
      // titan's Llama "100M" is bench_train.sh's.
      {"moe_100M_active", moe_100m_active()},
  };
  return table;
}

class Qwen3Family final : public GroupedQueryFamily {
 public:
  Qwen3Family() : GroupedQueryFamily("qwen3", qwen3_flavor_table()) {}

  HfFormat hugging_face(const ModelArgs& args) const override {
    if (!args.qk_norm || !args.rope_rotate_half)
      refuse_hugging_face(args, "Qwen3 without q/k norms or with interleaved rotation");
    if (!args.moe) return with_full_window(hf_format_of(args, "Qwen3ForCausalLM", "qwen3"), args);
    // HF's Qwen3-MoE block: softmax over every expert, the top k (renormalized by
    // norm_topk_prob) weighing the experts' outputs, nothing else.
    const moe::MoEArgs& m = *args.moe;
    if (m.score_func != "softmax")
      refuse_hugging_face(args, "router score_func '" + m.score_func + "' (HF's is softmax)");
    if (m.num_shared_experts > 0) refuse_hugging_face(args, "shared experts");
    if (m.gate_bias) refuse_hugging_face(args, "a router gate bias");
    if (m.route_scale != 1.0)
      refuse_hugging_face(args, "route_scale " + std::to_string(m.route_scale) + " (HF's is 1)");
    if (m.score_before_experts)
      refuse_hugging_face(args, "scores applied before the experts (HF weighs their outputs)");
    if (m.num_expert_groups) refuse_hugging_face(args, "group-limited routing");
    HfFormat f = with_full_window(hf_format_of(args, "Qwen3MoeForCausalLM", "qwen3_moe"), args);
    f.config["num_experts"] = m.num_experts;
    f.config["num_experts_per_tok"] = m.top_k;
    f.config["moe_intermediate_size"] = args.moe_hidden_dim;
    f.config["norm_topk_prob"] = m.route_norm;
    // Every block's feed-forward is a mixture of experts.
    f.config["decoder_sparse_step"] = 1;
    f.config["mlp_only_layers"] = nlohmann::json::array();
    // titan balances the experts' load with expert_bias, not with an auxiliary loss. HF's
    // Qwen3-MoE has no tensor for that bias (it routes by the softmax scores alone), so the
    // format holds no block buffer: an export leaves it out, a run from one balances from zero.
    f.config["router_aux_loss_coef"] = 0.0;
    f.config["output_router_logits"] = false;
    f.config_checks.push_back(hf_value_check("num_experts", m.num_experts, "num_experts"));
    f.config_checks.push_back(hf_value_check("num_experts_per_tok", m.top_k, "top_k"));
    f.config_checks.push_back(hf_value_check("norm_topk_prob", m.route_norm, "route_norm"));
    return f;
  }

 private:
  // Qwen3 attends over the whole causal window in every layer.
  static HfFormat with_full_window(HfFormat f, const ModelArgs& args) {
    f.config["use_sliding_window"] = false;
    f.config["sliding_window"] = nullptr;
    f.config["max_window_layers"] = args.n_layers;
    return f;
  }
};

}  // namespace

const Family& family() {
  static const Qwen3Family declaration;
  return declaration;
}

}  // namespace titan::model::qwen3
