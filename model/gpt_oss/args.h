// model/gpt_oss/args.h — what gpt-oss adds to the shared model arguments (torchtitan 0.2.2's
// GptOssModelArgs): sliding-window attention on the even blocks, the experts' SwiGLU clamp, and
// YaRN's rotary terms. The shared fields carry the rest: dim, n_layers, n_heads, n_kv_heads,
// explicit_head_dim (head_dim), vocab_size, norm_eps, rope_theta, moe / moe_hidden_dim
// (moe_args, moe_inter_dim), block_causal (attn_mask_type).
#pragma once

#include <cmath>
#include <cstdint>

#include "model/args.h"

namespace titan::model::gpt_oss {

struct GptOssArgs final : FamilyArgs {
  double swiglu_limit = 7.0;            // the experts' gate clamped to <= limit, linear to [-limit, limit]
  int64_t sliding_window_size = 128;    // the even blocks' window (a query sees itself and 127 before)
  int64_t original_seq_len = 4096;      // YaRN: the context the frequencies were trained for
  double rope_factor = 32;              // YaRN's scaling factor (> 1: YaRN on)
  double ntk_alpha = 1.0, ntk_beta = 32.0;  // YaRN's NTK-by-parts rotation bounds

  // torchtitan's TransformerBlock: use_sliding_attention = layer_id % 2 == 0.
  int64_t window(int64_t layer) const { return layer % 2 == 0 ? sliding_window_size : 0; }
  // YaRN's concentration (precompute_rope_cache): both q's and k's cos / sin tables are scaled by
  // it, so the attention logits are scaled by its square.
  double mscale() const { return rope_factor > 1 ? 0.1 * std::log(rope_factor) + 1.0 : 1.0; }
};

}  // namespace titan::model::gpt_oss
