// model/deepseek_v3/hf_format.cpp — DeepSeek-V3's Hugging Face format (DeepseekV3ForCausalLM,
// model_type deepseek_v3): the Hub checkpoints' names (those torchtitan's
// DeepSeekV3StateDictAdapter maps), its router's e_score_correction_bias as titan's expert_bias
// (a bias that only chooses, as expert_bias does), and the config.json HF's DeepseekV3Config reads.
//
// HF's DeepseekV3 rotates interleaved pairs of the rope part as titan does (rope_interleave), so no
// rows are permuted. Its router is always a sigmoid over the experts with that bias, group-limited
// (n_group, topk_group), normalized (norm_topk_prob) and scaled (routed_scaling_factor): the
// softmax-routed flavors (debugmodel, 16B, 236B: DeepSeek-V2's router) have no HF counterpart of
// this class. One numeric difference HF's class has by construction: its final norm takes
// rms_norm_eps, torchtitan's (and titan's) the dtype's epsilon.
#include "model/deepseek_v3/hf_format.h"

#include "model/deepseek_v3/args.h"

namespace titan::model::deepseek_v3 {

HfFormat hugging_face_format(const ModelArgs& args) {
  const DeepSeekV3Args& m = args.family_args_as<DeepSeekV3Args>();
  if (!args.moe) refuse_hugging_face(args, "no MoE blocks (HF's DeepseekV3 has them after first_k_dense_replace)");
  const moe::MoEArgs& r = *args.moe;
  if (r.score_func != "sigmoid")
    refuse_hugging_face(args, "router score_func '" + r.score_func + "' (HF's DeepseekV3 scores by sigmoid)");
  if (r.gate_bias) refuse_hugging_face(args, "a router gate bias");
  if (r.score_before_experts) refuse_hugging_face(args, "scores applied before the experts (HF weighs their outputs)");
  if (r.num_shared_experts < 1) refuse_hugging_face(args, "no shared expert");
  if (args.tie_embeddings) refuse_hugging_face(args, "a tied embedding");
  HfFormat f;
  f.architecture = "DeepseekV3ForCausalLM";
  f.model_type = "deepseek_v3";
  f.top_names = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  f.block_folder = "model.layers.";
  f.block_names = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},  // q_lora_rank 0
      {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
      {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"moe.router.gate.weight", "mlp.gate.weight"},
      {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
      {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
      {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
  };
  f.expert_folder = "mlp.experts.";
  f.expert_names = {
      {"moe.experts.w1", "gate_proj.weight"},
      {"moe.experts.w2", "down_proj.weight"},
      {"moe.experts.w3", "up_proj.weight"},
  };
  f.block_buffer_names = {{"moe.expert_bias", "mlp.gate.e_score_correction_bias"}};
  f.ignored_block_names = {"self_attn.rotary_emb.inv_freq"};
  f.mtp_names = {
      {"enorm.weight", "enorm.weight"},
      {"hnorm.weight", "hnorm.weight"},
      {"eh_proj.weight", "eh_proj.weight"},
      {"mtp_norm.weight", "shared_head.norm.weight"},
  };
  f.mtp_ignored_names = {"embed_tokens.weight", "shared_head.head.weight"};
  // YaRN as HF spells it; mscale = mscale_all_dim keeps HF's cos/sin unscaled (its
  // attention_factor is their ratio) and its softmax scale times mscale_all_dim's factor squared,
  // as torchtitan's.
  const nlohmann::json rope_scaling =
      m.yarn(args.max_seq_len) ? nlohmann::json{{"type", "yarn"},
                                                {"factor", m.rope_factor},
                                                {"original_max_position_embeddings", m.original_seq_len},
                                                {"beta_fast", m.beta_fast},
                                                {"beta_slow", m.beta_slow},
                                                {"mscale", m.mscale},
                                                {"mscale_all_dim", m.mscale}}
                               : nlohmann::json(nullptr);
  f.config = {
      {"vocab_size", args.vocab_size},
      {"hidden_size", args.dim},
      {"intermediate_size", args.ffn_hidden_dim()},
      {"moe_intermediate_size", args.moe_hidden_dim},
      {"num_hidden_layers", args.n_layers},
      {"num_attention_heads", args.n_heads},
      {"num_key_value_heads", args.n_heads},
      {"n_shared_experts", r.num_shared_experts},
      {"n_routed_experts", r.num_experts},
      {"num_experts_per_tok", r.top_k},
      {"n_group", r.num_expert_groups.value_or(1)},
      {"topk_group", r.num_limited_groups.value_or(1)},
      {"routed_scaling_factor", r.route_scale},
      {"norm_topk_prob", r.route_norm},
      {"scoring_func", "sigmoid"},
      {"topk_method", "noaux_tc"},
      {"first_k_dense_replace", m.n_dense_layers},
      {"num_nextn_predict_layers", args.mtp_layers},
      {"q_lora_rank", m.q_lora_rank > 0 ? nlohmann::json(m.q_lora_rank) : nlohmann::json(nullptr)},
      {"kv_lora_rank", m.kv_lora_rank},
      {"qk_nope_head_dim", m.qk_nope_head_dim},
      {"qk_rope_head_dim", m.qk_rope_head_dim},
      {"v_head_dim", m.v_head_dim},
      {"rope_interleave", true},
      {"hidden_act", "silu"},
      {"max_position_embeddings", args.max_seq_len},
      {"rms_norm_eps", args.norm_eps},
      {"rope_theta", args.rope_theta},
      {"rope_scaling", rope_scaling},
      {"tie_word_embeddings", false},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
  };
  f.config_checks = {
      hf_value_check("hidden_size", args.dim, "dim"),
      hf_value_check("num_hidden_layers", args.n_layers, "n_layers"),
      hf_value_check("num_attention_heads", args.n_heads, "n_heads"),
      hf_value_check("first_k_dense_replace", m.n_dense_layers, "n_dense_layers"),
      hf_value_check("n_routed_experts", r.num_experts, "num_experts"),
      hf_value_check("num_experts_per_tok", r.top_k, "top_k"),
      hf_value_check("n_group", r.num_expert_groups.value_or(1), "num_expert_groups"),
      hf_value_check("topk_group", r.num_limited_groups.value_or(1), "num_limited_groups"),
      hf_value_check("routed_scaling_factor", r.route_scale, "route_scale"),
      hf_value_check("norm_topk_prob", r.route_norm, "route_norm"),
      hf_value_check("rope_theta", args.rope_theta, "rope_theta"),
      hf_value_check("rms_norm_eps", args.norm_eps, "norm_eps"),
  };
  HfConfigCheck scaling;
  scaling.key = "rope_scaling";
  scaling.ours = rope_scaling;
  scaling.choose = "model.flavor and training.seq_len (YaRN is on when seq_len exceeds original_seq_len)";
  scaling.absent_is_null = true;
  scaling.optional_keys = {"type", "rope_type"};
  f.config_checks.push_back(scaling);
  return f;
}

}  // namespace titan::model::deepseek_v3
