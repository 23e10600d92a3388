// model/llama4/args.h — what Llama 4 adds to the shared model arguments (torchtitan 0.2.2's
// llama4 TransformerModelArgs): MoE blocks every interleave_moe_layer_step blocks with dense
// SwiGLU blocks between, and iRoPE: every every_n_layers_nope-th block without positions (NoPE)
// over the whole (causal or block-causal) window, the others with RoPE and attention confined to
// chunks of fixed_attn_block_size positions. The shared fields carry the rest: dim, n_layers,
// n_heads, n_kv_heads, vocab_size, multiple_of, ffn_dim_multiplier, norm_eps, rope_theta,
// rope_scaling (rope_scaling_args), moe / moe_hidden_dim (moe_args and the auto-scaled hidden size),
// block_causal (attn_mask_type).
#pragma once

#include <cstdint>

#include "model/args.h"

namespace titan::model::llama4 {

struct Llama4Args final : FamilyArgs {
  int64_t interleave_moe_layer_step = 2;  // block i is MoE when (i + 1) % step == 0
  int64_t every_n_layers_nope = 0;        // 0: every block RoPE over the whole window (no iRoPE)
  int64_t fixed_attn_block_size = 8192;   // the RoPE blocks' chunk under iRoPE

  bool moe_layer(int64_t layer) const { return (layer + 1) % interleave_moe_layer_step == 0; }
  bool nope_layer(int64_t layer) const { return every_n_layers_nope > 0 && layer % every_n_layers_nope == 0; }
  // The chunk of block `layer`'s attention: fixed_attn_block_size on iRoPE's RoPE blocks, else 0.
  int64_t attention_chunk(int64_t layer) const {
    return every_n_layers_nope > 0 && !nope_layer(layer) ? fixed_attn_block_size : 0;
  }
};

}  // namespace titan::model::llama4
