// model/llama4/hf_format.cpp — Llama 4's Hugging Face format: Llama4ForCausalLM (model_type
// llama4_text), the text model's names ("model.layers.<i>...", "lm_head.weight"; the multimodal
// checkpoints torchtitan's Llama4StateDictAdapter reads prefix them with "language_model."),
// and the config.json HF's Llama4TextConfig reads.
//
// HF's Llama 4 rotates interleaved pairs as titan does (view_as_complex), so no rows are permuted.
// Its experts are two stacked tensors of every expert: gate_up_proj [E, D, 2H] (w1^T then w3^T
// along the last dim) and down_proj [E, H, D] (w2^T), as torchtitan's adapter fuses them. Its
// router takes the top-k of the gate's logits and multiplies each chosen expert's input by the
// sigmoid of its logit, one shared expert beside them: titan's sigmoid scores before the experts,
// unnormalized, unscaled. It has no tensor for titan's load-balancing bias (it routes by the
// logits alone), so the format holds no block buffer (an export leaves expert_bias out, a run
// from one balances from zero). The config says every difference HF's class would otherwise make:
// use_qk_norm and attn_temperature_tuning off (torchtitan's model has neither), no_rope_layers
// and moe_layers listing titan's blocks (HF's default no_rope_layers puts NoPE on blocks 3, 7, ...;
// torchtitan's iRoPE on 0, 4, ...), attention_chunk_size the chunk, or the whole window without
// iRoPE.
#include "model/llama4/hf_format.h"

#include "model/family.h"
#include "model/llama4/args.h"

namespace titan::model::llama4 {

HfFormat hugging_face_format(const ModelArgs& args) {
  const Llama4Args& l4 = args.family_args_as<Llama4Args>();
  if (!args.moe) refuse_hugging_face(args, "no MoE blocks");
  const moe::MoEArgs& r = *args.moe;
  if (r.score_func != "sigmoid")
    refuse_hugging_face(args, "router score_func '" + r.score_func + "' (HF's Llama 4 scores by sigmoid)");
  if (!r.score_before_experts) refuse_hugging_face(args, "scores applied after the experts (HF's scale their input)");
  if (r.route_norm) refuse_hugging_face(args, "normalized routing scores (route_norm)");
  if (r.route_scale != 1.0) refuse_hugging_face(args, "route_scale " + std::to_string(r.route_scale) + " (HF's is 1)");
  if (r.gate_bias) refuse_hugging_face(args, "a router gate bias");
  if (r.num_expert_groups) refuse_hugging_face(args, "group-limited routing");
  if (r.num_shared_experts != 1)
    refuse_hugging_face(args, std::to_string(r.num_shared_experts) + " shared experts (HF's Llama 4 has one)");
  if (args.tie_embeddings) refuse_hugging_face(args, "a tied embedding");
  if (args.qk_norm || args.rope_rotate_half) refuse_hugging_face(args, "q/k norms or half rotation");
  HfFormat f;
  f.architecture = "Llama4ForCausalLM";
  f.model_type = "llama4_text";
  f.top_names = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  f.block_folder = "model.layers.";
  f.block_names = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},
      {"attention.wk.weight", "self_attn.k_proj.weight"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"feed_forward.w1.weight", "feed_forward.gate_proj.weight"},
      {"feed_forward.w2.weight", "feed_forward.down_proj.weight"},
      {"feed_forward.w3.weight", "feed_forward.up_proj.weight"},
      {"moe.router.gate.weight", "feed_forward.router.weight"},
      {"moe.shared_experts.w1.weight", "feed_forward.shared_expert.gate_proj.weight"},
      {"moe.shared_experts.w2.weight", "feed_forward.shared_expert.down_proj.weight"},
      {"moe.shared_experts.w3.weight", "feed_forward.shared_expert.up_proj.weight"},
  };
  f.fused_experts = {
      {"feed_forward.experts.gate_up_proj", {"moe.experts.w1", "moe.experts.w3"}},
      {"feed_forward.experts.down_proj", {"moe.experts.w2"}},
  };
  f.ignored_block_names = {"self_attn.rotary_emb.inv_freq"};
  const Family& family = model::family(args.family);
  nlohmann::json moe_layers = nlohmann::json::array(), no_rope_layers = nlohmann::json::array();
  for (int64_t layer = 0; layer < args.n_layers; ++layer) {
    if (family.feed_forward(args, layer) == FeedForwardKind::kMoE) moe_layers.push_back(layer);
    no_rope_layers.push_back(l4.nope_layer(layer) ? 0 : 1);  // HF: 1 = the block uses RoPE
  }
  const nlohmann::json chunk = l4.every_n_layers_nope > 0 ? l4.fixed_attn_block_size : args.max_seq_len;
  f.config = {
      {"hidden_size", args.dim},
      {"intermediate_size", args.moe_hidden_dim},
      {"intermediate_size_mlp", args.ffn_hidden_dim()},
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
      {"tie_word_embeddings", false},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"num_local_experts", r.num_experts},
      {"num_experts_per_tok", r.top_k},
      {"interleave_moe_layer_step", l4.interleave_moe_layer_step},
      {"moe_layers", moe_layers},
      {"no_rope_layers", no_rope_layers},
      {"attention_chunk_size", chunk},
      {"use_qk_norm", false},
      {"attn_temperature_tuning", false},
      {"router_aux_loss_coef", 0.0},
      {"output_router_logits", false},
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
      hf_value_check("num_local_experts", r.num_experts, "num_experts"),
      hf_value_check("num_experts_per_tok", r.top_k, "top_k"),
      hf_value_check("moe_layers", moe_layers, "interleave_moe_layer_step"),
      hf_value_check("no_rope_layers", no_rope_layers, "every_n_layers_nope"),
      // HF's qk norm (on by default, and in Meta's checkpoints) and NoPE temperature tuning change
      // the logits of torchtitan's model, which has neither.
      hf_value_check("use_qk_norm", false, "use_qk_norm"),
      hf_value_check("attn_temperature_tuning", false, "attn_temperature_tuning"),
  };
  if (l4.every_n_layers_nope > 0)
    f.config_checks.push_back(hf_value_check("attention_chunk_size", chunk, "fixed_attn_block_size"));
  f.config_checks.push_back(hf_rope_scaling_check(args.rope_scaling));
  return f;
}

}  // namespace titan::model::llama4
