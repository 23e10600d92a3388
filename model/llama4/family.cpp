// model/llama4/family.cpp — Llama 4 as torchtitan 0.2.2 defines it (torchtitan/models/llama4):
// Llama's grouped-query attention with interleaved-pair RoPE (Llama 3.1's scaling where the flavor
// sets rope_scaling_args), MoE blocks every interleave_moe_layer_step blocks (a shared expert,
// top-1 sigmoid routing whose score multiplies the expert's input) with dense SwiGLU blocks
// between, iRoPE on the _irope flavors (model/llama4/args.h), torchtitan's Llama init.
//
// torchtitan 0.2.2's Attention.forward selects the layer's mask (attention_masks["rope" if
// use_rope else "nope"]) but then hands FlexAttention the whole dict of masks as block_mask; titan
// computes what the selection means: each layer attends under its own mask.
#include <memory>
#include <string>
#include <vector>

#include "model/grouped_query_attention.h"
#include "model/grouped_query_family.h"
#include "model/llama4/args.h"
#include "model/llama4/hf_format.h"

namespace titan::model::llama4 {
namespace {

struct Irope {
  int64_t every_n_layers_nope = 0;
  int64_t fixed_attn_block_size = 8192;
};

// torchtitan's TransformerBlock: an MoE block's expert hidden size from 4 dim as the dense
// FeedForward's (2/3, times ffn_dim_multiplier), divided by top_k + num_shared_experts
// (auto_scale_hidden_dim), rounded up to multiple_of.
int64_t moe_hidden_dim(const ModelArgs& a) {
  int64_t hidden = static_cast<int64_t>(2 * (4 * a.dim) / 3);
  if (a.ffn_dim_multiplier > 0) hidden = static_cast<int64_t>(a.ffn_dim_multiplier * static_cast<double>(hidden));
  hidden = hidden / (a.moe->top_k + a.moe->num_shared_experts);
  return hidden + (a.multiple_of - hidden % a.multiple_of) % a.multiple_of;
}

// TransformerModelArgs(dim, n_layers, n_heads, n_kv_heads, vocab_size, multiple_of,
// ffn_dim_multiplier, rope_theta 500000, rope_scaling_args, moe_args = MoEArgs(num_experts),
// interleave_moe_layer_step, iRoPE), the rest at torchtitan's defaults (norm_eps 1e-5, depth_init,
// MoEArgs: one shared expert, top-1 sigmoid scores before the experts, load_balance_coeff 1e-3).
ModelArgs llama4(int64_t dim, int64_t n_layers, int64_t n_heads, int64_t n_kv_heads, int64_t vocab, int64_t multiple_of,
                 double ffn_dim_multiplier, bool rope_scaling, int64_t experts, int64_t interleave, Irope irope = {}) {
  ModelArgs a;
  a.dim = dim;
  a.n_layers = n_layers;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.vocab_size = vocab;
  a.multiple_of = multiple_of;
  a.ffn_dim_multiplier = ffn_dim_multiplier;
  a.norm_eps = 1e-5;
  a.rope_theta = 500000.0;
  // RoPEScalingArgs(): factor 16, low and high frequency factors 1, 8192 original positions.
  a.rope_scaling.enabled = rope_scaling;
  a.rope_scaling.factor = 16.0;
  a.rope_scaling.low_freq_factor = 1.0;
  a.rope_scaling.high_freq_factor = 1.0;
  a.rope_scaling.original_max_position_embeddings = 8192;
  a.max_seq_len = 1048576;  // replaced by training.seq_len, as torchtitan's update_from_config
  moe::MoEArgs m;
  m.num_experts = experts;
  a.moe = m;
  a.moe_hidden_dim = moe_hidden_dim(a);
  // The _irope flavors are torchtitan's flex ones: attn_mask_type block_causal.
  a.block_causal = irope.every_n_layers_nope > 0;
  auto extra = std::make_shared<Llama4Args>();
  extra->interleave_moe_layer_step = interleave;
  extra->every_n_layers_nope = irope.every_n_layers_nope;
  extra->fixed_attn_block_size = irope.fixed_attn_block_size;
  a.family_args = std::move(extra);
  return a;
}

// torchtitan's llama4_args (torchtitan/models/llama4/__init__.py).
const std::vector<NamedFlavor>& llama4_flavor_table() {
  static const std::vector<NamedFlavor> table = {
      {"debugmodel", llama4(256, 6, 16, 0, 2048, 256, 0.0, true, 8, 2)},
      {"17bx16e", llama4(5120, 48, 40, 8, 202048, 2048, 1.2, true, 16, 1)},
      {"17bx128e", llama4(5120, 48, 40, 8, 202048, 2048, 1.2, false, 128, 2)},
      {"debugmodel_irope", llama4(256, 6, 16, 0, 2048, 256, 0.0, true, 8, 2, {4, 256})},
      {"17bx16e_irope", llama4(5120, 48, 40, 8, 202048, 2048, 1.2, true, 16, 1, {4, 8192})},
      {"17bx128e_irope", llama4(5120, 48, 40, 8, 202048, 2048, 1.2, false, 128, 2, {4, 8192})},
      // Not a torchtitan flavor: iRoPE at a size a 2-core CI machine steps through in a fraction of
      // a second, with chunks short enough to cut its test sequences (32 positions: chunks of 12,
      // which neither divide them nor align with context parallelism's load-balanced chunks): 4
      // blocks of width 128 (8 heads of 16, 4 kv heads), NoPE blocks 0 and 2, dense blocks 0 and 2
      // and MoE blocks 1 and 3 (8 experts, top 1, a shared one), block-causal.
      {"debugmodel_small_irope", llama4(128, 4, 8, 4, 2048, 64, 0.0, true, 8, 2, {2, 12})},
  };
  return table;
}

class Llama4Family final : public GroupedQueryFamily {
 public:
  Llama4Family() : GroupedQueryFamily("llama4", llama4_flavor_table()) {}

  FeedForwardKind feed_forward(const ModelArgs& args, int64_t layer) const override {
    return args.moe && args.family_args_as<Llama4Args>().moe_layer(layer) ? FeedForwardKind::kMoE
                                                                          : FeedForwardKind::kDense;
  }
  std::unique_ptr<AttentionModule> make_attention(const std::string& prefix, const ModelArgs& args,
                                                  int64_t layer) const override {
    auto attention = std::make_unique<GroupedQueryAttention>(prefix, args);
    const Llama4Args& l4 = args.family_args_as<Llama4Args>();
    attention->use_rope = !l4.nope_layer(layer);
    attention->attention_chunk = l4.attention_chunk(layer);
    return attention;
  }
  int64_t attention_chunk(const ModelArgs& args, int64_t layer) const override {
    return args.family_args_as<Llama4Args>().attention_chunk(layer);
  }
  HfFormat hugging_face(const ModelArgs& args) const override { return hugging_face_format(args); }
};

}  // namespace

const Family& family() {
  static const Llama4Family declaration;
  return declaration;
}

}  // namespace titan::model::llama4
