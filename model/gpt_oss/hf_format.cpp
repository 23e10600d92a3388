// model/gpt_oss/hf_format.cpp — gpt-oss's Hugging Face format: GptOssForCausalLM (model_type
// gpt_oss), the names torchtitan's GptOssStateDictAdapter maps, and the config.json HF's
// GptOssConfig reads.
//
// HF's gpt-oss rotates halves (its _apply_rotary_emb chunks the head in two) as titan does here,
// so no rows are permuted. Its experts are stacked tensors of every expert: gate_up_proj
// [E, D, 2H] (titan's mlp1_weight transposed, gate and linear still interleaved along the last
// dim), down_proj [E, H, D] (mlp2_weight transposed), and their biases as titan's. Its router
// softmaxes the top-k logits, which is titan's softmax over every expert renormalized over the
// chosen ones (route_norm). It has no tensor for titan's load-balancing bias: an export leaves
// expert_bias out, a run from one balances from zero.
//
// The Hub's checkpoints (openai/gpt-oss-20b, -120b) store the experts' weights in MXFP4
// (gate_up_proj_blocks / _scales, down_proj_blocks / _scales). titan reads the dequantized
// form: the names above in bf16 or float32, as transformers writes after loading with
// Mxfp4Config(dequantize=True) and save_pretrained. A file with the MXFP4 tensors is refused by
// name (the _blocks tensors are not titan's).
#include "model/gpt_oss/hf_format.h"

#include "model/family.h"
#include "model/gpt_oss/args.h"

namespace titan::model::gpt_oss {

HfFormat hugging_face_format(const ModelArgs& args) {
  const GptOssArgs& g = args.family_args_as<GptOssArgs>();
  if (!args.moe) refuse_hugging_face(args, "no MoE blocks");
  const moe::MoEArgs& r = *args.moe;
  if (r.score_func != "softmax" || !r.route_norm || r.route_scale != 1.0 || r.score_before_experts)
    refuse_hugging_face(args, "routing other than gpt-oss's (softmax over the top-k logits, weights after the experts)");
  if (!r.gate_bias) refuse_hugging_face(args, "a router without its bias");
  if (r.num_expert_groups) refuse_hugging_face(args, "group-limited routing");
  if (r.num_shared_experts != 0) refuse_hugging_face(args, "shared experts (HF's gpt-oss has none)");
  if (args.tie_embeddings) refuse_hugging_face(args, "a tied embedding");
  HfFormat f;
  f.architecture = "GptOssForCausalLM";
  f.model_type = "gpt_oss";
  f.top_names = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  f.block_folder = "model.layers.";
  f.block_names = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},
      {"attention.wq.bias", "self_attn.q_proj.bias"},
      {"attention.wk.weight", "self_attn.k_proj.weight"},
      {"attention.wk.bias", "self_attn.k_proj.bias"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},
      {"attention.wv.bias", "self_attn.v_proj.bias"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"attention.wo.bias", "self_attn.o_proj.bias"},
      {"attention.sinks", "self_attn.sinks"},
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"moe.router.gate.weight", "mlp.router.weight"},
      {"moe.router.gate.bias", "mlp.router.bias"},
      {"moe.experts.mlp1_bias", "mlp.experts.gate_up_proj_bias"},
      {"moe.experts.mlp2_bias", "mlp.experts.down_proj_bias"},
  };
  const std::string dequantize =
      "the Hub's MXFP4 form of gpt-oss's experts, which titan does not read: load the checkpoint with "
      "transformers' Mxfp4Config(dequantize=True) and save_pretrained it, then point titan at that folder";
  for (const char* t : {"mlp.experts.gate_up_proj_blocks", "mlp.experts.gate_up_proj_scales",
                        "mlp.experts.down_proj_blocks", "mlp.experts.down_proj_scales"})
    f.refused_block_names.push_back({t, dequantize});
  f.fused_experts = {
      {"mlp.experts.gate_up_proj", {"moe.experts.mlp1_weight"}},
      {"mlp.experts.down_proj", {"moe.experts.mlp2_weight"}},
  };
  nlohmann::json layer_types = nlohmann::json::array();
  for (int64_t layer = 0; layer < args.n_layers; ++layer)
    layer_types.push_back(g.window(layer) > 0 ? "sliding_attention" : "full_attention");
  const nlohmann::json rope_scaling = {
      {"rope_type", "yarn"},
      {"factor", g.rope_factor},
      {"beta_fast", g.ntk_beta},
      {"beta_slow", g.ntk_alpha},
      {"truncate", false},
      {"original_max_position_embeddings", g.original_seq_len},
  };
  f.config = {
      {"hidden_size", args.dim},
      {"intermediate_size", args.moe_hidden_dim},
      {"num_hidden_layers", args.n_layers},
      {"num_attention_heads", args.n_heads},
      {"num_key_value_heads", args.kv_heads()},
      {"head_dim", args.head_dim()},
      {"hidden_act", "silu"},
      {"rms_norm_eps", args.norm_eps},
      {"rope_theta", args.rope_theta},
      {"rope_scaling", rope_scaling},
      {"max_position_embeddings", args.max_seq_len},
      {"vocab_size", args.vocab_size},
      {"tie_word_embeddings", false},
      {"attention_bias", true},
      {"attention_dropout", 0.0},
      {"sliding_window", g.sliding_window_size},
      {"layer_types", layer_types},
      {"swiglu_limit", g.swiglu_limit},
      {"num_local_experts", r.num_experts},
      {"num_experts_per_tok", r.top_k},
      {"experts_per_token", r.top_k},
      {"router_aux_loss_coef", 0.0},
      {"output_router_logits", false},
      {"initializer_range", 0.02},
      {"use_cache", true},
  };
  HfConfigCheck rope = hf_value_check("rope_scaling", rope_scaling, "");
  rope.optional_keys = {"truncate"};
  f.config_checks = {
      hf_value_check("hidden_size", args.dim, "dim"),
      hf_value_check("intermediate_size", args.moe_hidden_dim, "moe_inter_dim"),
      hf_value_check("num_hidden_layers", args.n_layers, "n_layers"),
      hf_value_check("num_attention_heads", args.n_heads, "n_heads"),
      hf_value_check("num_key_value_heads", args.kv_heads(), "n_kv_heads"),
      hf_value_check("head_dim", args.head_dim(), "head_dim"),
      hf_value_check("rope_theta", args.rope_theta, "rope_theta"),
      hf_value_check("rms_norm_eps", args.norm_eps, "norm_eps"),
      hf_value_check("sliding_window", g.sliding_window_size, "sliding_window_size"),
      hf_value_check("layer_types", layer_types, "sliding_window_size"),
      hf_value_check("swiglu_limit", g.swiglu_limit, "swiglu_limit"),
      hf_value_check("num_local_experts", r.num_experts, "num_experts"),
      hf_value_check("num_experts_per_tok", r.top_k, "top_k"),
      rope,
  };
  return f;
}

}  // namespace titan::model::gpt_oss
