// model/grouped_query_hf_format.cpp — the Hugging Face format the grouped-query families share
// (GroupedQueryFamily::hf_format_of): HF's Llama-style modeling code (LlamaForCausalLM,
// Qwen3ForCausalLM and Qwen3MoeForCausalLM spell the same layers alike).
#include <utility>

#include "model/grouped_query_family.h"
#include "model/hf_format.h"

namespace titan::model {

HfFormat GroupedQueryFamily::hf_format_of(const ModelArgs& args, std::string architecture,
                                          std::string model_type) const {
  HfFormat f;
  f.architecture = std::move(architecture);
  f.model_type = std::move(model_type);
  // output <-> lm_head, absent when the embedding is tied (HF ties it too).
  f.top_names = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  if (args.tie_embeddings) f.ignored_names = {"lm_head.weight"};
  f.block_folder = "model.layers.";
  // Every block parameter a grouped-query family may have: a name a model lacks (q_norm in
  // Llama, the experts of a dense model) is then simply not among its parameters.
  f.block_names = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},
      {"attention.wk.weight", "self_attn.k_proj.weight"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_norm.weight"},
      {"attention.k_norm.weight", "self_attn.k_norm.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"moe.router.gate.weight", "mlp.gate.weight"},
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
  };
  // titan's moe.experts.w1 [E, H, D] / w3 [E, H, D] / w2 [E, D, H]: expert j's row is its own
  // SwiGLU's gate_proj / up_proj / down_proj.
  f.expert_folder = "mlp.experts.";
  f.expert_names = {
      {"moe.experts.w1", "gate_proj.weight"},
      {"moe.experts.w2", "down_proj.weight"},
      {"moe.experts.w3", "up_proj.weight"},
  };
  if (!args.rope_rotate_half)  // titan rotates interleaved pairs, HF halves
    f.rotary_rows = {{"attention.wq.weight", args.n_heads, args.head_dim()},
                     {"attention.wk.weight", args.kv_heads(), args.head_dim()}};
  f.ignored_block_names = {"self_attn.rotary_emb.inv_freq"};
  f.config = {
      {"hidden_size", args.dim},
      {"intermediate_size", args.ffn_hidden_dim()},
      {"num_hidden_layers", args.n_layers},
      {"num_attention_heads", args.n_heads},
      {"num_key_value_heads", args.kv_heads()},
      {"head_dim", args.head_dim()},
      {"hidden_act", "silu"},
      {"rms_norm_eps", args.norm_eps},
      {"rope_theta", args.rope_theta},
      {"rope_scaling", hf_rope_scaling(args.rope_scaling)},
      {"max_position_embeddings", args.max_seq_len},
      {"vocab_size", args.vocab_size},
      {"tie_word_embeddings", args.tie_embeddings},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
  };
  f.config_checks = {
      hf_value_check("hidden_size", args.dim, "dim"),
      hf_value_check("num_hidden_layers", args.n_layers, "n_layers"),
      hf_value_check("num_attention_heads", args.n_heads, "n_heads"),
      hf_value_check("num_key_value_heads", args.kv_heads(), "n_kv_heads"),
      hf_value_check("rope_theta", args.rope_theta, "rope_theta"),
      hf_value_check("rms_norm_eps", args.norm_eps, "norm_eps"),
  };
  f.config_checks.push_back(hf_rope_scaling_check(args.rope_scaling));
  return f;
}

}  // namespace titan::model
