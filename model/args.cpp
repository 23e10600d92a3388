#include "model/args.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/family.h"
#include "model/layers.h"

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
  const Family& family = model::family(a.family);
  // An MoE layer: the router (and its bias), every routed expert (as its family declares them) and
  // the shared experts, each a SwiGLU of moe_hidden_dim.
  const int64_t expert = a.moe ? family.routed_expert_params(a) : 0;
  const int64_t shared_expert = a.moe ? FeedForward::param_count(a.dim, a.moe_hidden_dim) : 0;
  ParamCount count;
  count.embedding = a.vocab_size * a.dim;
  count.total = count.embedding + a.dim /* norm */ + (a.tie_embeddings ? 0 : a.vocab_size * a.dim) /* output */;
  count.active = count.total;
  // A multi-token prediction depth is a block like the last one (its attention, its feed-forward
  // kind) plus enorm, hnorm, eh_proj [dim, 2 dim] and mtp_norm; it reuses the embedding and the
  // output projection.
  const int64_t last = a.n_layers - 1;
  for (int64_t layer = 0; layer < a.n_layers + a.mtp_layers; ++layer) {
    const bool mtp = layer >= a.n_layers;
    const int64_t like = mtp ? last : layer;  // the block whose declaration it repeats
    int64_t inactive = 0;  // an MoE block's experts a token does not reach
    int64_t block = family.attention_params(a, like) + a.dim /* attention_norm */ +
                    (mtp ? 2 * a.dim * a.dim + 3 * a.dim : 0);
    switch (family.feed_forward(a, like)) {
      case FeedForwardKind::kDense:
        block += FeedForward::param_count(a.dim, a.ffn_hidden_dim()) + a.dim /* ffn_norm */;
        break;
      case FeedForwardKind::kMoE:
        block += a.dim * a.moe->num_experts + (a.moe->gate_bias ? a.moe->num_experts : 0) +
                 a.moe->num_experts * expert + a.moe->num_shared_experts * shared_expert + a.dim /* ffn_norm */;
        // torchtitan's get_moe_model_nparams_and_flops: the experts count top_k / num_experts.
        inactive = (a.moe->num_experts - a.moe->top_k) * expert;
        break;
      case FeedForwardKind::kNone:
        break;
    }
    count.total += block;
    count.active += block - inactive;
    if (mtp) continue;
    count.per_block.push_back(block);
    count.per_block_active.push_back(block - inactive);
    count.per_layer = std::max(count.per_layer, block);
  }
  return count;
}

double attention_flops_per_token(const ModelArgs& a, int64_t seq_len) {
  const Family& family = model::family(a.family);
  double flops = 0;
  for (int64_t layer = 0; layer < a.n_layers; ++layer) flops += family.attention_flops_per_token(a, layer, seq_len);
  // Each multi-token prediction depth runs the last block's attention once more.
  flops += static_cast<double>(a.mtp_layers) * family.attention_flops_per_token(a, a.n_layers - 1, seq_len);
  return flops;
}

double flops_per_token(const ModelArgs& a, int64_t seq_len) {
  const ParamCount c = count_params(a);
  // Each multi-token prediction depth projects through the output once more.
  const double mtp_heads = static_cast<double>(a.mtp_layers) * static_cast<double>(a.vocab_size * a.dim);
  return 6.0 * (static_cast<double>(c.active - c.embedding) + mtp_heads) + attention_flops_per_token(a, seq_len);
}

}  // namespace titan::model
