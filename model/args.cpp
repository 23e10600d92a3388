#include "model/args.h"

#include <cmath>
#include <stdexcept>

namespace titan::model {

double RopeScaling::scale(double freq) const {
  if (!enabled) return freq;
  const double wavelen = 2 * M_PI / freq;
  const double high_freq_wavelen = original_max_position_embeddings / high_freq_factor;
  const double low_freq_wavelen = original_max_position_embeddings / low_freq_factor;
  if (wavelen < high_freq_wavelen) return freq;
  if (wavelen > low_freq_wavelen) return freq / factor;
  const double smooth = (original_max_position_embeddings / wavelen - low_freq_factor) /
                        (high_freq_factor - low_freq_factor);
  return (1 - smooth) * freq / factor + smooth * freq;
}

int64_t ModelArgs::ffn_hidden_dim() const {
  if (explicit_hidden_dim > 0) return explicit_hidden_dim;
  int64_t hidden = 4 * dim;
  hidden = static_cast<int64_t>(2 * hidden / 3);
  if (ffn_dim_multiplier > 0) hidden = static_cast<int64_t>(ffn_dim_multiplier * hidden);
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

ParamCount count_params(const ModelArgs& a) {
  const int64_t head_dim = a.head_dim();
  const int64_t attention = a.dim * a.n_heads * head_dim        // wq
                            + 2 * a.dim * a.kv_heads() * head_dim  // wk, wv
                            + a.n_heads * head_dim * a.dim;      // wo
  // w1, w2, w3; an MoE layer: the router, every expert and the shared experts.
  const int64_t expert = 3 * a.dim * a.moe_hidden_dim;
  const int64_t feed_forward =
      a.moe ? a.dim * a.moe->num_experts + (a.moe->gate_bias ? a.moe->num_experts : 0) +
                  (a.moe->num_experts + a.moe->num_shared_experts) * expert
            : 3 * a.dim * a.ffn_hidden_dim();
  const int64_t norms = 2 * a.dim + (a.qk_norm ? 2 * head_dim : 0);  // attention_norm, ffn_norm, q/k_norm
  ParamCount count;
  count.per_layer = attention + feed_forward + norms;
  count.embedding = a.vocab_size * a.dim;
  count.total = count.embedding + a.n_layers * count.per_layer + a.dim /* norm */ +
                (a.tie_embeddings ? 0 : a.vocab_size * a.dim) /* output */;
  // torchtitan's get_moe_model_nparams_and_flops: the experts count top_k / num_experts.
  count.active = a.moe ? count.total - a.n_layers * (a.moe->num_experts - a.moe->top_k) * expert : count.total;
  return count;
}

double attention_flops_per_token(const ModelArgs& a, int64_t seq_len) {
  return 12.0 * static_cast<double>(a.n_layers) * a.n_heads * a.head_dim() * seq_len;
}

double flops_per_token(const ModelArgs& a, int64_t seq_len) {
  const ParamCount c = count_params(a);
  return 6.0 * static_cast<double>(c.active - c.embedding) + attention_flops_per_token(a, seq_len);
}

}  // namespace titan::model
