// model/deepseek_v3/family.cpp — DeepSeek-V3 as torchtitan 0.2.2 defines it
// (torchtitan/models/deepseek_v3): multi-head latent attention in every block
// (latent_attention.h), n_dense_layers dense SwiGLU blocks first and MoE blocks after them
// (shared experts, the routing its flavors set), YaRN rotary frequencies over the rope part of
// a head, an untied output, torchtitan's decoder init, and a final norm built without eps (so
// its epsilon is the input dtype's: torch.finfo(dtype).eps).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/deepseek_v3/args.h"
#include "model/deepseek_v3/hf_format.h"
#include "model/deepseek_v3/latent_attention.h"
#include "model/family.h"

namespace titan::model::deepseek_v3 {
namespace {

struct Mla {
  int64_t q_lora_rank = 0, kv_lora_rank = 512, qk_nope = 128, qk_rope = 64, v = 128;
  double mscale = 1.0;
};

// DeepSeekV3ModelArgs(vocab_size, dim, inter_dim, moe_inter_dim, n_layers, n_dense_layers,
// n_heads, moe_args, the MLA sizes), its other fields at their defaults: norm_eps 1e-5,
// rope_theta 1e4, original_seq_len 4096, rope_factor 40, beta_fast 32, beta_slow 1.
ModelArgs deepseek(int64_t vocab, int64_t dim, int64_t inter_dim, int64_t moe_inter_dim, int64_t n_layers,
                   int64_t n_dense_layers, int64_t n_heads, moe::MoEArgs moe, Mla mla, bool block_causal = false) {
  ModelArgs a;
  a.vocab_size = vocab;
  a.dim = dim;
  a.explicit_hidden_dim = inter_dim;
  a.moe_hidden_dim = moe_inter_dim;
  a.n_layers = n_layers;
  a.n_heads = n_heads;
  a.norm_eps = 1e-5;
  a.rope_theta = 10000.0;
  a.rope_scaling.enabled = false;
  a.max_seq_len = 4096 * 4;  // replaced by training.seq_len, as torchtitan's update_from_config
  a.block_causal = block_causal;
  a.moe = moe;
  auto extra = std::make_shared<DeepSeekV3Args>();
  extra->n_dense_layers = n_dense_layers;
  extra->q_lora_rank = mla.q_lora_rank;
  extra->kv_lora_rank = mla.kv_lora_rank;
  extra->qk_nope_head_dim = mla.qk_nope;
  extra->qk_rope_head_dim = mla.qk_rope;
  extra->v_head_dim = mla.v;
  extra->mscale = mla.mscale;
  a.family_args = std::move(extra);
  return a;
}

moe::MoEArgs routing(int64_t experts, int64_t shared, int64_t top_k, const char* score_func, bool route_norm,
                     double route_scale = 1.0, std::optional<int64_t> groups = std::nullopt,
                     std::optional<int64_t> limited = std::nullopt) {
  moe::MoEArgs m;
  m.num_experts = experts;
  m.num_shared_experts = shared;
  m.top_k = top_k;
  m.score_func = score_func;
  m.route_norm = route_norm;
  m.route_scale = route_scale;
  m.num_expert_groups = groups;
  m.num_limited_groups = limited;
  m.score_before_experts = false;
  return m;
}

const std::vector<NamedFlavor>& deepseek_v3_flavor_table() {
  const moe::MoEArgs debug = routing(8, 2, 3, "softmax", false);
  const Mla debug_mla{0, 512, 128, 64, 128, 0.70};
  static const std::vector<NamedFlavor> table = {
      {"debugmodel", deepseek(2048, 256, 1024, 256, 6, 1, 16, debug, debug_mla)},
      {"debugmodel_flex_attn", deepseek(2048, 256, 1024, 256, 6, 1, 16, debug, debug_mla, /*block_causal=*/true)},
      {"16B", deepseek(102400, 2048, 10944, 1408, 27, 1, 16, routing(64, 2, 6, "softmax", false),
                       {0, 512, 128, 64, 128, 0.70}, true)},
      {"236B", deepseek(102400, 5120, 12288, 1536, 60, 1, 128, routing(160, 2, 6, "softmax", false, 16.0, 8, 3),
                        {1536, 512, 128, 64, 128, 1.0}, true)},
      {"671B", deepseek(129280, 7168, 18432, 2048, 61, 3, 128, routing(256, 1, 8, "sigmoid", true, 2.5, 8, 4),
                        {1536, 512, 128, 64, 128, 1.0}, true)},
      // Not a torchtitan flavor: the latent attention (q through its rank) and 671B's routing
      // (sigmoid, group-limited, normalized, scaled) at a size a 2-core CI machine steps through
      // in a fraction of a second: 4 blocks of width 128, the first dense, then 8 experts of
      // which each token takes 2 from 1 of 4 groups, a shared expert; qk heads 32 + 16, v heads 32.
      {"debugmodel_small", deepseek(2048, 128, 384, 64, 4, 1, 4, routing(8, 1, 2, "sigmoid", true, 2.5, 4, 2),
                                    {32, 64, 32, 16, 32, 0.70})},
  };
  return table;
}

class DeepSeekV3Family final : public Family {
 public:
  std::string name() const override { return "deepseek_v3"; }
  const std::vector<NamedFlavor>& flavors() const override { return deepseek_v3_flavor_table(); }

  FeedForwardKind feed_forward(const ModelArgs& args, int64_t layer) const override {
    return layer < args.family_args_as<DeepSeekV3Args>().n_dense_layers ? FeedForwardKind::kDense
                                                                        : FeedForwardKind::kMoE;
  }
  std::unique_ptr<AttentionModule> make_attention(const std::string& prefix, const ModelArgs& args,
                                                  int64_t) const override {
    return std::make_unique<LatentAttention>(prefix, args);
  }
  int64_t attention_params(const ModelArgs& args, int64_t) const override { return LatentAttention::param_count(args); }
  double attention_flops_per_token(const ModelArgs& args, int64_t, int64_t seq_len) const override {
    return LatentAttention::score_flops_per_token(args, seq_len);
  }
  AttentionActivations attention_activations(const ModelArgs& args, int64_t,
                                             const AttentionActivationsQuery& where) const override {
    return LatentAttention::activations(args, where);
  }
  // Whole heads per rank (wq / wq_b and wkv_b are column-sharded by head), and the dense blocks'
  // feed-forward hidden size.
  std::vector<ShardedSize> tp_sharded_sizes(const ModelArgs& args) const override {
    return {{"the number of attention heads n_heads", args.n_heads},
            {"the dense blocks' feed-forward hidden dim (inter_dim)", args.ffn_hidden_dim()}};
  }
  InitSpec init_spec(const ModelArgs& args, const std::string& fqn) const override {
    return decoder_init_spec(args, fqn);  // its Attention/TransformerBlock.init_weights: the same scheme
  }
  std::vector<double> rope_frequencies(const ModelArgs& args) const override;
  double final_norm_eps(const ModelArgs&) const override { return -1; }  // nn.RMSNorm(dim): no eps given
  HfFormat hugging_face(const ModelArgs& args) const override { return hugging_face_format(args); }
};

// torchtitan's precompute_freqs_cis (DeepSeek-V3's): theta^(-2i / d) over the rope part d of a
// head; under YaRN (max_seq_len > original_seq_len) the frequencies between the correction dims
// of beta_fast and beta_slow rotations blend into freq / rope_factor by a linear ramp:
//   dim(r) = d ln(original_seq_len / (2 pi r)) / (2 ln theta),
//   low = max(floor(dim(beta_fast)), 0), high = min(ceil(dim(beta_slow)), d - 1),
//   smooth_i = 1 - clamp((i - low) / (high - low), 0, 1)      (high == low: high + 0.001)
//   freq_i <- freq_i / factor (1 - smooth_i) + freq_i smooth_i
// torchtitan computes these in float32; here in float64 (the angles are rounded to float32 at
// the end), a difference of float32's rounding in each frequency.
std::vector<double> DeepSeekV3Family::rope_frequencies(const ModelArgs& args) const {
  const DeepSeekV3Args& m = args.family_args_as<DeepSeekV3Args>();
  const int64_t d = m.qk_rope_head_dim;
  const double base = args.rope_theta;
  std::vector<double> freqs(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i)
    freqs[static_cast<size_t>(i)] = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(d));
  if (!m.yarn(args.max_seq_len)) return freqs;
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(d) * std::log(static_cast<double>(m.original_seq_len) / (rotations * 2 * M_PI)) /
           (2 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(static_cast<double>(m.beta_fast))), 0.0);
  double high = std::min(std::ceil(correction_dim(static_cast<double>(m.beta_slow))), static_cast<double>(d - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < d / 2; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double smooth = 1 - ramp;
    double& f = freqs[static_cast<size_t>(i)];
    f = f / m.rope_factor * (1 - smooth) + f * smooth;
  }
  return freqs;
}

}  // namespace

const Family& family() {
  static const DeepSeekV3Family declaration;
  return declaration;
}

}  // namespace titan::model::deepseek_v3
