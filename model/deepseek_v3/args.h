// model/deepseek_v3/args.h — what DeepSeek-V3 adds to the shared model arguments (torchtitan
// 0.2.2's DeepSeekV3ModelArgs): multi-head latent attention's ranks and head sizes, the dense
// blocks before the MoE ones, and YaRN's context extension. The shared fields carry the rest:
// dim, n_layers, n_heads, vocab_size, norm_eps, rope_theta, explicit_hidden_dim (inter_dim),
// moe / moe_hidden_dim (moe_args / moe_inter_dim), max_seq_len.
#pragma once

#include <cstdint>

#include "model/args.h"

namespace titan::model::deepseek_v3 {

struct DeepSeekV3Args final : FamilyArgs {
  int64_t n_dense_layers = 1;     // blocks [0, n_dense_layers) dense, the rest MoE
  int64_t q_lora_rank = 0;        // 0: q = wq x; else q = wq_b(q_norm(wq_a x)) through this rank
  int64_t kv_lora_rank = 512;     // keys and values through this rank: wkv_b(kv_norm(wkv_a x))
  int64_t qk_nope_head_dim = 128;  // the part of each q/k head without position
  int64_t qk_rope_head_dim = 64;  // the rotated part; k's is one head shared by every query head
  int64_t v_head_dim = 128;
  // YaRN (on when max_seq_len > original_seq_len): the rotary frequencies ramp between the
  // correction dims of beta_fast and beta_slow rotations, divided by rope_factor below it; the
  // softmax scale grows by mscale_factor()^2.
  int64_t original_seq_len = 4096;
  double rope_factor = 40;
  int64_t beta_fast = 32;
  int64_t beta_slow = 1;
  double mscale = 1.0;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool yarn(int64_t max_seq_len) const { return max_seq_len > original_seq_len; }
  // qk_head_dim^-1/2, times (0.1 mscale ln(rope_factor) + 1)^2 under YaRN (torchtitan's Attention).
  double softmax_scale(int64_t max_seq_len) const;
};

}  // namespace titan::model::deepseek_v3
