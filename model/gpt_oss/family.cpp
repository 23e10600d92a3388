// model/gpt_oss/family.cpp — gpt-oss as torchtitan 0.2.2 defines it (torchtitan/models/gpt_oss):
// every block an MoE layer of gpt-oss's experts (model/gpt_oss/experts.h; softmax top-4 routing
// with a gate bias, route-normalized, the weights applied after the experts, no shared expert),
// its attention (model/gpt_oss/attention.h: biases, sinks, YaRN, sliding windows on the even
// blocks), an untied output, and its init (every block weight, bias and sink
// trunc_normal(0, 0.02 / sqrt(2 (layer + 1))), the embedding normal(0, 1), the output
// trunc_normal(dim^-1/2, +-3 std), norms ones).
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/family.h"
#include "model/gpt_oss/args.h"
#include "model/gpt_oss/attention.h"
#include "model/gpt_oss/experts.h"
#include "model/gpt_oss/hf_format.h"
#include "model/grouped_query_attention.h"
#include "model/param_path.h"

namespace titan::model::gpt_oss {
namespace {

// GptOssModelArgs(dim, n_layers, moe_args, attn_mask_type), the rest at its defaults: vocab 201088,
// moe_inter_dim 2880, norm_eps 1e-5, swiglu_limit 7, head_dim 64, 64 heads, 8 kv heads, window 128,
// rope_theta 150000, YaRN (original_seq_len 4096, rope_factor 32, ntk_alpha 1, ntk_beta 32).
// MoEArgs as every flavor sets them: no shared expert, softmax, route_norm, route_scale 1, a gate
// bias, scores after the experts, top 4, load_balance_coeff 1e-3.
struct Shape {
  int64_t dim = 2880, n_layers = 24, experts = 32;
  int64_t n_heads = 64, n_kv_heads = 8, head_dim = 64, hidden = 2880, top_k = 4, window = 128;
};
ModelArgs gpt_oss(Shape s) {
  ModelArgs a;
  a.family = "gpt_oss";
  a.dim = s.dim;
  a.n_layers = s.n_layers;
  a.n_heads = s.n_heads;
  a.n_kv_heads = s.n_kv_heads;
  a.explicit_head_dim = s.head_dim;
  a.vocab_size = 201088;
  a.norm_eps = 1e-5;
  a.rope_theta = 150000.0;
  a.rope_scaling.enabled = false;  // YaRN instead (rope_frequencies)
  a.rope_rotate_half = true;
  a.max_seq_len = 131072;  // replaced by training.seq_len, as torchtitan's update_from_config
  a.depth_init = true;
  moe::MoEArgs m;
  m.num_experts = s.experts;
  m.num_shared_experts = 0;
  m.score_func = "softmax";
  m.route_norm = true;
  m.route_scale = 1.0;
  m.gate_bias = true;
  m.score_before_experts = false;
  m.top_k = s.top_k;
  m.load_balance_coeff = 1e-3;
  a.moe = m;
  a.moe_hidden_dim = s.hidden;
  auto extra = std::make_shared<GptOssArgs>();
  extra->sliding_window_size = s.window;
  a.family_args = std::move(extra);
  return a;
}

// torchtitan's gptoss_configs (torchtitan/models/gpt_oss/__init__.py).
const std::vector<NamedFlavor>& gpt_oss_flavor_table() {
  static const std::vector<NamedFlavor> table = {
      {"debugmodel", gpt_oss({256, 4, 8})},
      {"20b", gpt_oss({2880, 24, 32})},
      {"120b", gpt_oss({2880, 36, 128})},
      // Not a torchtitan flavor: every gpt-oss part at a size a 2-core CI machine steps through in
      // a fraction of a second, with a window shorter than its test rows (8 of 32 positions): 4
      // blocks of width 64, 4 heads of 16 (2 kv heads), 8 experts of hidden 32, top 2.
      {"debugmodel_small", gpt_oss({64, 4, 8, 4, 2, 16, 32, 2, 8})},
  };
  return table;
}

class GptOssFamily final : public Family {
 public:
  std::string name() const override { return "gpt_oss"; }
  const std::vector<NamedFlavor>& flavors() const override { return gpt_oss_flavor_table(); }

  std::unique_ptr<AttentionModule> make_attention(const std::string& prefix, const ModelArgs& args,
                                                  int64_t layer) const override {
    return std::make_unique<GptOssAttention>(prefix, args, layer);
  }
  std::unique_ptr<moe::RoutedExperts> make_experts(const std::string& prefix, const ModelArgs& args,
                                                   int64_t) const override {
    return std::make_unique<GptOssExperts>(prefix, args.moe->num_experts, args.dim, args.moe_hidden_dim,
                                           args.family_args_as<GptOssArgs>().swiglu_limit);
  }
  int64_t routed_expert_params(const ModelArgs& args) const override {
    return GptOssExperts::expert_param_count(args.dim, args.moe_hidden_dim);
  }
  // mlp1's biased output [2H] (the clamps keep views of it), the clamped gate, its sigmoid, their
  // product, the shifted linear half and the product with it (mlp2's input): 7 H a row.
  int64_t routed_expert_saved_per_row(const ModelArgs& args) const override { return 7 * args.moe_hidden_dim; }
  int64_t attention_params(const ModelArgs& args, int64_t) const override { return GptOssAttention::param_count(args); }
  // torchtitan's get_moe_model_nparams_and_flops with head_dims = 2 head_dim: the full square.
  double attention_flops_per_token(const ModelArgs& args, int64_t, int64_t seq_len) const override {
    return GroupedQueryAttention::score_flops_per_token(args, seq_len);
  }
  // What it keeps: grouped-query attention's (the sinks' rescale keeps nothing more per token).
  AttentionActivations attention_activations(const ModelArgs& args, int64_t,
                                             const AttentionActivationsQuery& where) const override {
    return GroupedQueryAttention::activations(args, where);
  }
  int64_t attention_window(const ModelArgs& args, int64_t layer) const override {
    return args.family_args_as<GptOssArgs>().window(layer);
  }
  // Whole heads per rank (the sinks with them), and whole gate/linear pairs of the experts' hidden dim.
  std::vector<ShardedSize> tp_sharded_sizes(const ModelArgs& args) const override {
    return {{"the number of attention heads n_heads", args.n_heads},
            {"the number of kv heads n_kv_heads", args.kv_heads()},
            {"the experts' hidden dim (moe_inter_dim)", args.moe_hidden_dim}};
  }
  InitSpec init_spec(const ModelArgs& args, const std::string& fqn) const override;
  std::vector<double> rope_frequencies(const ModelArgs& args) const override;
  HfFormat hugging_face(const ModelArgs& args) const override { return hugging_face_format(args); }
};

InitSpec GptOssFamily::init_spec(const ModelArgs& args, const std::string& fqn) const {
  const auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return fqn.size() >= s.size() && fqn.compare(fqn.size() - s.size(), s.size(), s) == 0;
  };
  InitSpec spec;
  if (fqn == "tok_embeddings.weight") return spec;  // normal_(0, 1)
  if (fqn == "output.weight") {
    spec.std = 1.0 / std::sqrt(static_cast<double>(args.dim));
    spec.lo = -3 * spec.std;
    spec.hi = 3 * spec.std;
    return spec;
  }
  if (ends_with("norm.weight")) {
    spec.ones = true;
    return spec;
  }
  const std::optional<LayerPath> block = parse_layer_path(fqn);
  TORCH_CHECK(block, "init: '", fqn, "' is neither a block's parameter (layers.<i>.<...>) nor one of the top level's");
  if (ends_with("router.gate.bias")) {
    // torchtitan's router init draws the gate's weight only; its bias keeps what the meta-device
    // model's to_empty left (uninitialized memory). titan starts it at zero: no expert preferred.
    spec.std = 0;
    return spec;
  }
  // TransformerBlock.weight_init_std for everything else of the block (trunc_normal_'s absolute
  // bounds +-2: no truncation at this std).
  spec.std = 0.02 / std::sqrt(2.0 * static_cast<double>(block->layer + 1));
  spec.lo = -2.0;
  spec.hi = 2.0;
  return spec;
}

// torchtitan's gpt-oss precompute_rope_cache: theta^(-2i / head_dim), and with rope_factor > 1
// YaRN's NTK-by-parts blend over the half head d = head_dim / 2:
//   low = d ln(original_seq_len / (ntk_beta 2 pi)) / ln theta, high = the same with ntk_alpha,
//   mask_i = 1 - clamp((i - low) / (high - low), 0, 1),
//   f_i <- f_i / rope_factor (1 - mask_i) + f_i mask_i
// (no flooring of the bounds, unlike DeepSeek-V3's YaRN). Its mscale scales the tables; titan
// puts its square in the softmax scale (GptOssAttention). torchtitan computes in float32; here in
// float64, rounded to float32 with the angles.
std::vector<double> GptOssFamily::rope_frequencies(const ModelArgs& args) const {
  const GptOssArgs& g = args.family_args_as<GptOssArgs>();
  const int64_t head_dim = args.head_dim(), half = head_dim / 2;
  if (head_dim % 2 != 0) throw std::invalid_argument("RoPE needs an even head_dim, got " + std::to_string(head_dim));
  std::vector<double> freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    freqs[static_cast<size_t>(i)] = 1.0 / std::pow(args.rope_theta, 2.0 * static_cast<double>(i) / head_dim);
  if (!(g.rope_factor > 1)) return freqs;
  const double d = static_cast<double>(half), log_base = std::log(args.rope_theta);
  const double orig = static_cast<double>(g.original_seq_len);
  const double low = d * std::log(orig / (g.ntk_beta * 2 * M_PI)) / log_base;
  const double high = d * std::log(orig / (g.ntk_alpha * 2 * M_PI)) / log_base;
  if (!(0 < low && low < high && high < d - 1))
    throw std::invalid_argument("gpt_oss YaRN: the correction range needs 0 < low < high < head_dim / 2 - 1, got low " +
                                std::to_string(low) + ", high " + std::to_string(high) + " for head_dim " +
                                std::to_string(head_dim) + " (original_seq_len, ntk_alpha, ntk_beta, rope_theta)");
  for (int64_t i = 0; i < half; ++i) {
    const double mask = 1 - std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    double& f = freqs[static_cast<size_t>(i)];
    f = f / g.rope_factor * (1 - mask) + f * mask;
  }
  return freqs;
}

}  // namespace

const Family& family() {
  static const GptOssFamily declaration;
  return declaration;
}

}  // namespace titan::model::gpt_oss
